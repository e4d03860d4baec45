"""EngineWorker: a QObject that lives on a QThread and does every slow thing — model load, kernel
compile, generation — so the GUI thread only ever receives signals.

Requests arrive as queued signal calls from app/controller.py. Cancel does NOT go through a slot
(a queued slot would only run after the busy generate() returned); the controller sets the
CancelToken directly and the engine polls it between tokens.

Generation events cross threads through an EventChannel instead of one queued signal per event:
the worker merges them into the pending batch under a lock and emits `eventsReady` only when the
channel goes from empty to non-empty. A model (or a fake) producing tens of thousands of tokens a second therefore posts at
most one queued call per GUI drain, so it cannot flood the event loop, and no event ever waits for
a timer: the first token reaches the GUI as soon as the GUI is free.
"""

from __future__ import annotations

import threading
import traceback

from PySide6.QtCore import QObject, Signal, Slot

from app.engine_bridge import ContextTrimmed, EngineBridge, StreamNotice
from engine.cancel import CancelToken
from engine.events import (
    Finished,
    PrefillProgress,
    ReasoningDelta,
    TextDelta,
    TokenSampled,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
    Usage,
)
from engine.types import GenerationRequest

# Tool-call events stay separate and in order (a call's Started before its deltas and Finished).
TOOL_CALL_EVENTS = (ToolCallStarted, ToolCallArgumentsDelta, ToolCallFinished, ToolCallMalformed)


class RequestFailed:
    """Channel item: the request was refused or crashed before a Finished event."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


class EventBatch:
    """Consecutive stream events of one request, merged on the worker thread so the GUI thread
    does O(1) work per drain instead of O(events)."""

    __slots__ = (
        "request_id",
        "text",
        "reasoning",
        "tokens",
        "usage",
        "notices",
        "tool_events",
        "progress",
    )

    def __init__(self, request_id: int):
        self.request_id = request_id
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tokens: list[TokenSampled] = []
        self.usage: Usage | None = None
        self.notices: list[str] = []  # ContextTrimmed / StreamNotice messages
        self.tool_events: list = []  # ToolCall* events, in the order the engine sent them
        # the newest PrefillProgress only: the GUI shows where the prefill is now, not its history
        self.progress: PrefillProgress | None = None

    def add(self, event) -> bool:
        """False for events that are not stream events (Finished, failures)."""
        if isinstance(event, TextDelta):
            self.text.append(event.text)
        elif isinstance(event, TokenSampled):
            self.tokens.append(event)
        elif isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, (ContextTrimmed, StreamNotice)):
            self.notices.append(event.message)
        elif isinstance(event, TOOL_CALL_EVENTS):
            self.tool_events.append(event)
        elif isinstance(event, PrefillProgress):
            self.progress = event
        else:
            return False
        return True


class EventChannel:
    """Thread-safe hand-off from the worker to the GUI thread: a list of EventBatch and terminal
    items (Finished / RequestFailed), each tagged with its request id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list = []  # EventBatch | (request_id, Finished | RequestFailed)

    def put(self, request_id: int, event) -> bool:
        """Returns True when the channel was empty, i.e. the GUI needs a wake-up."""
        with self._lock:
            was_empty = not self._items
            last = self._items[-1] if self._items else None
            if not (
                isinstance(last, EventBatch) and last.request_id == request_id and last.add(event)
            ):
                batch = EventBatch(request_id)
                self._items.append(batch if batch.add(event) else (request_id, event))
            return was_empty

    def drain(self) -> list:
        with self._lock:
            items, self._items = self._items, []
        return items


