"""load_model: one GGUF path -> everything generation needs (config, weights, kernels, tokenizer,
chat template), with progress reported for the app's loading screen."""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import ModelConfig
from engine.errors import ConfigValidationError
from engine.gguf import GGUFFile, open_gguf
from engine.kv_cache import check_cache_type
from engine.models import build_model
from engine.types import DEFAULT_KV_CACHE_TYPE
from engine.weight_prefetch import start_prefetch

if TYPE_CHECKING:
    from engine.chat_template import ChatTemplate
    from engine.kernels.backend import Backend
    from engine.kernels.record_cache import RecordCacheUse
    from engine.models.transformer import TransformerModel
    from engine.tokenizer import Tokenizer

DEFAULT_MAX_CONTEXT = 4096  # default window: bounded so the KV cache stays small on a desktop

Progress = Callable[[str, float], None]


@dataclass
class LoadedModel:
    path: Path
    gguf: GGUFFile
    config: ModelConfig
    model: TransformerModel
    n_ctx: int
    backend: Backend
    # the thread mapping the weight pages in (engine/weight_prefetch.py); it ends by itself
    prefetch: threading.Thread | None = None
    # where the repacked weight records come from (engine/kernels/record_cache.py)
    records: RecordCacheUse | None = None

    @property
    def name(self) -> str:
        return str(self.gguf.metadata.get("general.name") or self.path.stem)

    def close(self) -> None:
        """Stop the backend's worker threads (when it has any). The app calls this when it
        switches models; the memory map closes when the last reference goes. Waits for a
        forward chunk another thread is running (the pool must not stop under it)."""
        if self.records is not None:
            self.records.close()
        close = getattr(self.backend, "close", None)
        if close is None:
            return
        lock = getattr(self.model, "forward_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            close()

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """engine.tokenizer.Tokenizer built from the file's vocabulary (load_model builds it, so a
        bad vocabulary fails the load, not the first request)."""
        from engine.tokenizer import Tokenizer

        return Tokenizer.from_gguf(self.gguf)

    @cached_property
    def chat_template(self) -> ChatTemplate:
        """engine.chat_template.ChatTemplate for the file's template (or the fallback)."""
        from engine.chat_template import ChatTemplate

        return ChatTemplate.from_gguf(self.gguf, self.tokenizer)


def load_model(
    path,
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    progress: Progress | None = None,
    cache_type: str = DEFAULT_KV_CACHE_TYPE,
) -> LoadedModel:
    """Open, validate and prepare a model. Raises ModelFileError / UnsupportedModelError /
    TokenizerError / ConfigValidationError (n_ctx, n_threads, cache_type) before any large
    allocation. cache_type (a KV_CACHE_TYPES member) is how every KV cache of the model
    stores keys and values: "f16", or "q8_0" at 0.53x the memory."""
    report = progress or (lambda stage, fraction: None)
    path = Path(path)
    from engine.kernels.threads import MAX_THREADS

    if n_threads is not None and (
        isinstance(n_threads, bool)
        or not isinstance(n_threads, int)
        or not 1 <= n_threads <= MAX_THREADS
    ):
        raise ConfigValidationError("n_threads", n_threads, f"an integer from 1 to {MAX_THREADS}")

    report("reading model file", 0.0)
    gguf_file = open_gguf(path)
    config = ModelConfig.from_gguf(gguf_file)
    n_ctx = _resolve_n_ctx(n_ctx, config)
    kv_type = check_cache_type(cache_type, config.head_dim)

    report("compiling kernels", 0.2)
    from engine.kernels.backend import get_backend

    def kernel_progress(stage: str, fraction: float) -> None:
        report(stage, 0.2 + 0.7 * max(0.0, min(1.0, fraction)))

    # The tokenizer builds on a thread beside the kernel library (loading the cached kernel
    # objects spends its time in C with the GIL released). Building it now (not on first use)
    # makes a broken vocabulary fail the load, not the first request; result() re-raises its
    # TokenizerError here. The weight prefetch starts once both are done (see _start_prefetch).
    with ThreadPoolExecutor(1, thread_name_prefix="localchat-tokenizer") as pool:
        tokenizer = pool.submit(_build_tokenizer, gguf_file)
        backend = get_backend(n_threads=n_threads, progress=kernel_progress)
        prefetch = _start_prefetch(tokenizer, gguf_file, backend)
        report("preparing weights", 0.9)
        model = build_model(gguf_file, config, backend)
        model.cache_type = kv_type
        records = _attach_records(gguf_file, model, backend)
        report("tokenizer", 0.95)
        loaded = LoadedModel(
            path=path,
            gguf=gguf_file,
            config=config,
            model=model,
            n_ctx=n_ctx,
            backend=backend,
            records=records,
        )
        loaded.__dict__["tokenizer"] = tokenizer.result()  # the cached_property's slot
    loaded.prefetch = prefetch.result()
    _ = loaded.chat_template  # a broken template fails the load too
    _return_freed_heap()
    report("ready", 1.0)
    return loaded


def _attach_records(gguf_file: GGUFFile, model: TransformerModel, backend: Backend):
    """Map the weights the backend repacks from the record cache, or have them written there
    as they are repacked (engine/kernels/record_cache.py)."""
    from engine.kernels import record_cache

    weights = [w for w in model.matrices() if backend.copies_weight(w)]
    return record_cache.attach(gguf_file, weights)


def _build_tokenizer(gguf_file: GGUFFile) -> Tokenizer:
    from engine.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf_file)


