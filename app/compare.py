"""Compare side by side: one prompt, with the open chat's history, answered by several columns at
once, each with its own sampling preset, on the local model (GUI-thread logic; the widgets are in
app/views/compare_view.py).

The columns go to the engine together (`EngineController.compare`): the bridge submits them all
to the model's BatchScheduler, so they are decoded in one forward pass per step and share its
prefix cache (the chat's history is usually cached already). Each column keeps its own tokens,
text, usage and TTFT. All columns run the same model, so they share a tokenizer and their token
ids can be compared: the first index where a column's ids differ from the first column's is its
divergence point (engine.receipt.first_divergence, the function replay uses). A column's reply
can be kept as a new version of the chat's reply ("Use this answer").
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field

from PySide6.QtCore import QObject, Signal

from app.backends.remote import is_remote_path
from app.reply_recorder import token_record
from app.session import TOP_LOGPROBS, ChatSession
from engine.errors import EngineError
from engine.events import (
    FINISH_CANCELLED,
    FINISH_ERROR,
    Finished,
    PrefillProgress,
    TokenSampled,
    Usage,
)
from engine.prefill_progress import PREFILL_CHUNK, describe_progress
from engine.receipt import first_divergence
from engine.types import GenerationRequest, JsonMode, MessageStatus, ResolvedPreset, Role


@dataclass(frozen=True)
class ColumnSpec:
    """What one column runs: a label and the preset values it sets over the model's saved preset
    (the preset panel's resolution gives every other value and each value's source)."""

    label: str
    overrides: dict = field(default_factory=dict)
    # Another GGUF file to answer with (e.g. the Q8_0 beside the loaded Q4_K_M), or a picked
    # remote model ("remote://..."); None: the loaded model. Its values then come from that
    # model and the overrides (not the chat's saved preset, which belongs to the loaded model).
    model_path: str | None = None


# Two columns a user compares first: what the model does without chance, and with it.
DEFAULT_COLUMNS = (
    ColumnSpec("Greedy", {"do_sample": False}),
    ColumnSpec("Temperature 0.8", {"do_sample": True, "temperature": 0.8}),
)


def confidence(token: TokenSampled) -> float:
    """The probability the model gave the token it chose (the shading of each reply token)."""
    return math.exp(token.logprob)


def _reading(column: ColumnState) -> bool:
    """The column's request runs and its prompt is not read yet."""
    progress = column.prefill
    return column.running and progress is not None and progress.done < progress.total


@dataclass
class ColumnState:
    spec: ColumnSpec
    request_id: int | None = None
    text: str = ""
    reasoning: str = ""
    tokens: list[TokenSampled] = field(default_factory=list)
    usage: Usage | None = None
    finished: Finished | None = None
    error: str | None = None
    started_at: float = 0.0
    first_token_at: float | None = None
    model_name: str = ""  # as the worker described it once the column started
    tokenizer_key: str = ""  # its vocabulary's fingerprint: equal keys, comparable token ids
    prefill: PrefillProgress | None = None  # the newest, while its prompt is read
    # It waited for an earlier column's prompt while reading its own (prefill_waiting): the
    # time of its first chunk includes that wait, so its speed and time left are not shown
    # until a second chunk has been read.
    waited: bool = False

    @property
    def running(self) -> bool:
        return self.request_id is not None and self.finished is None and self.error is None

    @property
    def ttft_ms(self) -> float | None:
        """The engine's time to first token once known, else the one measured here."""
        if self.usage is not None and self.usage.completion_tokens:
            return self.usage.ttft_ms
        if self.first_token_at is None:
            return None
        return (self.first_token_at - self.started_at) * 1000

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for t in self.tokens]


