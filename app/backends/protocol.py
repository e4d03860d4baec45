"""ChatBackend: what ChatSession (app/session.py) and the window need from "the model", whichever
backend serves it. EngineController (the local engine, or RemoteEngine on its own worker thread)
and BackendRouter (router.py, which picks one of them per chat) both provide it.

Signals (Qt, so not expressible in a Protocol; listed for the reader): loadProgress(str, float),
modelLoaded(ModelInfo), loadFailed(str, str), replyText(str), replyReasoning(str),
replyTokens(list[TokenSampled]), replyUsage(Usage), replyNotice(str), replyFinished(Finished),
replyErrored(str), replyToolEvents(list), replyProgress(PrefillProgress: the prompt being read),
replayFinished(ReplayReport), replayFailed(str). Every request ends in
exactly one replyFinished or replyErrored."""

from __future__ import annotations

from typing import Protocol

from engine.types import GenerationRequest, ModelInfo, ResolvedPreset


class ChatBackend(Protocol):
    @property
    def model(self) -> ModelInfo | None: ...

    @property
    def loading(self) -> bool: ...

    @property
    def busy(self) -> bool: ...

    def load_model(self, path: str, n_ctx: int = 0, n_threads: int = 0) -> None: ...

    def generate(self, request: GenerationRequest) -> int: ...

    def cancel(self) -> None: ...

    @property
    def replaying(self) -> bool: ...

    def replay(self, receipt: dict, original_tokens: list) -> int: ...

    def resolve_preset(self, saved: dict | None, overrides: dict | None) -> ResolvedPreset: ...

    def shutdown(self) -> None: ...
