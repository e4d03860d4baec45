"""A scripted engine for the app's widget tests: same four methods as app.engine_bridge.RealEngine,
yields the real engine event dataclasses, validates presets with the engine's typed error.

Scripts: `FakeEngine(replies=[...])` answers each request with the next reply (split into word
tokens). `gate` (a threading.Event) pauses the stream after `pause_after` tokens so a test can
cancel mid-stream deterministically.
"""

from __future__ import annotations

import os

# Every test module with widgets imports this file before a QApplication exists: without a
# display, Qt must not try xcb (tools/run_tests.sh exports the same).
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import re
import threading
import time
from dataclasses import dataclass, field

from engine.errors import ConfigValidationError, ModelFileError
from engine.events import (
    FINISH_CANCELLED,
    FINISH_GRAMMAR_COMPLETE,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Finished,
    ReasoningDelta,
    TextDelta,
    TokenSampled,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
    TopAlternative,
    Usage,
)
from engine.types import GenerationRequest, JsonMode, ModelInfo, ResolvedPreset, ToolCall


@dataclass(frozen=True)
class ToolCallReply:
    """A scripted reply that ends on tool calls: `calls` are (name, arguments) pairs, emitted as
    the engine does (Started, argument deltas, Finished) after `text`; `malformed` are
    (name, problem) pairs emitted as ToolCallMalformed."""

    calls: tuple = ()
    text: str = ""
    malformed: tuple = ()


# How long a test waits for a signal or condition before failing: generous, because the first
# kernel compile on a cold JIT cache or a busy shared machine can take far longer than usual.
# The waits return as soon as the signal arrives, so a long deadline costs nothing when green.
WAIT_MS = 60_000

CHECKPOINT_PRESET = {
    "temperature": 0.2,
    "top_p": 0.9,
    "top_k": 50,
    "max_new_tokens": 256,
    "do_sample": True,
}
CHECKPOINT_SOURCES = {
    "temperature": "generation_config.json",
    "top_p": "generation_config.json",
    "top_k": "default",
    "max_new_tokens": "default",
    "do_sample": "gguf metadata",
}


@dataclass
class FakeModel:
    path: str
    n_ctx: int


