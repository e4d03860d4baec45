"""Documents for chat: extract text (with pages and headings), chunk it, index it in a per-collection
SQLite file (FTS5 for BM25 + stored embeddings for exact vector search), retrieve by reciprocal
rank fusion, and build the cited context block for a prompt. Plain Python, no Qt.

One concern per module: extract.py, chunk.py, collection.py (the SQLite file), index.py (bringing
a collection up to date with the disk), vectors.py (the cached embedding matrix), retrieve.py,
context.py, problems.py (typed problems), embedder.py (the protocol an embedding model meets).
"""
