"""EngineController: owns the worker thread and is the GUI thread's handle on the engine.

- Requests go to the worker through queued signals (the worker lives on its own QThread).
- `cancel()` sets the CancelToken directly from the GUI thread: the worker is busy inside
  generate() and would never run a queued cancel slot in time.
- `shutdown()`: cancel, `quit()`, `wait()` — the thread ends after the current token.
- Worker events arrive through an EventChannel (see app/worker.py); each drain becomes one emit
  per kind (tokens, reasoning, text, usage), then finished/errored.
- Only events of the current request are forwarded; a late batch from a cancelled request that
  was superseded cannot leak into the next reply.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from app.engine_bridge import EngineBridge
from app.worker import EngineWorker, EventBatch
from engine.cancel import CancelToken
from engine.events import Finished
from engine.types import GenerationRequest, ModelInfo, ResolvedPreset

# At most ~100 drains a second: far above a real model's token rate (so no visible delay), and
# far below what would starve timers, painting and input.
MIN_DRAIN_INTERVAL_S = 0.010

# The worker runs Python between kernel calls (request planning, tokenizing, sampling, events).
# While it does, each GIL acquisition on the GUI thread (every Python slot, override, timer tick)
# waits up to the interpreter's switch interval, and one frame needs many of them: at the default
# 5 ms, a worker busy in Python for 300 ms stalled the GUI for 80-180 ms; at 1 ms, 3-19 ms
# (tools/stall_probe.py with a spinning bridge).
# Process-wide, so the program's entry point sets it once (app/__main__.py main()); it costs a
# little only while two threads want the GIL at once.
GIL_SWITCH_INTERVAL_S = 0.001


class EngineController(QObject):
    loadProgress = Signal(str, float)
    modelLoaded = Signal(object)  # ModelInfo
    loadFailed = Signal(str, str)  # path, message

    replyReasoning = Signal(str)
    replyText = Signal(str)
    replyTokens = Signal(object)  # list[TokenSampled]; object, not list: no per-item conversion
    replyUsage = Signal(object)
    replyNotice = Signal(str)  # e.g. older turns left out to fit the context
    replyToolEvents = Signal(object)  # list of engine ToolCall* events, in order
    replyProgress = Signal(object)  # engine PrefillProgress: the prompt is being read
    replyFinished = Signal(object)  # engine Finished
    replyErrored = Signal(str)
    replayFinished = Signal(object)  # ReplayReport
    replayFailed = Signal(str)

    # The compare view's columns (several requests at once), by the ids `compare` returned:
    compareBatch = Signal(int, object)  # request id, app.worker.EventBatch
    compareFinished = Signal(int, object)  # request id, engine Finished
    compareErrored = Signal(int, str)  # request id, message for the user
    compareModels = Signal(object)  # {request id: (model name, tokenizer fingerprint)}

    serverStarted = Signal(str)  # URL, e.g. http://127.0.0.1:8080/v1
    serverStopped = Signal()
    serverFailed = Signal(str)

    _load = Signal(str, int, int, str)
    _generate = Signal(int, object, object)
    _replay = Signal(int, object, object, object)
    _compare = Signal(object, object, object, object)
    _release_side_models = Signal()
    _start_serving = Signal(int)
    _stop_serving = Signal()

    def __init__(self, bridge: EngineBridge, parent: QObject | None = None):
        super().__init__(parent)
        self.bridge = bridge
        self.model: ModelInfo | None = None
        self.loading = False
        self._request_id = 0
        self._active: int | None = None
        self._cancel: CancelToken | None = None
        self._replay_id: int | None = None
        self._replay_cancel: CancelToken | None = None
        self._comparing: dict[int, CancelToken] = {}  # compare columns still running
        self._serving = None  # the worker's ServingHandle while the model is served

        self._thread = QThread()
        self._thread.setObjectName("engine-worker")
        self._worker = EngineWorker(bridge)
        self._worker.moveToThread(self._thread)
        self._load.connect(self._worker.load)
        self._generate.connect(self._worker.generate)
        self._replay.connect(self._worker.replay)
        self._compare.connect(self._worker.compare)
        self._release_side_models.connect(self._worker.releaseSideModels)
        self._worker.compareModels.connect(self.compareModels)
        self._start_serving.connect(self._worker.startServing)
        self._stop_serving.connect(self._worker.stopServing)
        w = self._worker
        w.loadProgress.connect(self.loadProgress)
        w.modelLoaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.eventsReady.connect(self._on_events_ready)  # queued: the worker lives on another thread
        w.replayDone.connect(self._on_replay_done)
        w.replayFailed.connect(self._on_replay_failed)
        w.serverStarted.connect(self._on_server_started)
        w.serverStopped.connect(self._on_server_stopped)
        w.serverFailed.connect(self._on_server_failed)
        self._drain_timer = QTimer(self)
        self._drain_timer.setSingleShot(True)
        self._drain_timer.timeout.connect(self._drain)
        self._last_drain = 0.0
        self._thread.start()

    # --- state ----------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self._active is not None or bool(self._comparing)

    @property
    def comparing(self) -> bool:
        return bool(self._comparing)

    # --- requests -------------------------------------------------------------------------------
    def load_model(
        self, path: str, n_ctx: int = 0, n_threads: int = 0, cache_type: str = "f16"
    ) -> None:
        self.cancel()
        self.loading = True
        self._load.emit(str(path), int(n_ctx), int(n_threads), str(cache_type))

    def generate(self, request: GenerationRequest) -> int:
        if self._active is not None or self._replay_id is not None or self._comparing:
            raise RuntimeError("a reply is already being generated")
        self._request_id += 1
        self._active = self._request_id
        self._cancel = CancelToken()
        self._generate.emit(self._request_id, request, self._cancel)
        return self._request_id

    def compare(
        self, requests: list[GenerationRequest], model_paths: list[str | None] | None = None
    ) -> list[int]:
        """Start several requests together: request i on the GGUF file model_paths[i] (loaded on
        the worker thread beside the chat's model, kept until `release_side_models`) or, for
        None, on the loaded model. The requests of one model share one BatchScheduler pass per
        step (app/engine_bridge.py). -> their ids, in order; compareModels tells each one's
        model and tokenizer; each ends with one compareFinished or compareErrored; `cancel`
        stops them all."""
        if self.busy or self._replay_id is not None:
            raise RuntimeError("the engine is busy")
        ids, cancels = [], []
        for _request in requests:
            self._request_id += 1
            ids.append(self._request_id)
            cancels.append(CancelToken())
        self._comparing = dict(zip(ids, cancels, strict=True))
        paths = list(model_paths) if model_paths is not None else [None] * len(requests)
        self._compare.emit(ids, list(requests), cancels, paths)
        return ids

    def release_side_models(self) -> None:
        """Unload the second models compare columns used (on the worker thread)."""
        self._release_side_models.emit()

    def cancel(self) -> None:
        for token in self._comparing.values():
            token.cancel()
        if self._cancel is not None:
            self._cancel.cancel()
            # A remote backend is blocked reading a socket, not polling the token between
            # tokens: it stops the read itself (app/backends/remote.py RemoteEngine.interrupt).
            interrupt = getattr(self.bridge, "interrupt", None)
            if interrupt is not None:
                interrupt()
        if self._replay_cancel is not None:
            self._replay_cancel.cancel()

    @property
    def replaying(self) -> bool:
        return self._replay_id is not None

    def replay(self, receipt: dict, original_tokens: list) -> int:
        """Re-run a reply from its receipt on the worker thread; replayFinished or replayFailed
        follows. Cancel stops it like a reply."""
        if self._active is not None or self._replay_id is not None:
            raise RuntimeError("the engine is busy")
        self._request_id += 1
        self._replay_id = self._request_id
        self._replay_cancel = CancelToken()
        self._replay.emit(self._request_id, receipt, list(original_tokens), self._replay_cancel)
        return self._request_id

    @Slot(int, object)
    def _on_replay_done(self, request_id: int, report) -> None:
        if request_id == self._replay_id:
            self._replay_id, self._replay_cancel = None, None
            self.replayFinished.emit(report)

    @Slot(int, str)
    def _on_replay_failed(self, request_id: int, message: str) -> None:
        if request_id == self._replay_id:
            self._replay_id, self._replay_cancel = None, None
            self.replayFailed.emit(message)

    def resolve_preset(self, saved: dict | None, overrides: dict | None) -> ResolvedPreset:
        """Runs on the GUI thread: configuration logic only, from the loaded model's ModelInfo
        (see app/engine_bridge.py); the model object itself stays on the worker thread."""
        if self.model is None:
            raise RuntimeError("no model loaded")
        return self.bridge.resolve_preset(self.model, saved, overrides)

    # --- serving the model over HTTP ----------------------------------------------------------
    def start_serving(self, port: int) -> None:
        """Ask the worker to serve the loaded model on 127.0.0.1:port (serverStarted/Failed)."""
        self._start_serving.emit(int(port))

    def stop_serving(self) -> None:
        self._stop_serving.emit()

    @property
    def serving_url(self) -> str | None:
        return self._serving.url if self._serving is not None else None

    def server_status(self):
        """The server's ServerStatus (running and queued requests...), or None: plain numbers read
        under the scheduler's lock, cheap enough for a status bar timer on the GUI thread."""
        return self._serving.status() if self._serving is not None else None

    def shutdown(self) -> None:
        self.cancel()
        self._thread.quit()
        self._thread.wait()
        self._worker.release()  # the thread is gone: safe to stop the model's kernel threads

    # --- worker callbacks (GUI thread) ----------------------------------------------------------
    @Slot()
    def _on_events_ready(self) -> None:
        """Drain now if the last drain was long enough ago, else once the interval has passed.

        Without the pause a worker that produces faster than the GUI drains would keep a posted
        event always pending, and Qt would serve those before timers and input (measured: the
        heartbeat starved for seconds). The worker does not post again until we drain."""
        wait_ms = (self._last_drain + MIN_DRAIN_INTERVAL_S - time.monotonic()) * 1000
        if wait_ms <= 0:
            self._drain()
        elif not self._drain_timer.isActive():
            self._drain_timer.start(max(1, int(wait_ms)))

    @Slot()
    def _drain(self) -> None:
        """Everything the worker produced since the last drain, merged into one emit per kind."""
        self._last_drain = time.monotonic()
        for item in self._worker.channel.drain():
            if isinstance(item, EventBatch) and item.request_id in self._comparing:
                self.compareBatch.emit(item.request_id, item)
                continue
            if isinstance(item, tuple) and item[0] in self._comparing:
                request_id, event = item
                del self._comparing[request_id]
                if isinstance(event, Finished):
                    self.compareFinished.emit(request_id, event)
                else:
                    self.compareErrored.emit(request_id, event.message)
                continue
            if isinstance(item, EventBatch):
                if item.request_id == self._active:  # else: a superseded request's tail
                    for notice in item.notices:
                        self.replyNotice.emit(notice)
                    if item.progress is not None:
                        self.replyProgress.emit(item.progress)
                    self._emit_batch(item.text, item.reasoning, item.tokens, item.usage)
                    if item.tool_events:
                        self.replyToolEvents.emit(item.tool_events)
                continue
            request_id, event = item
            if request_id != self._active:
                continue
            self._active, self._cancel = None, None
            if isinstance(event, Finished):
                self.replyFinished.emit(event)
            else:
                self.replyErrored.emit(event.message)

    def _emit_batch(self, text, reasoning, tokens, usage) -> None:
        if tokens:
            self.replyTokens.emit(tokens)
        if reasoning:
            self.replyReasoning.emit("".join(reasoning))
        if text:
            self.replyText.emit("".join(text))
        if usage is not None:
            self.replyUsage.emit(usage)

    @Slot(object)
    def _on_server_started(self, handle) -> None:
        self._serving = handle
        self.serverStarted.emit(handle.url)

    @Slot()
    def _on_server_stopped(self) -> None:
        self._serving = None
        self.serverStopped.emit()

    @Slot(str)
    def _on_server_failed(self, message: str) -> None:
        self._serving = None
        self.serverFailed.emit(message)

    @Slot(object)
    def _on_loaded(self, info: ModelInfo) -> None:
        self.loading = False
        self.model = info
        self.modelLoaded.emit(info)

    @Slot(str, str)
    def _on_load_failed(self, path: str, message: str) -> None:
        self.loading = False
        self.loadFailed.emit(path, message)
