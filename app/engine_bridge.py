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

    def compare(
        self,
        lm: object,
        requests: list[GenerationRequest],
        cancels: list[CancelToken],
        models: list | None = None,
    ) -> list: ...

    def load_side(self, path: str) -> object: ...

    def unload_side(self, lm: object) -> None: ...

    def tokenizer_key(self, lm: object) -> str: ...

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
    SIDE_PREFIX_CACHE_BYTES = 64 * 2**20  # a compare column's second model: one prompt or two
    SERVE_MAX_CONCURRENCY = 4

    def __init__(self, digest_cache: Path | None = None) -> None:
        self._prefix_cache = None
        self._digests = None
        self._digest_cache = digest_cache
        # BatchScheduler of `_scheduler_lm`, once it has been served or compared on
        self._scheduler = None
        self._scheduler_lm = None
        self._server = None  # engine.server.background.BackgroundServer while serving
        self._side: dict[int, tuple] = {}  # id(lm) -> (lm, BatchScheduler): compare's models

    def _model_digests(self):
        """sha256 of model files for receipts, cached on disk (engine/receipt.py)."""
        if self._digests is None:
            from engine.receipt import ModelDigests, default_digest_cache

            self._digests = ModelDigests(self._digest_cache or default_digest_cache())
        return self._digests

    def load(self, path, *, n_ctx, n_threads, progress, cache_type="f16"):
        from engine.errors import ConfigValidationError
        from engine.loader import load_model, warm_up
        from engine.prefix_cache import PrefixCache

        try:
            lm = load_model(
                path,
                n_ctx=n_ctx or None,
                n_threads=n_threads or None,
                progress=progress,
                cache_type=cache_type,
            )
        except ConfigValidationError as exc:
            if exc.field != "n_ctx":
                raise
            # The settings' context size is a wish shared by every model; a model trained on a
            # shorter context gets the engine's default window for it instead of a refusal.
            lm = load_model(
                path,
                n_ctx=None,
                n_threads=n_threads or None,
                progress=progress,
                cache_type=cache_type,
            )
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
        from engine.server.background import BackgroundServer

        self.stop_serving()
        self._server = BackgroundServer(lm, self._scheduler_of(lm), port=port)
        self._server.wait_ready()
        return self._server

    def _scheduler_of(self, lm):
        """The BatchScheduler on `lm`, made on first use (serving or a compare); until the model
        is unloaded every request on it, the chat's too, goes through it."""
        from engine.batching.scheduler import BatchScheduler

        if self._scheduler_lm is not lm:
            self._scheduler = BatchScheduler(
                lm, max_concurrency=self.SERVE_MAX_CONCURRENCY, prefix_cache=self._prefix_cache
            )
            self._scheduler_lm = lm
        return self._scheduler

    def stop_serving(self) -> None:
        """Stop the HTTP server (its requests end as cancelled); the chat keeps the scheduler."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def describe(self, lm) -> ModelInfo:
        from engine.model_summary import is_base_model
        from engine.presets import sampling_metadata

        template = lm.chat_template
        template_name = getattr(template, "name", "") or "chat template"
        if getattr(template, "is_fallback", False) and "fallback" not in template_name:
            template_name += " (fallback)"
        from engine.kv_cache import kv_cache_type
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
            kv_cache_type=str(kv_cache_type(getattr(lm, "model", None))),
            base_model=is_base_model(lm.gguf.metadata),
        )

    def resolve_preset(self, model: ModelInfo, saved, overrides) -> ResolvedPreset:
        from engine.presets import resolve_preset

        # The window always chats: the chat defaults layer applies (engine/presets.py).
        return resolve_preset(model, saved=saved or None, overrides=overrides or None, chat=True)

    def generate(self, lm, request: GenerationRequest, cancel):
        """Resolve the preset once, fit the chat into the context (the oldest turns go first), and
        start the engine's generation; a ContextTrimmed leads the stream when turns were left out."""
        from engine.generate import generate

        request, preset, trimmed = self._prepare(lm, request)
        if self._scheduler is not None and self._scheduler_lm is lm:
            events = self._scheduler.submit(request, cancel, preset=preset).events()
        else:
            events = generate(lm, request, cancel, preset=preset)
        events = self._with_receipt(lm, request, events)
        return itertools.chain([trimmed], events) if trimmed is not None else events

    def compare(
        self,
        lm,
        requests: list[GenerationRequest],
        cancels: list[CancelToken],
        models: list | None = None,
    ) -> list:
        """Start several requests at once (the compare view's columns): request i runs on
        models[i] (a `load_side` model) or, when that is None, on `lm`. The requests of one
        model all go through its BatchScheduler, so they are decoded together in one forward
        pass per step and share its prefix cache; two models' schedulers run side by side.
        -> one item per request: its event iterator (as `generate`), or the exception that
        refused it (an invalid preset value, too long for the KV budget), so one refused column
        does not stop the others."""
        streams: list = []
        models = models or [None] * len(requests)
        for request, cancel, side in zip(requests, cancels, models, strict=True):
            target = side if side is not None else lm
            try:
                if side is None:
                    scheduler, cache = self._scheduler_of(lm), self._prefix_cache
                else:
                    scheduler = self._side[id(side)][1]
                    cache = scheduler.prefix_cache
                prepared, preset, trimmed = self._prepare(target, request, cache)
                ticket = scheduler.submit(prepared, cancel, preset=preset)
            except Exception as exc:  # typed engine errors; the column shows the message
                streams.append(exc)
                continue
            events = self._with_receipt(target, prepared, ticket.events())
            streams.append(itertools.chain([trimmed], events) if trimmed is not None else events)
        return streams

    def load_side(self, path: str):
        """A second model file for compare columns (worker thread), beside the chat's model: its
        own BatchScheduler and prefix cache, so the chat's cache never sees its entries. The
        chat's model, its cache and its scheduler stay as they are."""
        from engine.batching.scheduler import BatchScheduler
        from engine.loader import load_model, warm_up
        from engine.prefix_cache import PrefixCache

        lm = load_model(path, n_ctx=None, n_threads=None)
        try:
            with contextlib.suppress(OSError):
                self._model_digests().start(lm.path)
            warm_up(lm)
            scheduler = BatchScheduler(
                lm,
                max_concurrency=self.SERVE_MAX_CONCURRENCY,
                prefix_cache=PrefixCache(self.SIDE_PREFIX_CACHE_BYTES),
            )
        except BaseException:
            lm.close()
            raise
        self._side[id(lm)] = (lm, scheduler)
        return lm

    def unload_side(self, lm) -> None:
        entry = self._side.pop(id(lm), None)
        if entry is not None:
            entry[1].close()
        lm.close()

    def tokenizer_key(self, lm) -> str:
        """A fingerprint of the model's vocabulary (tokenizer model, pre-tokenizer, tokens): two
        models with the same key number text the same way, so their token ids compare."""
        import hashlib

        tok = lm.tokenizer
        digest = hashlib.sha256(f"{tok.model}\0{tok.pre}\0".encode())
        for token in tok.tokens:
            digest.update(str(token).encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()

    def _prepare(self, lm, request: GenerationRequest, prefix_cache=None):
        """-> (request fitted to the context with the prefix cache (the chat model's unless
        another is given), its ResolvedPreset, a ContextTrimmed or None)."""
        from engine.context_fit import fit_chat
        from engine.presets import resolve_preset

        preset = resolve_preset(
            lm,
            saved=request.saved_preset,
            overrides=request.overrides,
            chat=request.messages is not None,
        )
        # a plain completion (request.prompt: a base model continuing the typed text) is one
        # piece of text with no turns to leave out; generate names it if it does not fit
        fit = (
            fit_chat(
                lm,
                [dict(m) for m in request.messages],
                preset.values["max_new_tokens"],
                request.enable_thinking,
            )
            if request.messages is not None
            else None
        )
        trimmed = None
        if fit is not None and fit.dropped:
            request = replace(request, messages=fit.messages)
            trimmed = ContextTrimmed(
                fit.dropped_turns, len(fit.dropped), fit.prompt_tokens, fit.context_limit
            )
        cache = prefix_cache if prefix_cache is not None else self._prefix_cache
        return replace(request, prefix_cache=cache), preset, trimmed

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
        from engine.loader import load_model
        from engine.receipt import model_file_note, replay

        loaded = self._digest(lm)
        run = None
        if self._scheduler is not None and self._scheduler_lm is lm:
            # served (or compared on): its scheduler's thread runs every forward pass on lm
            scheduler = self._scheduler

            def run(request, cancel):
                return scheduler.submit(request, cancel).events()

        wanted = (receipt.get("model") or {}).get("sha256")
        if not isinstance(wanted, str) or wanted == loaded:
            return replay(lm, receipt, original_tokens, loaded, cancel, run)
        # Not the loaded model's file (a reply from another machine, or made with another model):
        # a file here with the receipt's sha256 replays it exactly, loaded for this replay only;
        # without one the replay runs on the loaded model and says the receipt's file is not here.
        known = self._model_digests().path_for(wanted)
        if known is None:
            report = replay(lm, receipt, original_tokens, loaded, cancel, run)
        else:
            with load_model(known, n_ctx=None, n_threads=None) as other:
                report = replay(other, receipt, original_tokens, wanted, cancel)
        return replace(report, differences=(model_file_note(receipt, known), *report.differences))
