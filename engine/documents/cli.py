"""`python -m engine index` and `python -m engine ask`: the documents commands (engine/__main__.py
adds them to its parser and dispatches here)."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.documents.chunk import DEFAULT_OVERLAP_TOKENS
from engine.documents.collection import Collection
from engine.documents.context import DEFAULT_BUDGET_TOKENS, build_context, prompt_messages
from engine.documents.extract import DEFAULT_MAX_BYTES
from engine.documents.index import IndexProgress, IndexReport, index_paths
from engine.documents.record import sources_record
from engine.documents.retrieve import DEFAULT_TOP_K, RetrievalSettings, retrieve
from engine.errors import ConfigValidationError

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def add_index_arguments(p) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or folders to index")
    p.add_argument(
        "--collection", required=True, metavar="NAME", help="collection to build or update"
    )
    p.add_argument(
        "--embed-model",
        metavar="FILE",
        help="GGUF embedding model (default: the one the collection was built with, else "
        "all-MiniLM-L6-v2 from set-up)",
    )
    p.add_argument("--chunk-tokens", type=int, default=None, metavar="N",
                   help="tokens per chunk (default 200, at most the model's limit)")  # fmt: skip
    p.add_argument("--overlap", type=int, default=None, metavar="N",
                   help=f"tokens shared by neighbouring chunks (default {DEFAULT_OVERLAP_TOKENS})")  # fmt: skip
    p.add_argument("--max-mb", type=float, default=DEFAULT_MAX_BYTES / 2**20, metavar="MB",
                   help="skip files larger than this (default %(default).0f)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="threads for the embedding model")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def add_ask_arguments(p) -> None:
    p.add_argument("question", help="what to ask")
    p.add_argument("--collection", required=True, metavar="NAME")
    p.add_argument("--embed-model", metavar="FILE", help="default: the collection's own")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, metavar="N",
                   help=f"passages to retrieve (default {DEFAULT_TOP_K})")  # fmt: skip
    p.add_argument("--source-tokens", type=int, default=None, metavar="N",
                   help=f"prompt tokens for sources (default {DEFAULT_BUDGET_TOKENS}, at most "
                   "half the context)")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=None, help="answer length limit")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--system", default=None, help="a system prompt before the sources")


def load_embedder(path: str | None, collection: Collection | None, threads: int | None = None):
    """The embedding model: the one named, else the one the collection was built with, else the
    default from set-up (a clear ModelNotInstalledError with the command when it is missing)."""
    from engine.embedding import Embedder, default_embedding_model_path

    chosen = path or (collection.embed_model_path if collection is not None else None)
    if chosen is None:
        chosen = str(default_embedding_model_path())
    return Embedder.load(chosen, n_threads=threads)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    s = int(seconds + 0.5)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def progress_line(p: IndexProgress) -> str:
    name = Path(p.current).name if p.current else ""
    return (
        f"{p.files_done}/{p.files_total} files · {p.pages} pages · {p.chunks} chunks · "
        f"{p.chunks_per_s:.0f} chunks/s · {_duration(p.eta_s)} left  {name}"
    )


def report_json(report: IndexReport, collection: Collection) -> dict:
    return {
        "collection": collection.name,
        "path": str(collection.path),
        "embed_model": collection.embed_model_id,
        "added": report.added,
        "updated": report.updated,
        "unchanged": report.unchanged,
        "removed": report.removed,
        "problems": [
            {"file": p.path, "kind": p.kind, "message": p.message, "kept_previous": p.kept_previous}
            for p in report.problems
        ],
        "pages": report.pages,
        "chunks": report.chunks,
        "seconds": round(report.elapsed_s, 3),
        "pages_per_s": round(report.pages_per_s, 2),
        "chunks_per_s": round(report.chunks_per_s, 2),
        "cancelled": report.cancelled,
        "stopped": report.stopped,
        "total_chunks": collection.chunk_count(),
    }


def cmd_index(args) -> int:
    from engine.cancel import CancelToken

    if args.max_mb <= 0:
        raise ConfigValidationError("--max-mb", args.max_mb, "a positive size in MB")
    with Collection.open(args.collection) as collection:
        embedder = load_embedder(args.embed_model, collection, args.threads)
        model_path = str(Path(embedder.path).resolve()) if hasattr(embedder, "path") else None
        cancel = CancelToken()
        tty = sys.stderr.isatty()
        width = [0]

        def show(p: IndexProgress) -> None:
            line = progress_line(p)[:119]
            sys.stderr.write("\r" + line.ljust(width[0]))
            sys.stderr.flush()
            width[0] = len(line)

        previous = signal.signal(signal.SIGINT, lambda *_: cancel.cancel())
        try:
            report = index_paths(
                collection, args.paths, embedder, cancel=cancel, progress=show if tty else None,
                chunk_tokens=args.chunk_tokens, overlap_tokens=args.overlap,
                max_bytes=int(args.max_mb * 2**20), embed_model_path=model_path,
            )  # fmt: skip
        finally:
            signal.signal(signal.SIGINT, previous)
            if tty and width[0]:
                sys.stderr.write("\r" + " " * width[0] + "\r")
        if args.json:
            print(json.dumps(report_json(report, collection), ensure_ascii=False, indent=2))
        else:
            for problem in report.problems:
                print(f"{'note' if problem.kind == 'note' else 'skipped'}: {problem.message}",
                      file=sys.stderr)  # fmt: skip
            for path in report.removed:
                print(f"removed: {path} (gone from disk; its chunks were dropped)", file=sys.stderr)
            print(
                f"{collection.name}: {len(report.added)} added, {len(report.updated)} updated, "
                f"{len(report.unchanged)} unchanged, {len(report.removed)} removed, "
                f"{sum(p.kind not in ('note',) for p in report.problems)} skipped; "
                f"{report.pages} pages, {report.chunks} chunks in {report.elapsed_s:.1f} s "
                f"({report.pages_per_s:.1f} pages/s, {report.chunks_per_s:.1f} chunks/s); "
                f"{collection.chunk_count()} chunks in the collection ({collection.path})"
            )
    if report.cancelled:
        print("cancelled: files indexed before Ctrl-C are kept; run it again to finish",
              file=sys.stderr)  # fmt: skip
        return EXIT_INTERRUPTED
    if report.stopped:
        print(f"stopped: {report.stopped}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_ask(args, load_model: Callable[[Any], Any]) -> int:
    from engine.cancel import CancelToken
    from engine.events import Finished, TextDelta
    from engine.generate import GenerationRequest, generate

    if args.top_k < 1:
        raise ConfigValidationError("--top-k", args.top_k, "at least 1")
    with Collection.open(args.collection, create=False) as collection:
        embedder = load_embedder(args.embed_model, collection, args.threads)
        retrieval = retrieve(
            collection, embedder, args.question, RetrievalSettings(top_k=args.top_k)
        )
        lm = load_model(args)

        def count(text: str) -> int:
            return len(lm.tokenizer.encode(text, add_special=False))

        budget = args.source_tokens
        if budget is None:
            budget = min(DEFAULT_BUDGET_TOKENS, lm.n_ctx // 2)
        block = build_context(retrieval.results, count, budget)
        record = sources_record(collection, retrieval, block)
    request = GenerationRequest(messages=prompt_messages(args.question, block, args.system))
    overrides: dict[str, Any] = {}
    if args.max_tokens is not None:
        overrides["max_new_tokens"] = args.max_tokens
    if args.temperature is not None:
        overrides["temperature"] = args.temperature
        overrides["do_sample"] = args.temperature > 0
    if args.seed is not None:
        overrides["seed"] = args.seed
    request.overrides = overrides
    cancel = CancelToken()
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.cancel())
    done = None
    try:
        for event in generate(lm, request, cancel):
            if isinstance(event, TextDelta) and not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Finished):
                done = event
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done is not None  # generate() ends every accepted request with one Finished
    if args.json:
        out = {
            "answer": done.text,
            "finish_reason": str(done.finish_reason),
            "sources": record["sources"],
            "left_out": record["left_out"],
            "retrieval": {k: record[k] for k in ("collection", "embed_model", "settings",
                                                 "budget_tokens", "used_tokens")},
        }  # fmt: skip
        if done.error:
            out["error"] = done.error
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        sys.stdout.write("\n")
        if block.included:
            print("\nSources:")
            for s in block.included:
                print(f"  [{s.marker}] {s.item.chunk.place()}  (chunk {s.item.chunk.id}, "
                      f"score {s.item.score:.4f})")  # fmt: skip
        else:
            print("\n(no passage of the collection matched the question)")
        if block.left_out:
            print(f"Left out for lack of room ({block.used_tokens}/{block.budget_tokens} tokens):")
            for s in block.left_out:
                print(f"  {s.item.chunk.place()}  (chunk {s.item.chunk.id}, {s.tokens} tokens)")
    if done.finish_reason == "error":
        print(f"error: {done.error}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