def divergence_index(a: ColumnState, b: ColumnState) -> int | None:
    """The first token index where two columns' streams differ, once it is certain: a
    difference inside both streams is final at once; one stream ending before the other only
    counts when neither is still running (the shorter may go on). None: identical, or not known
    yet."""
    ids_a, ids_b = a.token_ids, b.token_ids
    index = first_divergence(ids_a, ids_b)
    if index is None:
        return None
    inside_both = index < len(ids_a) and index < len(ids_b)
    if not inside_both and (a.running or b.running):
        return None
    return index


@dataclass(frozen=True)
class Divergence:
    """Where column `other` first differs from the reference column (index into their token
    streams) and what each had there (None: that column's reply had ended)."""

    reference: int
    other: int
    index: int
    reference_token: TokenSampled | None
    other_token: TokenSampled | None


class CompareRun(QObject):
    """The columns of one comparison and their streams."""

    columnChanged = Signal(int)  # column index
    finished = Signal()  # every column has finished or failed
    answerUsed = Signal(int)  # the stored message id

    def __init__(self, session: ChatSession, parent: QObject | None = None):
        super().__init__(parent)
        self.session = session
        # Compare runs on the local engine: the router's local controller, or the controller.
        self.controller = getattr(session.controller, "local", session.controller)
        self.router = session.controller if hasattr(session.controller, "local") else None
        self._remote_column: int | None = None  # the column a remote server answers
        self._remote_wired = None  # the remote controller whose reply signals are connected
        self.columns: list[ColumnState] = [ColumnState(spec) for spec in DEFAULT_COLUMNS]
        self.prompt = ""
        self.user_message_id: int | None = None  # the question, once it is in the chat
        self._history_before: int | None = None  # position of the answered message, if any
        self._by_request: dict[int, int] = {}
        self.controller.compareBatch.connect(self._on_batch)
        self.controller.compareFinished.connect(self._on_finished)
        self.controller.compareErrored.connect(self._on_errored)
        self.controller.compareModels.connect(self._on_models)

    # --- what is compared -----------------------------------------------------------------------
    def answer_again(self, user_message_id: int) -> bool:
        """Compare answers to a user message of the visible branch (its history is the branch
        above it); "Use this answer" then adds a version of its reply."""
        message = next((m for m in self.session.branch if m.id == user_message_id), None)
        if message is None or message.role != Role.USER:
            return False
        self.prompt = message.content
        self.user_message_id = message.id
        self._history_before = message.position
        return True

    def set_columns(self, specs: list[ColumnSpec]) -> None:
        if self.running:
            raise RuntimeError("the comparison is running")
        self.columns = [ColumnState(spec) for spec in specs]

    def resolve(self, index: int) -> ResolvedPreset | None:
        """Column `index`'s values with their sources (None for a column on another file: its
        values are known when it finished, `Finished.preset`); raises the engine's typed error
        when one of its values is invalid."""
        spec = self.columns[index].spec
        if spec.model_path is not None and is_remote_path(spec.model_path):
            remote = self.remote_controller()
            if remote is None or remote.model is None or remote.model.path != spec.model_path:
                return None
            return remote.resolve_preset(None, dict(spec.overrides))
        if spec.model_path is not None:
            return None
        return self.controller.resolve_preset(self._saved(spec), dict(spec.overrides))

    def remote_controller(self):
        """The remote backend's controller (app/backends/router.py), once a remote model was
        picked; None otherwise."""
        return getattr(self.router, "remote", None) if self.router is not None else None

    def remote_model(self):
        remote = self.remote_controller()
        return remote.model if remote is not None else None

    def _saved(self, spec: ColumnSpec) -> dict | None:
        presets = self.session.presets
        if spec.model_path is not None or not presets or not presets.saved:
            return None
        return dict(presets.saved)

    def resolve_error(self, index: int) -> str | None:
        try:
            self.resolve(index)
        except (EngineError, ValueError) as exc:
            return str(exc)
        return None

    def messages(self) -> tuple[dict, ...]:
        """The chat's system prompt and visible history (above the compared message, when one
        was picked), then the prompt."""
        session = self.session
        out: list[dict] = []
        conv = (
            session.store.conversation(session.conversation_id)
            if session.conversation_id is not None
            else None
        )
        if conv is not None and conv.system_prompt.strip():
            out.append({"role": Role.SYSTEM, "content": conv.system_prompt.strip()})
        for m in session.branch:
            if self._history_before is not None and m.position >= self._history_before:
                break
            if (
                m.role in (Role.USER, Role.ASSISTANT)
                and m.status != MessageStatus.STREAMING
                and (m.content or m.role == Role.USER)
            ):
                out.append({"role": m.role, "content": m.content})
        out.append({"role": Role.USER, "content": self.prompt})
        return tuple(out)

    def request(self, index: int) -> GenerationRequest:
        spec = self.columns[index].spec
        return GenerationRequest(
            messages=self.messages(),
            overrides=dict(spec.overrides),
            saved_preset=self._saved(spec),
            json_mode=JsonMode.OFF,
            top_logprobs=TOP_LOGPROBS,
            enable_thinking=self.session.thinking if self._thinking_switch() else None,
        )

    def _thinking_switch(self) -> bool:
        info = self.controller.model
        return bool(info is not None and info.thinking_switch)

    # --- running --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return any(c.running for c in self.columns)

    def start(self, prompt: str | None = None) -> str | None:
        """Run every column on the prompt; returns why it cannot start, else None."""
        if prompt is not None:
            if prompt.strip() != self.prompt:
                # a new question: it joins the chat only when an answer is used
                self.user_message_id, self._history_before = None, None
            self.prompt = prompt.strip()
        if not self.prompt:
            return "Type a prompt to compare."
        if self.controller.model is None:
            return "Open a local model to compare."
        if self.controller.busy or self.controller.replaying or self.session.busy:
            return "Wait for the current reply to finish."
        if len(self.columns) < 2:
            return "Add at least two columns."
        remote_columns = [
            i
            for i, c in enumerate(self.columns)
            if c.spec.model_path is not None and is_remote_path(c.spec.model_path)
        ]
        remote = self.remote_controller()
        if remote_columns and remote is not None and remote.busy:
            return "Wait for the remote reply to finish."
        now = time.perf_counter()
        self.columns = [ColumnState(c.spec, started_at=now) for c in self.columns]
        local = [i for i in range(len(self.columns)) if i not in remote_columns]
        self._by_request, self._remote_column = {}, None
        if local:
            ids = self.controller.compare(
                [self.request(i) for i in local], [self.columns[i].spec.model_path for i in local]
            )
            for i, rid in zip(local, ids, strict=True):
                self._by_request[rid] = i
                self.columns[i].request_id = rid
        for n, i in enumerate(remote_columns):
            self._start_remote(i, first=n == 0)
        for i in range(len(self.columns)):
            self.columnChanged.emit(i)
        if not self.running:
            self.finished.emit()
        return None

    def _start_remote(self, index: int, first: bool) -> None:
        """Column `index` is answered by the picked remote model (one request at a time per
        server connection: one remote column per comparison)."""
        column, remote = self.columns[index], self.remote_controller()
        column.request_id = -1 - index  # not an engine request id: the remote controller's own
        column.model_name = column.spec.model_path.split("/", 3)[-1]
        column.tokenizer_key = "remote:" + column.spec.model_path  # the server's vocabulary
        if not first:
            column.error = "Only one column can use a remote model at a time."
            return
        model = remote.model if remote is not None else None
        if model is None or model.path != column.spec.model_path:
            column.error = "Pick this remote model in the Remote menu first."
            return
        column.model_name = model.name
        self._wire_remote(remote)
        self._remote_column = index
        spec = column.spec
        remote.generate(
            GenerationRequest(
                messages=self.messages(),
                overrides=dict(spec.overrides),
                top_logprobs=TOP_LOGPROBS,
            )
        )

    def _wire_remote(self, remote) -> None:
        if self._remote_wired is remote:
            return
        self._remote_wired = remote
        remote.replyTokens.connect(self._on_remote_tokens)
        remote.replyText.connect(self._on_remote_text)
        remote.replyReasoning.connect(self._on_remote_reasoning)
        remote.replyUsage.connect(self._on_remote_usage)
        remote.replyFinished.connect(self._on_remote_finished)
        remote.replyErrored.connect(self._on_remote_errored)

    def _remote_state(self) -> tuple[int, ColumnState] | None:
        i = self._remote_column
        return (i, self.columns[i]) if i is not None and self.columns[i].running else None

    def _on_remote_tokens(self, tokens: list) -> None:
        self._remote_batch(tokens=tokens)

    def _on_remote_text(self, text: str) -> None:
        self._remote_batch(text=text)

    def _on_remote_reasoning(self, text: str) -> None:
        self._remote_batch(reasoning=text)

    def _on_remote_usage(self, usage: Usage) -> None:
        self._remote_batch(usage=usage)

    def _remote_batch(self, tokens=(), text="", reasoning="", usage=None) -> None:
        found = self._remote_state()
        if found is None:
            return
        index, column = found
        if (tokens or text) and column.first_token_at is None:
            column.first_token_at = time.perf_counter()
        column.tokens.extend(tokens)
        column.text += text
        column.reasoning += reasoning
        if usage is not None:
            column.usage = usage
        self.columnChanged.emit(index)

    def _on_remote_finished(self, finished: Finished) -> None:
        found = self._remote_state()
        if found is not None:
            self._finish(found[0], finished)

    def _on_remote_errored(self, message: str) -> None:
        found = self._remote_state()
        if found is not None:
            self._fail(found[0], message)

    def close(self) -> None:
        """The view closed: stop the columns and unload the second model files."""
        self.stop()
        if any(c.spec.model_path and not is_remote_path(c.spec.model_path) for c in self.columns):
            self.controller.release_side_models()

    def _on_models(self, described: dict) -> None:
        for request_id, (name, key) in described.items():
            index = self._column(request_id)
            if index is not None:
                self.columns[index].model_name, self.columns[index].tokenizer_key = name, key
                self.columnChanged.emit(index)

    def shares_tokenizer(self, other: int, reference: int = 0) -> bool:
        a, b = self.columns[reference], self.columns[other]
        return a.tokenizer_key == b.tokenizer_key or not (a.tokenizer_key and b.tokenizer_key)

    def stop(self) -> None:
        """Stop every column (each ends as cancelled, keeping what it wrote)."""
        if self.running:
            self.controller.cancel()
            remote = self.remote_controller()
            if remote is not None and self._remote_state() is not None:
                remote.cancel()

    def _column(self, request_id: int) -> int | None:
        return self._by_request.get(request_id)

    def _on_batch(self, request_id: int, batch) -> None:
        index = self._column(request_id)
        if index is None:
            return
        column = self.columns[index]
        if batch.tokens and column.first_token_at is None:
            column.first_token_at = time.perf_counter()
        column.tokens.extend(batch.tokens)
        column.text += "".join(batch.text)
        column.reasoning += "".join(batch.reasoning)
        if batch.progress is not None:
            column.prefill = batch.progress
            self._note_waiting()
        if batch.usage is not None:
            column.usage = batch.usage
        self.columnChanged.emit(index)

    # --- prompt reading in a shared batch ------------------------------------------------------
    def prefill_waiting(self, index: int) -> int | None:
        """The earlier column that column `index` is waiting for while it reads its prompt, or
        None when it is not waiting. The engine's scheduler gives a step's whole prefill budget
        to the earliest-started sequence still reading its prompt (engine/batching/
        forward_work.py cut_step), so a later column gets no share of the batch until the
        earlier ones have read theirs; a time left from its stalled rate said ~4 min 38 s for
        a wait that ended seconds later."""
        if not _reading(self.columns[index]):
            return None
        return next((i for i in range(index) if _reading(self.columns[i])), None)

    def progress_text(self, index: int) -> str:
        """The column's prompt-reading line: "Waiting for column 1's prompt · 0 / 3,000 tokens"
        while it gets no share of the batch, else the usual line (engine/prefill_progress.py),
        without speed and time left while its only measured chunk includes a wait."""
        column = self.columns[index]
        progress = column.prefill
        assert progress is not None
        ahead = self.prefill_waiting(index)
        if ahead is not None:
            return (
                f"Waiting for column {ahead + 1}'s prompt · {progress.done:,} / "
                f"{progress.total:,} tokens"
            )
        if column.waited and progress.done - progress.cached <= PREFILL_CHUNK:
            progress = dataclasses.replace(progress, tok_s=None, eta_s=None)
        return describe_progress(progress)

    def _note_waiting(self) -> None:
        for i, column in enumerate(self.columns):
            if self.prefill_waiting(i) is not None:
                column.waited = True

    def _on_finished(self, request_id: int, finished: Finished) -> None:
        index = self._column(request_id)
        if index is not None:
            self._finish(index, finished)

    def _finish(self, index: int, finished: Finished) -> None:
        column = self.columns[index]
        column.finished, column.usage = finished, finished.usage
        column.text = finished.text or column.text
        if finished.finish_reason == FINISH_ERROR:
            column.error = finished.error or "The engine failed."
        self.columnChanged.emit(index)
        self._maybe_done()

    def _on_errored(self, request_id: int, message: str) -> None:
        index = self._column(request_id)
        if index is not None:
            self._fail(index, message)

    def _fail(self, index: int, message: str) -> None:
        self.columns[index].error = message
        self.columnChanged.emit(index)
        self._maybe_done()

    def _maybe_done(self) -> None:
        if not self.running:
            self.finished.emit()

    # --- reading the results --------------------------------------------------------------------
    def divergence(self, other: int, reference: int = 0) -> Divergence | None:
        """Where column `other` first differs from `reference` (one tokenizer: the same model,
        or two files with the same vocabulary). None for two tokenizers, while it cannot be
        known yet (identical so far and one still streaming) and when the two are identical."""
        if not self.shares_tokenizer(other, reference):
            return None  # two vocabularies: the same id is not the same token
        index = divergence_index(self.columns[reference], self.columns[other])
        if index is None:
            return None
        a, b = self.columns[reference], self.columns[other]
        return Divergence(
            reference,
            other,
            index,
            a.tokens[index] if index < len(a.tokens) else None,
            b.tokens[index] if index < len(b.tokens) else None,
        )

    def use_answer(self, index: int) -> int | None:
        """Keep column `index`'s reply: added to the chat as a new version of the reply to the
        compared question (the question is added first when it is new). -> the message id."""
        column = self.columns[index]
        if column.finished is None or column.error is not None:
            return None
        session, store = self.session, self.session.store
        cid = session.ensure_conversation()
        if self.user_message_id is None or store.message(self.user_message_id) is None:
            parent = session.branch[-1].id if session.branch else None
            self.user_message_id = store.add_message(cid, Role.USER, self.prompt, parent_id=parent)
            if not session.branch:
                session.rename_conversation(cid, self.prompt[:48])
                session.conversationsChanged.emit()
        finished = column.finished
        status = (
            MessageStatus.CANCELLED
            if finished.finish_reason == FINISH_CANCELLED
            else MessageStatus.COMPLETE
        )
        message_id = store.add_message(
            cid,
            Role.ASSISTANT,
            finished.text or column.text,
            status=status,
            reasoning=finished.reasoning or column.reasoning,
            finish_reason=finished.finish_reason,
            usage=asdict(finished.usage),
            tokens=[token_record(t) for t in column.tokens],
            parent_id=self.user_message_id,
            receipt=finished.receipt,
        )
        session.open_conversation(cid)  # the chat shows the kept version
        self.answerUsed.emit(message_id)
        return message_id