def _start_prefetch(
    tokenizer: Future[Tokenizer], gguf_file: GGUFFile, backend: Backend
) -> Future[threading.Thread | None]:
    """The thread mapping the weight pages in (engine/weight_prefetch.py) instead of the first
    forward pass faulting them in one by one (measured on the 7B: first one-token forward
    1.0-1.25 s instead of 1.45 s), started when the tokenizer is built (by the tokenizer's
    thread, or here if it already is): its ~35 MB of temporaries (merge pairs, the Rust side's
    copies) are freed by then, so they never stack on top of the mapped weights in the peak RSS.
    The weights the backend repacks are left out (Backend.copies_weight). None if the tokenizer
    failed: the load fails with its error."""
    started: Future[threading.Thread | None] = Future()

    def start(done: Future[Tokenizer]) -> None:
        if done.exception() is not None:
            started.set_result(None)
            return
        try:
            started.set_result(start_prefetch(gguf_file.tensors, backend.copies_weight))
        except BaseException as exc:  # a thread that cannot start fails the load, not silently
            started.set_exception(exc)

    tokenizer.add_done_callback(start)
    return started


def _return_freed_heap() -> None:
    """Give the heap the load freed back to the OS (glibc keeps it, in every thread's arena):
    the tokenizer's build temporaries and the kernel library's. Measured on the 1.5B: RssAnon
    131 -> 116 MB after the load. A no-op where there is no glibc malloc_trim."""
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # musl and other C libraries have none
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


# Prompt tokens the warm-up reads in one multi-token forward (the prefill path). More tokens cost
# load time on a large model (~0.1 s each on a 7B) for no further warming: the multi-token
# kernels' first run is what is cold, not its size. No token is decoded after them: a second
# token costs a whole output projection (gemma-3's 262k-row one: ~0.2 s CPU at load).
WARM_UP_PROMPT_TOKENS = 8


def warm_up(lm: LoadedModel) -> None:
    """Read a short prompt and sample one token, so the first real request does not pay the
    one-off work: importing the generation modules and building every weight's kernel argument
    block (measured: ~30 ms planning + ~110 ms first forward cold, vs ~2 ms + ~25 ms warm), and
    the first run of the multi-token (prefill) path, which a one-token prompt never reached
    (at 4db2fc1 gemma-3-270m's first 256-token chunk after a load ran cold and the prefill's time
    left after it was +89%; at 2a2d7ed, on a machine at load 7-10, the first chunk's extra cost
    was within the noise with or without this, and the warm-up's own time too: bench/RESULTS.md,
    "Prefill time left"). In the app that work holds the GIL on the worker
    thread and stalls the GUI; done here it happens during the load, not after the user pressed
    Send. Numerics are untouched: a throwaway KV cache, no prefix cache. A preset problem (e.g.
    an unreadable generation_config.json) is left for the first real request to report with its
    full message."""
    from engine.errors import EngineError
    from engine.generate import generate
    from engine.types import GenerationRequest

    bos = getattr(lm.tokenizer, "bos_id", None)
    # Room for the prompt and the sampled token in any context (a tiny test context too).
    n_prompt = max(1, min(WARM_UP_PROMPT_TOKENS, lm.n_ctx - 2))
    request = GenerationRequest(
        prompt_ids=[0 if bos is None else int(bos)] * n_prompt,
        overrides={"max_new_tokens": 1, "do_sample": False},
        top_logprobs=5,
    )
    try:
        for _ in generate(lm, request):
            pass
    except EngineError:
        pass


def _resolve_n_ctx(n_ctx: int | None, config: ModelConfig) -> int:
    if n_ctx is None:
        return min(config.context_length, DEFAULT_MAX_CONTEXT)
    if (
        isinstance(n_ctx, bool)
        or not isinstance(n_ctx, int)
        or not 1 <= n_ctx <= config.context_length
    ):
        raise ConfigValidationError(
            "n_ctx",
            n_ctx,
            f"an integer from 1 to {config.context_length} (the model's training context)",
        )
    return n_ctx
