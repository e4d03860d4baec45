"""The only place the app calls the engine (and fits long chats into the context on the way). Everything here runs on the worker thread except
`resolve_preset`, which is pure configuration logic (no model compute) and is cheap enough for the
GUI thread, so the preset panel can validate an edit immediately even while a reply streams.

Tests substitute a fake with the same methods (tests/app_fakes.py) that yields the real
engine event dataclasses.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engine.cancel import CancelToken

JSON_MODES = ("off", "object", "schema")


@dataclass(frozen=True)
class ChatRequest:
    """What the window asks for; the bridge turns it into the engine's GenerationRequest."""

    messages: tuple[dict, ...]  # {"role": ..., "content": ...}, system prompt first if any
    overrides: dict = field(default_factory=dict)
    saved_preset: dict | None = None
    json_mode: str = "off"
    json_schema: dict | None = None
    top_logprobs: int = 5


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    architecture: str
    n_ctx: int
    template: str  # chat template name, "(fallback)" appended when the model has none
    summary: str = ""  # one line: name, architecture, quant, kernel path (printed on stderr)


@dataclass(frozen=True)
class PresetView:
    values: dict
    sources: dict  # field -> "override" / "saved preset" / "generation_config.json" / ...


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


ProgressCallback = Callable[[str, float], None]
# Room kept for the reply when fitting a chat whose preset says "until the context is full".
DEFAULT_REPLY_RESERVE = 512


class EngineBridge(Protocol):
    def load(
        self, path: str, *, n_ctx: int | None, n_threads: int | None, progress: ProgressCallback
    ) -> object: ...

    def describe(self, lm: object) -> ModelInfo: ...

    def unload(self, lm: object) -> None: ...

    def resolve_preset(
        self, lm: object, saved: dict | None, overrides: dict | None
    ) -> PresetView: ...

    def generate(
        self, lm: object, request: ChatRequest, cancel: CancelToken
    ) -> Iterator[object]: ...


class RealEngine:
    """The engine packages, imported lazily so the window opens before numpy/llvmlite load.

    One prefix cache per loaded model: a chat resends the whole conversation every turn, and the
    cache makes a follow-up turn prefill only its new tokens (shown as "cached tokens")."""

    PREFIX_CACHE_BYTES = 256 * 2**20

    def __init__(self) -> None:
        self._prefix_cache = None

    def load(self, path, *, n_ctx, n_threads, progress):
        from engine.errors import ConfigValidationError
        from engine.loader import load_model
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
        self._warm_up(lm)
        return lm

    @staticmethod
    def _warm_up(lm) -> None:
        """Generate one token from a one-token prompt, so the first request does not pay the
        one-off Python work: importing the generation modules and building every weight's
        kernel argument block (measured: ~30 ms planning + ~110 ms first forward cold, vs
        ~2 ms + ~25 ms warm). That work holds the GIL, and while the worker holds it every
        GIL acquisition on the GUI thread waits; here it happens during the load, not after
        the user pressed Send. Numerics are untouched: a throwaway KV cache, no prefix cache.
        A preset problem is reported by the first real request, with its full message."""
        from engine.errors import EngineError
        from engine.generate import GenerationRequest, generate

        bos = getattr(lm.tokenizer, "bos_id", None)
        request = GenerationRequest(
            prompt_ids=[0 if bos is None else int(bos)],
            overrides={"max_new_tokens": 1},
            top_logprobs=5,
        )
        try:
            for _ in generate(lm, request):
                pass
        except EngineError:
            pass

    def unload(self, lm) -> None:
        """Stop the model's native kernel threads now, not at interpreter teardown (threads still
        inside JIT code while LLVM's memory is released at exit can crash the process)."""
        lm.close()

    def describe(self, lm) -> ModelInfo:
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
            summary=load_line(lm),
        )

    def resolve_preset(self, lm, saved, overrides) -> PresetView:
        from engine.presets import resolve_preset

        resolved = resolve_preset(lm, saved=saved or None, overrides=overrides or None)
        return PresetView(values=dict(resolved.values), sources=dict(resolved.sources))

    def generate(self, lm, request: ChatRequest, cancel):
        from engine.generate import GenerationRequest, generate

        messages, trimmed = self._fit(lm, request)
        engine_request = GenerationRequest(
            messages=messages,
            overrides=dict(request.overrides),
            saved_preset=request.saved_preset or None,
            json_mode=request.json_mode,
            json_schema=request.json_schema,
            top_logprobs=request.top_logprobs,
            prefix_cache=self._prefix_cache,
        )
        events = generate(lm, engine_request, cancel)
        return itertools.chain([trimmed], events) if trimmed is not None else events

    def _fit(self, lm, request: ChatRequest) -> tuple[list[dict], ContextTrimmed | None]:
        """Drop the oldest turns (never the system prompt or the last message) when the chat
        plus the reply's room no longer fits the context. Raises ContextOverflowError when even
        the last message does not fit."""
        from engine.context_fit import fit_conversation
        from engine.errors import EngineError
        from engine.presets import resolve_preset

        messages = [dict(m) for m in request.messages]
        try:
            preset = resolve_preset(
                lm, saved=request.saved_preset or None, overrides=dict(request.overrides) or None
            )
        except EngineError:
            return messages, None  # generate() raises the same error with its full message
        reserve = preset.values.get("max_new_tokens")
        if reserve is None:
            reserve = min(DEFAULT_REPLY_RESERVE, lm.n_ctx // 4)
        if reserve >= lm.n_ctx:
            return messages, None  # generate() refuses this with ContextOverflowError
        fit = fit_conversation(lm, messages, reserve_tokens=int(reserve), policy="drop_oldest")
        if not fit.dropped:
            return messages, None
        return fit.messages, ContextTrimmed(
            fit.dropped_turns, len(fit.dropped), fit.prompt_tokens, fit.context_limit
        )
