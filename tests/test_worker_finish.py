"""The worker ends every request with exactly one terminal item (Finished or RequestFailed),
whatever the engine does: raise while setting up, while streaming, after finishing, panic in
native code (a BaseException), stop without finishing, or be cancelled during setup."""

from __future__ import annotations

import pytest

from app.worker import EngineWorker, EventBatch, RequestFailed
from engine.cancel import CancelToken
from engine.errors import ConstraintError
from engine.events import Finished, TextDelta, Usage
from engine.types import GenerationRequest
from tests.test_constrained_hostile import real_panic_type

USAGE = Usage(
    prompt_tokens=1, completion_tokens=1, cached_tokens=None, prefill_ms=1.0, decode_ms=1.0,
    ttft_ms=1.0, prompt_tok_s=1.0, decode_tok_s=1.0, context_used=2, context_limit=512,
)  # fmt: skip
FINISHED = Finished(finish_reason="stop", usage=USAGE, text="Hi")


class Engine:
    """Just EngineBridge.generate: `script(cancel)` is the stream (a generator or a raise)."""

    def __init__(self, script):
        self.script = script

    def generate(self, lm, request, cancel):
        return self.script(cancel)


def terminal_items(worker: EngineWorker, request_id: int = 7) -> list:
    return [
        item[1]
        for item in worker.channel.drain()
        if not isinstance(item, EventBatch) and item[0] == request_id
    ]


def run(script, cancel: CancelToken | None = None) -> list:
    worker = EngineWorker(Engine(script))
    worker.lm = object()
    worker.generate(
        7, GenerationRequest(messages=({"role": "user", "content": "x"},)), cancel or CancelToken()
    )
    return terminal_items(worker)


def _raise(exc):
    raise exc


def setup_raises(exc):
    return lambda cancel: _raise(exc)


def raises_before_first_event(exc):
    def stream(cancel):
        _raise(exc)
        yield TextDelta("never")

    return stream


def raises_mid_stream(exc):
    def stream(cancel):
        yield TextDelta("H")
        _raise(exc)

    return stream


def raises_while_closing_after_finished(exc):
    def stream(cancel):
        try:
            yield TextDelta("Hi")
            yield FINISHED
        finally:
            _raise(exc)

    return stream


def finishes_twice(exc):
    def stream(cancel):
        yield FINISHED
        yield FINISHED
        _raise(exc)

    return stream


PHASES = [setup_raises, raises_before_first_event, raises_mid_stream]


def _errors():
    return [ConstraintError("JSON mode failed"), RuntimeError("bug"), real_panic_type()("boom")]


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("error", range(3), ids=["engine error", "bug", "native panic"])
def test_a_failure_in_any_phase_gives_one_request_failed(phase, error):
    exc = _errors()[error]
    (item,) = run(phase(exc))
    assert isinstance(item, RequestFailed)
    assert str(exc) in item.message


@pytest.mark.parametrize("phase", [raises_while_closing_after_finished, finishes_twice])
def test_nothing_after_finished_adds_a_second_terminal_item(phase):
    assert run(phase(real_panic_type()("boom"))) == [FINISHED]


def test_a_stream_that_stops_without_finishing_is_reported_once():
    def stream(cancel):
        yield TextDelta("Hi")

    (item,) = run(stream)
    assert isinstance(item, RequestFailed) and "without finishing" in item.message


def test_cancel_during_setup_is_reported_once():
    cancel = CancelToken()

    def stream(cancel):
        cancel.cancel()  # the user pressed Stop while the prompt was being prepared
        return iter(())

    (item,) = run(stream, cancel)
    assert isinstance(item, RequestFailed) and "cancelled" in item.message


def test_keyboard_interrupt_still_propagates_after_the_terminal_item():
    worker = EngineWorker(Engine(raises_mid_stream(KeyboardInterrupt())))
    worker.lm = object()
    with pytest.raises(KeyboardInterrupt):
        worker.generate(
            7, GenerationRequest(messages=({"role": "user", "content": "x"},)), CancelToken()
        )
    (item,) = terminal_items(worker)
    assert isinstance(item, RequestFailed)


def test_a_native_panic_while_loading_is_a_load_failure(qtbot):
    panic = real_panic_type()

    class PanickingLoader:
        def load(self, path, **kwargs):
            raise panic("assertion failed in native code")

    worker = EngineWorker(PanickingLoader())
    failures = []
    worker.loadFailed.connect(lambda path, message: failures.append((path, message)))
    worker.load("/models/x.gguf", 0, 0)
    assert failures == [
        ("/models/x.gguf", "The engine's native code failed: assertion failed in native code")
    ]
    assert worker.lm is None
