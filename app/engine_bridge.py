"""The only place the app calls the engine. Everything here runs on the worker thread except
`resolve_preset`, which is pure configuration logic (no model compute) and is cheap enough for the
GUI thread, so the preset panel can validate an edit immediately even while a reply streams. It
works from the plain ModelInfo that `describe` made on the worker thread: the loaded model object
belongs to the worker and the GUI thread never reads it.

Tests substitute a fake with the same methods (tests/app_fakes.py) that yields the real
engine event dataclasses.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from engine.cancel import CancelToken
from engine.events import Finished
from engine.types import GenerationRequest, ModelInfo, ReplayReport, ResolvedPreset


@dataclass(frozen=True)
class ContextTrimmed:
    """App-level stream event, first in a stream: older turns were left out to fit the context."""

    dropped_turns: int
    dropped_messages: int
    prompt_tokens: int
    context_limit: int

    @property
    def message(self) -> str:
        turns = "turn" if self.dropped_turns == 1 else "turns"
        return (
            f"The {self.dropped_turns} oldest {turns} of this chat were left out so the prompt "
            f"({self.prompt_tokens:,} tokens) and the reply fit the {self.context_limit:,}-token context."
        )


@dataclass(frozen=True)
class StreamNotice:
    """App-level stream event: something the user should know about this reply that is not part
    of it (e.g. a request field a remote server refused and that was left out)."""

    message: str


ProgressCallback = Callable[[str, float], None]


class EngineBridge(Protocol):
    def load(
        self, path: str, *, n_ctx: int | None, n_threads: int | None, progress: ProgressCallback
    ) -> object: ...

    def describe(self, lm: object) -> ModelInfo: ...

    def unload(self, lm: object) -> None: ...

    def resolve_preset(
        self, model: ModelInfo, saved: dict | None, overrides: dict | None
    ) -> ResolvedPreset: ...

    def generate(
        self, lm: object, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[object]: ...

    def replay(
        self, lm: object, receipt: dict, original_tokens: list, cancel: CancelToken
    ) -> ReplayReport: ...

    def start_serving(self, lm: object, port: int) -> ServingHandle: ...

    def stop_serving(self) -> None: ...


class ServingHandle(Protocol):
    """The running server as the GUI thread may see it: its URL and a status snapshot (plain
    numbers behind the scheduler's lock; no model state)."""

    url: str

    def status(self) -> object: ...


class RealEngine:
    """The engine packages, imported lazily so the window opens before numpy/llvmlite load.

    One prefix cache per loaded model: a chat resends the whole conversation every turn, and the
    cache makes a follow-up turn prefill only its new tokens (shown as "cached tokens").

    Serving ("Serve this model"): `start_serving` puts a BatchScheduler on the loaded model and an
    OpenAI-compatible server (engine.server.background) in front of it. From then on until the
    model is unloaded the chat's own requests go through that scheduler too, so HTTP clients and
    the chat are decoded together in one forward pass per step on the scheduler's thread, with
    one shared prefix cache, instead of two threads taking turns at the model."""

    PREFIX_CACHE_BYTES = 256 * 2**20
    SERVE_MAX_CONCURRENCY = 4

    def __init__(self, digest_cache: Path | None = None) -> None:
        self._prefix_cache = None
        self._digests = None
        self._digest_cache = digest_cache
        self._scheduler = None  # BatchScheduler of `_scheduler_lm`, once it has been served
        self._scheduler_lm = None
        self._server = None  # engine.server.background.BackgroundServer while serving

    def _model_digests(self):
        """sha256 of model files for receipts, cached on disk (engine/receipt.py)."""
        if self._digests is None:
            from engine.receipt import ModelDigests, default_digest_cache

            self._digests = ModelDigests(self._digest_cache or default_digest_cache())
        return self._digests

    def load(self, path, *, n_ctx, n_threads, progress):
        from engine.errors import ConfigValidationError
        from engine.loader import load_model, warm_up
        from engine.prefix_cache import PrefixCache

        try:
            lm = load_model(
                path, n_ctx=n_ctx or None, n_threads=n_threads or None, progress=progress
            )
        except ConfigValidationError as exc:
            if exc.field != "n_ctx":
                raise
            # The settings' context size is a wish shared by every model; a model trained on a
            # shorter context gets the engine's default window for it instead of a refusal.
            lm = load_model(path, n_ctx=None, n_threads=n_threads or None, progress=progress)
        self._prefix_cache = PrefixCache(self.PREFIX_CACHE_BYTES)  # entries of the old model go
        with contextlib.suppress(OSError):  # hashed in the background, for receipts
            self._model_digests().start(lm.path)
        warm_up(lm)
        return lm

    def unload(self, lm) -> None:
        """Stop the model's native kernel threads now, not at interpreter teardown (threads still
        inside JIT code while LLVM's memory is released at exit can crash the process). A server
        and scheduler on this model stop first (their requests end as cancelled)."""
        if self._scheduler_lm is lm:
            self.stop_serving()
            scheduler, self._scheduler, self._scheduler_lm = self._scheduler, None, None
            scheduler.close()
        lm.close()

    def start_serving(self, lm, port: int):
        """Serve `lm` on 127.0.0.1:port (0: any free port); -> the BackgroundServer (url,
        status()). Raises OSError when the port cannot be bound."""
        from engine.batching.scheduler import BatchScheduler
        from engine.server.background import BackgroundServer

        self.stop_serving()
        if self._scheduler_lm is not lm:
            self._scheduler = BatchScheduler(
                lm, max_concurrency=self.SERVE_MAX_CONCURRENCY, prefix_cache=self._prefix_cache
            )
            self._scheduler_lm = lm
        self._server = BackgroundServer(lm, self._scheduler, port=port)
        self._server.wait_ready()
        return self._server

    def stop_serving(self) -> None:
        """Stop the HTTP server (its requests end as cancelled); the chat keeps the scheduler."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def describe(self, lm) -> ModelInfo:
        from engine.presets import sampling_metadata

        template = lm.chat_template
        template_name = getattr(template, "name", "") or "chat template"
        if getattr(template, "is_fallback", False) and "fallback" not in template_name:
            template_name += " (fallback)"
        from engine.load_summary import load_line

        return ModelInfo(
            path=str(lm.path),
            name=Path(str(lm.path)).name,
            architecture=str(lm.gguf.arch),
            n_ctx=int(lm.n_ctx),
            template=template_name,
            sampling_metadata=sampling_metadata(lm.gguf.metadata),
            summary=load_line(lm),
            thinking_switch=bool(getattr(template, "accepts_enable_thinking", False)),
        )

    def resolve_preset(self, model: ModelInfo, saved, overrides) -> ResolvedPreset:
        from engine.presets import resolve_preset

        # The window always chats: the chat defaults layer applies (engine/presets.py).
        return resolve_preset(model, saved=saved or None, overrides=overrides or None, chat=True)

    def generate(self, lm, request: GenerationRequest, cancel):
        """Resolve the preset once, fit the chat into the context (the oldest turns go first), and
        start the engine's generation; a ContextTrimmed leads the stream when turns were left out."""
        from engine.context_fit import fit_chat
        from engine.generate import generate
        from engine.presets import resolve_preset

        preset = resolve_preset(
            lm,
            saved=request.saved_preset,
            overrides=request.overrides,
            chat=request.messages is not None,
        )
        fit = fit_chat(
            lm,
            [dict(m) for m in request.messages],
            preset.values["max_new_tokens"],
            request.enable_thinking,
        )
        trimmed = None
        if fit is not None and fit.dropped:
            request = replace(request, messages=fit.messages)
            trimmed = ContextTrimmed(
                fit.dropped_turns, len(fit.dropped), fit.prompt_tokens, fit.context_limit
            )
        request = replace(request, prefix_cache=self._prefix_cache)
        if self._scheduler is not None and self._scheduler_lm is lm:
            events = self._scheduler.submit(request, cancel, preset=preset).events()
        else:
            events = generate(lm, request, cancel, preset=preset)
        events = self._with_receipt(lm, request, events)
        return itertools.chain([trimmed], events) if trimmed is not None else events

    def _with_receipt(self, lm, request: GenerationRequest, events) -> Iterator[object]:
        """The events, with the receipt (engine/receipt.py) attached to the Finished event."""
        from engine.receipt import build_receipt

        for event in events:
            if isinstance(event, Finished) and event.error is None:
                event = replace(event, receipt=build_receipt(lm, request, event, self._digest(lm)))
            yield event

    def _digest(self, lm) -> str | None:
        """The model file's sha256; None when it cannot be read now (moved or deleted after the
        load): the receipt says so instead of the reply being lost."""
        try:
            return self._model_digests().digest(lm.path)
        except (OSError, TypeError):
            return None

    def replay(self, lm, receipt: dict, original_tokens: list, cancel) -> ReplayReport:
        """Run a reply again from its receipt and compare (worker thread)."""
        from engine.receipt import replay

        return replay(lm, receipt, original_tokens, self._digest(lm), cancel)
