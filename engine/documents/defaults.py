"""The retrieval defaults a chat starts with, in a module that imports nothing heavy: the app
reads them (app/chat_documents.py) while the window opens, before numpy is loaded, and
retrieve.py / context.py take them from here so there is one definition."""

from __future__ import annotations

DEFAULT_TOP_K = 8  # passages a question retrieves
DEFAULT_BUDGET_TOKENS = 1500  # tokens of the prompt the passages may take