@dataclass
class FakeEngine:
    replies: list[str] = field(default_factory=lambda: ["Hello! How can I help?"])
    reasoning: str = ""
    token_delay_s: float = 0.0
    pause_after: int | None = None
    gate: threading.Event = field(default_factory=threading.Event)
    requests: list[GenerationRequest] = field(default_factory=list)
    load_stages: tuple = (("reading model", 0.3), ("compiling kernels", 0.8), ("ready", 1.0))
    fail_generate_with: Exception | None = None
    unloaded: list[str] = field(default_factory=list)
    trimmed: object = None  # an app.engine_bridge.ContextTrimmed to yield first
    loads: list[tuple] = field(default_factory=list)  # (path, n_ctx, n_threads, cache_type)

    def load(self, path, *, n_ctx, n_threads, progress, cache_type="f16"):
        self.loads.append((str(path), n_ctx, n_threads, cache_type))
        if str(path).endswith(".bad"):
            raise ModelFileError(f"{path} is not a GGUF file (magic b'NOPE', expected b'GGUF')")
        for stage, fraction in self.load_stages:
            progress(stage, fraction)
        return FakeModel(str(path), n_ctx or 2048)

    def unload(self, lm):
        self.unloaded.append(lm.path)

    def describe(self, lm):
        return ModelInfo(
            path=lm.path,
            name=lm.path.rsplit("/", 1)[-1],
            architecture="llama",
            n_ctx=lm.n_ctx,
            template="chatml",
        )

    def resolve_preset(self, model, saved, overrides):
        values, sources = dict(CHECKPOINT_PRESET), dict(CHECKPOINT_SOURCES)
        for origin, layer in (("saved preset", saved or {}), ("override", overrides or {})):
            for key, value in layer.items():
                if key not in values:
                    raise ConfigValidationError(key, value, f"one of {sorted(values)}")
                values[key], sources[key] = value, origin
        if (
            not isinstance(values["temperature"], (int, float))
            or not 0 <= values["temperature"] <= 100
        ):
            raise ConfigValidationError(
                "temperature", values["temperature"], "a number in [0, 100]"
            )
        if not isinstance(values["top_p"], (int, float)) or not 0 < values["top_p"] <= 1:
            raise ConfigValidationError("top_p", values["top_p"], "a number in (0, 1]")
        return ResolvedPreset(values, sources)

    def generate(self, lm, request: GenerationRequest, cancel):
        self.requests.append(request)
        if self.fail_generate_with is not None:
            raise self.fail_generate_with
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        if isinstance(reply, ToolCallReply):
            return self._tool_stream(lm, request, reply)
        return self._stream(lm, request, reply, cancel)

    def _tool_stream(self, lm, request, reply: ToolCallReply):
        import json

        if reply.text:
            yield TextDelta(reply.text)
        calls = []
        n = len(self.requests)
        for i, (name, arguments) in enumerate(reply.calls):
            call_id = f"call_{n}_{i}"
            text = json.dumps(arguments)
            yield ToolCallStarted(call_id, name)
            for start in range(0, len(text), 5):
                yield ToolCallArgumentsDelta(call_id, text[start : start + 5])
            yield ToolCallFinished(call_id, name, arguments)
            calls.append(ToolCall(call_id, name, arguments))
        for i, (name, problem) in enumerate(reply.malformed):
            yield ToolCallMalformed(f"bad_{n}_{i}", name, "{", problem)
        usage = Usage(
            prompt_tokens=10,
            completion_tokens=5,
            cached_tokens=None,
            prefill_ms=1.0,
            decode_ms=1.0,
            ttft_ms=1.0,
            prompt_tok_s=10.0,
            decode_tok_s=5.0,
            context_used=15,
            context_limit=lm.n_ctx,
        )
        yield Finished(
            finish_reason=FINISH_TOOL_CALLS if calls or reply.malformed else FINISH_STOP,
            usage=usage,
            text=reply.text,
            tool_calls=tuple(calls),
        )

    def _stream(self, lm, request, reply, cancel):
        start = time.perf_counter()
        prompt_tokens = sum(len((m.get("content") or "").split()) + 4 for m in request.messages)
        if self.trimmed is not None:
            yield self.trimmed
        if self.reasoning:
            yield ReasoningDelta(self.reasoning)
        pieces = re.findall(r"\s*\S+", reply)
        emitted, reason, first = [], FINISH_STOP, None
        for i, piece in enumerate(pieces):
            if self.pause_after is not None and i == self.pause_after:
                self.gate.wait(WAIT_MS / 1000)
            if cancel.cancelled:
                reason = FINISH_CANCELLED
                break
            if first is None:
                first = time.perf_counter()
            top = (TopAlternative(1000 + i, piece, -0.2), TopAlternative(2000 + i, " alt", -1.9))
            yield TokenSampled(index=i, token_id=1000 + i, text=piece, logprob=-0.2, top=top)
            yield TextDelta(piece)
            emitted.append(piece)
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
        else:
            if request.json_mode != JsonMode.OFF:
                reason = FINISH_GRAMMAR_COMPLETE
        end = time.perf_counter()
        first = first or end
        n = len(emitted)
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=n,
            cached_tokens=None,
            prefill_ms=(first - start) * 1000,
            decode_ms=(end - first) * 1000,
            ttft_ms=(first - start) * 1000 + 0.01,
            prompt_tok_s=prompt_tokens / max(first - start, 1e-6),
            decode_tok_s=n / max(end - first, 1e-6),
            context_used=prompt_tokens + n,
            context_limit=lm.n_ctx,
        )
        yield Finished(
            finish_reason=reason,
            usage=usage,
            text="".join(emitted),
            reasoning=self.reasoning,
            token_ids=tuple(1000 + i for i in range(n)),
        )


def make_window(qtbot, data_dir, engine, *, load=True, model_path="/models/fake-model.gguf"):
    """A MainWindow over a fake engine with its store and settings in `data_dir`."""
    from app.controller import EngineController
    from app.settings import SettingsFile
    from app.store import Store
    from app.views.main_window import MainWindow

    store = Store(data_dir / "chats.sqlite3")
    settings_file = SettingsFile(data_dir / "settings.json")
    controller = EngineController(engine)
    window = MainWindow(controller, store, settings_file.load(), settings_file)
    qtbot.addWidget(window)
    window.show()
    if load:
        with qtbot.waitSignal(controller.modelLoaded, timeout=WAIT_MS):
            window.open_model(model_path)
    return window


def close_window(window):
    window.close()
    window.store.close()
