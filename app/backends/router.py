"""BackendRouter: the one handle ChatSession and the window hold on "the model", whichever
backend serves it — the local engine or an OpenAI-compatible server.

Both backends are an EngineController (app/controller.py) with its own worker thread: the local
one over RealEngine, the remote one over RemoteEngine (app/backends/remote.py), so both deliver
the engine's event dataclasses through the same signals and the views cannot tell them apart.
The router has the controller's surface (signals, `model`, `generate`, `cancel`,
`resolve_preset`, `load_model`) and forwards to the active backend; the reply signals of both
are forwarded always, so the end of a reply that was streaming when the user switched still
reaches its recorder. The remote controller (a second thread) is made on first use.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.backends.remote import is_remote_path
from app.controller import EngineController
from engine.types import GenerationRequest, ModelInfo, ResolvedPreset

LOCAL, REMOTE = "local", "remote"


class BackendRouter(QObject):
    loadProgress = Signal(str, float)
    modelLoaded = Signal(object)  # ModelInfo (path "remote://..." for a remote model)
    loadFailed = Signal(str, str)
    replyReasoning = Signal(str)
    replyText = Signal(str)
    replyTokens = Signal(object)
    replyUsage = Signal(object)
    replyNotice = Signal(str)
    replyFinished = Signal(object)
    replyErrored = Signal(str)
    replyToolEvents = Signal(object)  # ToolCall* events, local or from a server's tool_calls
    replyProgress = Signal(object)  # engine PrefillProgress (local engine: a remote sends none)
    replayFinished = Signal(object)  # engine.types.ReplayReport
    replayFailed = Signal(str)

    def __init__(
        self,
        local: EngineController,
        make_remote: Callable[[], EngineController],
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.local = local
        self._make_remote = make_remote
        self.remote: EngineController | None = None
        self.active: EngineController = local
        # The backend of the latest load_model: a slower load the user has since superseded
        # (a remote server answering after a local file was opened) must not take over.
        self._wanted: EngineController = local
        self._wire(local)
        # Replay re-runs a local reply from its receipt (a model file and its sha256): only the
        # local engine can do that, whichever backend is active.
        local.replayFinished.connect(self.replayFinished)
        local.replayFailed.connect(self.replayFailed)

    def _wire(self, controller: EngineController) -> None:
        controller.loadProgress.connect(self.loadProgress)
        controller.modelLoaded.connect(lambda info, c=controller: self._on_loaded(c, info))
        controller.loadFailed.connect(self.loadFailed)
        for name in (
            "replyReasoning",
            "replyText",
            "replyTokens",
            "replyUsage",
            "replyNotice",
            "replyFinished",
            "replyErrored",
            "replyToolEvents",
            "replyProgress",
        ):
            getattr(controller, name).connect(getattr(self, name))

    def _remote(self) -> EngineController:
        if self.remote is None:
            self.remote = self._make_remote()
            self._wire(self.remote)
        return self.remote

    # --- the controller's surface ---------------------------------------------------------------
    @property
    def model(self) -> ModelInfo | None:
        return self.active.model

    @property
    def loading(self) -> bool:
        return self.local.loading or (self.remote is not None and self.remote.loading)

    @property
    def busy(self) -> bool:
        return self.local.busy or (self.remote is not None and self.remote.busy)

    @property
    def kind(self) -> str:
        return REMOTE if self.active is self.remote else LOCAL

    def load_model(
        self, path: str, n_ctx: int = 0, n_threads: int = 0, cache_type: str = "f16"
    ) -> None:
        """Open a local GGUF or connect to a remote model ("remote://..."); the backend becomes
        active when it has loaded. A model already loaded in the other backend is switched to at
        once; opening the active model again loads it anew (new settings, a server restarted on
        it), as it did before there were two backends."""
        controller = self._remote() if is_remote_path(path) else self.local
        self._wanted = controller
        switching_back = controller is not self.active
        if switching_back and controller.model is not None and controller.model.path == str(path):
            self._on_loaded(controller, controller.model)
            return
        controller.load_model(path, n_ctx, n_threads, cache_type)

    def generate(self, request: GenerationRequest) -> int:
        return self.active.generate(request)

    @property
    def replaying(self) -> bool:
        return self.local.replaying

    def replay(self, receipt: dict, original_tokens: list) -> int:
        if self.active is not self.local:
            raise RuntimeError("replay runs on the local engine: open a local model first")
        return self.local.replay(receipt, original_tokens)

    def cancel(self) -> None:
        self.local.cancel()
        if self.remote is not None:
            self.remote.cancel()

    def resolve_preset(self, saved: dict | None, overrides: dict | None) -> ResolvedPreset:
        return self.active.resolve_preset(saved, overrides)

    def shutdown(self) -> None:
        self.local.shutdown()
        if self.remote is not None:
            self.remote.shutdown()

    def _on_loaded(self, controller: EngineController, info: ModelInfo) -> None:
        if controller is not self._wanted:
            return  # still loaded in its backend: switching back to it is instant
        self.active = controller
        self.modelLoaded.emit(info)