class EngineWorker(QObject):
    loadProgress = Signal(str, float)  # stage, fraction 0..1
    modelLoaded = Signal(object)  # ModelInfo
    loadFailed = Signal(str, str)  # path, message for the user

    eventsReady = Signal()  # the channel went from empty to non-empty
    replayDone = Signal(int, object)  # request id, ReplayReport
    replayFailed = Signal(int, str)  # request id, message for the user
    compareModels = Signal(object)  # {request id: (model name, tokenizer fingerprint)}

    serverStarted = Signal(object)  # the ServingHandle (url, status())
    serverStopped = Signal()
    serverFailed = Signal(str)  # message for the user

    def __init__(self, bridge: EngineBridge):
        super().__init__()
        self._bridge = bridge
        self.channel = EventChannel()
        self.lm = None  # the loaded model; only touched on the worker thread after load
        self._serve_port: int | None = None  # set while "Serve this model" is on
        self._side_models: dict[str, object] = {}  # path -> a compare column's second model

    @Slot(str, int, int, str)
    def load(self, path: str, n_ctx: int, n_threads: int, cache_type: str = "f16") -> None:
        try:
            lm = self._bridge.load(
                path,
                n_ctx=n_ctx or None,
                n_threads=n_threads or None,
                cache_type=cache_type,
                progress=lambda stage, fraction: self.loadProgress.emit(
                    str(stage), float(fraction)
                ),
            )
            info = self._bridge.describe(lm)
        except BaseException as exc:  # a native panic too, or the window waits on "Loading" forever
            self.loadFailed.emit(path, _user_message(exc))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return
        previous, self.lm = self.lm, lm
        if previous is not None:
            self._bridge.unload(previous)  # its server stops with it
        self.modelLoaded.emit(info)
        if self._serve_port is not None:  # keep serving: now the new model
            self.startServing(self._serve_port)

    @Slot(int)
    def startServing(self, port: int) -> None:
        """Serve the loaded model over the OpenAI API on 127.0.0.1:port. Runs here, on the
        worker thread that owns the model; the forward passes then run on the scheduler's
        thread for the chat and the HTTP clients alike."""
        if self.lm is None:
            self.serverFailed.emit("No model is loaded yet.")
            return
        try:
            handle = self._bridge.start_serving(self.lm, port)
        except Exception as exc:
            self._serve_port = None
            message = _user_message(exc)
            if isinstance(exc, OSError):
                message = f"Cannot serve on 127.0.0.1:{port}: {message}"
            self.serverFailed.emit(message)
            return
        self._serve_port = port
        self.serverStarted.emit(handle)

    @Slot()
    def stopServing(self) -> None:
        self._serve_port = None
        try:
            self._bridge.stop_serving()
        finally:
            self.serverStopped.emit()

    @Slot(int, object, object)
    def generate(self, request_id: int, request: GenerationRequest, cancel: CancelToken) -> None:
        """Stream one request's events into the channel, ending with exactly one terminal item
        (its Finished, or a RequestFailed) whatever happens inside: an engine error, a native
        panic (a BaseException), a generator that stops early or fails while closing. Events after
        Finished are dropped. KeyboardInterrupt / SystemExit still propagate, after the item."""
        if self.lm is None:
            self._put(request_id, RequestFailed("No model is loaded yet."))
            return
        lm = self.lm
        self._stream(request_id, lambda: self._bridge.generate(lm, request, cancel), cancel)

    @Slot(object, object, object, object)
    def compare(self, request_ids: list, requests: list, cancels: list, model_paths: list) -> None:
        """Several requests on the loaded model at once (the compare view's columns). The bridge
        submits them all to the model's BatchScheduler, whose thread decodes them together; one
        small thread per column only moves its events into the channel (each ticket's event
        iterator blocks). This slot returns when every column has its terminal item, so the
        worker stays busy, as for a single reply. A column the bridge refused gets its error."""
        if self.lm is None:
            for request_id in request_ids:
                self._put(request_id, RequestFailed("No model is loaded yet."))
            return
        models: list = []  # per column: None (the chat's model), a side model, or why not
        for path in model_paths:
            models.append(self._side_model(path))
        self.compareModels.emit(
            {
                rid: self._describe_column(model)
                for rid, model in zip(request_ids, models, strict=True)
                if not isinstance(model, BaseException)
            }
        )
        runnable = [i for i, m in enumerate(models) if not isinstance(m, BaseException)]
        try:
            started = self._bridge.compare(
                self.lm,
                [requests[i] for i in runnable],
                [cancels[i] for i in runnable],
                [models[i] for i in runnable],
            )
            streams = list(models)
            for i, stream in zip(runnable, started, strict=True):
                streams[i] = stream
        except BaseException as exc:
            for request_id in request_ids:
                self._put(request_id, RequestFailed(_user_message(exc)))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return
        pumps = []
        for request_id, stream, cancel in zip(request_ids, streams, cancels, strict=True):
            if isinstance(stream, BaseException):
                self._put(request_id, RequestFailed(_user_message(stream)))
                continue
            pump = threading.Thread(
                target=self._stream,
                args=(request_id, lambda s=stream: s, cancel),
                name=f"compare-column-{request_id}",
                daemon=True,
            )
            pump.start()
            pumps.append(pump)
        for pump in pumps:
            pump.join()

    def _side_model(self, path: str | None):
        """The model a compare column runs on: None for the chat's own model, else a second file
        loaded here once and kept until `releaseSideModels` (or the exception that refused it)."""
        if path is None or str(path) == str(self.lm.path):
            return None
        if path not in self._side_models:
            try:
                self._side_models[path] = self._bridge.load_side(path)
            except Exception as exc:
                return exc
        return self._side_models[path]

    def _describe_column(self, model) -> tuple[str, str]:
        lm = self.lm if model is None else model
        return self._bridge.describe(lm).name, self._bridge.tokenizer_key(lm)

    @Slot()
    def releaseSideModels(self) -> None:
        """Unload the compare view's second models (the view closed)."""
        models, self._side_models = self._side_models, {}
        for lm in models.values():
            self._bridge.unload_side(lm)

    def _stream(self, request_id: int, make_events, cancel: CancelToken) -> None:
        """Put the events of `make_events()` into the channel, ending with exactly one terminal
        item (see `generate`)."""
        finished = False
        try:
            events = iter(make_events())
            try:
                for event in events:
                    self._put(request_id, event)
                    if isinstance(event, Finished):
                        finished = True
                        break
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()
        except BaseException as exc:
            if not finished:
                finished = True
                self._put(request_id, RequestFailed(_user_message(exc)))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            if not finished:
                self._put(
                    request_id,
                    RequestFailed(
                        "The request was cancelled before the reply started."
                        if cancel.cancelled
                        else "The engine stopped without finishing the reply."
                    ),
                )

    @Slot(int, object, object, object)
    def replay(self, request_id: int, receipt: dict, original_tokens: list, cancel) -> None:
        """Run a reply again from its receipt (engine/receipt.py) and report how it compares."""
        if self.lm is None:
            self.replayFailed.emit(request_id, "No model is loaded yet.")
            return
        try:
            report = self._bridge.replay(self.lm, receipt, original_tokens, cancel)
        except BaseException as exc:
            self.replayFailed.emit(request_id, _user_message(exc))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return
        self.replayDone.emit(request_id, report)

    def release(self) -> None:
        """Unload the model. Only after the worker thread has stopped (controller.shutdown)."""
        self.releaseSideModels()
        if self.lm is not None:
            lm, self.lm = self.lm, None
            self._bridge.unload(lm)

    def _put(self, request_id: int, event) -> None:
        if self.channel.put(request_id, event):
            self.eventsReady.emit()


def _user_message(exc: BaseException) -> str:
    """Engine errors are written for people (engine/errors.py); anything else gets its type too."""
    from engine.errors import EngineError

    if isinstance(exc, (EngineError, OSError)):
        return str(exc) or type(exc).__name__
    if type(exc).__name__ == "PanicException":  # a Rust library panicked (pyo3_runtime)
        return f"The engine's native code failed: {str(exc).strip() or 'panic'}"
    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return f"Unexpected error: {detail}"
