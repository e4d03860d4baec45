"""ChatSession: the GUI-thread logic between the widgets, the store and the engine controller.

It owns the current conversation, turns user actions (send, edit + regenerate, regenerate,
switch version, branch, cancel) into engine requests, records the streaming reply (ReplyRecorder)
and computes the live usage shown while tokens arrive. Widgets only call its methods and listen
to its signals.

The open chat's visible branch is held in memory (`self.branch`, without the replies' token
records): sending, regenerating and building a request read it instead of the database, so a
long chat costs nothing per Send. Token records are read from the store when the inspector asks.
A conversation is a tree (app/store.py): regenerate and edit add a new version beside the old
one, and switching a version re-reads the branch.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time

from PySide6.QtCore import QObject, Signal

from app.backends.protocol import ChatBackend
from app.backends.remote import REMOTE_ARCHITECTURE, parse_remote_path, remote_model_path
from app.preset_state import PresetState
from app.project_settings import ChatDefaults, resolve_with_project
from app.reply_recorder import ReplyRecorder
from app.settings import Settings, SettingsFile
from app.store import Store, StoredMessage, StoreWriteError
from app.tool_registry import ToolRegistry
from app.tool_runner import ToolRunner
from engine.compaction import edited_note, receipt_section, with_summary_note
from engine.errors import EngineError
from engine.events import FINISH_CANCELLED, Finished, ToolCallMalformed, Usage
from engine.receipt import with_compaction, with_sources
from engine.types import GenerationRequest, JsonMode, MessageStatus, ModelInfo, Role

TOP_LOGPROBS = 5
# A chat opens with the last OPEN_MESSAGES messages of its branch and loads earlier ones on
# request, so opening it (at start-up: the newest chat) does not depend on how long it is; an
# imported chat of 150,000 messages froze the window at 2.6 GB on every start.
OPEN_MESSAGES = 200


def _reports_write_errors(method):
    """A user action whose database write fails (disk full) reports it through storageProblem
    and returns None instead of raising into a Qt slot; one that succeeds clears that report."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        failures_before = self._write_failures
        try:
            result = method(self, *args, **kwargs)
        except StoreWriteError as exc:
            self._write_failures += 1
            self._action_error = exc
            self._note_storage()
            return None
        if self._write_failures == failures_before:  # no nested action failed either
            self._action_error = None
        self._note_storage()
        return result

    return guarded


def describe_write_error(exc: StoreWriteError) -> str:
    kept = "Replies are kept in this window and saved as soon as possible (retried every few s)."
    if exc.disk_full:
        return f"Disk full: chats cannot be saved. {kept}"
    return f"Chats cannot be saved ({exc}). {kept}"


class ChatSession(QObject):
    conversationsChanged = Signal()
    conversationOpened = Signal(object, list)  # Conversation, [StoredMessage]
    messageAdded = Signal(object)  # StoredMessage (user message or an empty streaming reply)
    replyText = Signal(str)
    replyReasoning = Signal(str)
    replyTokens = Signal(object)  # list[TokenSampled]; object, not list: no per-item conversion
    replyNotice = Signal(str)
    replyProgress = Signal(object)  # engine PrefillProgress of the streaming reply's prompt
    liveUsage = Signal(dict)  # while streaming; keys as engine.events.Usage plus "finish_reason"
    replyFinished = Signal(object)  # StoredMessage as stored
    replyFailed = Signal(str, object)  # message for a dialog, StoredMessage as stored
    busyChanged = Signal(bool)
    presetChanged = Signal(object)  # ResolvedPreset
    presetProblem = Signal(str)  # the model's preset could not be resolved (message for the user)
    storageProblem = Signal(str)  # a database write failed (e.g. disk full); "" once saving works
    replayStarted = Signal(int)  # message id
    replayFinished = Signal(int, object)  # message id, engine.types.ReplayReport
    replayFailed = Signal(int, str)  # message id, message for the user
    # The opened chat is bound to another model than the one in use (a remote connection's
    # model, or back to a local file): the window opens it (app/backends/router.py).
    backendRequested = Signal(str)  # model path, "remote://connection/model" for a remote one
    toolMessageAdded = Signal(object)  # StoredMessage (role tool), shown below the reply
    toolMessageChanged = Signal(object)  # StoredMessage (role tool): approval or result
    replyToolEvents = Signal(object)  # list of ToolCall* events of the streaming reply
    toolNotice = Signal(str)  # the round limit was reached (shown above the chat)
    chatToolsChanged = Signal(dict)  # the open chat's {"enabled": [...], "always": [...]}

    def __init__(
        self,
        controller: ChatBackend,  # EngineController, or BackendRouter for local + remote
        store: Store,
        settings: Settings,
        settings_file: SettingsFile,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.controller, self.store = controller, store
        self.settings, self.settings_file = settings, settings_file
        self.conversation_id: int | None = None
        self.branch: list[StoredMessage] = []  # the open chat's visible branch, no token records
        self.earlier = 0  # messages of the branch above `branch`, not loaded (OPEN_MESSAGES)
        self.json_mode = JsonMode.OFF
        self.json_schema: dict | None = None
        self.thinking = True  # for templates with a thinking switch (ModelInfo.thinking_switch)
        self.presets: PresetState | None = None
        self._project_preset: dict = {}  # the open chat's project's values in `presets.view`
        self._recorder: ReplyRecorder | None = None
        self._reply_message: StoredMessage | None = None
        self._started = 0.0
        self._first_token_at: float | None = None
        self._n_tokens = 0
        self._prompt_estimate = 0
        self._unsaved: list[ReplyRecorder] = []  # finished replies whose final save failed
        self._action_error: StoreWriteError | None = None
        self._write_failures = 0
        self._storage_problem = ""
        # issue 35 (app/features/compaction.py): a summary being written holds the engine like a
        # reply does; the compaction a request was built on goes into its reply's receipt
        self.compacting = False
        self.request_compaction = None  # app.store.StoredCompaction of the last build_request
        self._reply_compaction: dict | None = None  # engine.compaction.receipt_section
        # issue 34: a chat's document sources. The DocumentsController sets itself here (apply:
        # the request with the passages, replay_note); None: no documents feature.
        self.documents = None
        self._reply_sources: dict | None = None  # the streaming reply's receipt "sources"
        self._replay_receipt: dict | None = None

        controller.modelLoaded.connect(self._on_model_loaded)
        controller.replyText.connect(self._on_text)
        controller.replyReasoning.connect(self._on_reasoning)
        controller.replyTokens.connect(self._on_tokens)
        controller.replyNotice.connect(self.replyNotice)
        controller.replyProgress.connect(self._on_progress)
        controller.replyFinished.connect(self._on_finished)
        controller.replyErrored.connect(self._on_errored)
        controller.replayFinished.connect(self._on_replay_finished)
        controller.replayFailed.connect(self._on_replay_failed)
        self._replaying: int | None = None  # the message whose replay runs
        self._malformed: list[dict] = []  # the streaming reply's malformed tool calls
        # Tools (app/tool_runner.py drives the rounds; the registry holds the MCP servers).
        self.tool_registry = ToolRegistry(settings, settings_file, self)
        self.tools = ToolRunner(store, self.tool_registry, self)
        controller.replyToolEvents.connect(self._on_tool_events)
        self.tools.messageAdded.connect(self._on_tool_message_added)
        self.tools.messageChanged.connect(self._on_tool_message_changed)
        self.tools.roundDone.connect(self._continue_after_tools)
        self.tools.stopped.connect(lambda: self.busyChanged.emit(self.busy))
        self.tools.capNotice.connect(self.toolNotice)
        self.tool_registry.start_saved()

    # --- conversations --------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self._recorder is not None or self.tools.active or self.compacting

    def open_conversation(self, conversation_id: int) -> None:
        """Show a chat. Leaving a chat whose reply is streaming stops that reply (kept, marked
        cancelled): the view of the other chat has nowhere to draw it."""
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        if self.busy and conversation_id != self.conversation_id:
            self.cancel()
        self.conversation_id = conversation_id
        self._load_branch(OPEN_MESSAGES)
        self.conversationOpened.emit(conv, list(self.branch))
        self._restore_backend(conversation_id)
        self.refresh_chat_defaults()

    def _load_branch(self, count: int) -> None:
        """The last `count` messages of the open chat's branch into `branch`."""
        assert self.conversation_id is not None
        self.branch, self.earlier = self.store.branch_window(self.conversation_id, count)

    def load_earlier(self) -> bool:
        """Load OPEN_MESSAGES more of the open chat's earlier messages and show them. Not while
        a reply streams (its message is held in `branch`)."""
        if self.conversation_id is None or not self.earlier or self.busy:
            return False
        self._load_branch(len(self.branch) + OPEN_MESSAGES)
        self._redraw()
        return True

    def _redraw(self) -> None:
        """Show the in-memory branch again (after it changed shape: a new version, a switch)."""
        conv = self.store.conversation(self.conversation_id)
        if conv is not None:
            self.conversationOpened.emit(conv, list(self.branch))

    # --- which backend answers (per chat, remembered in the store) ------------------------------
    def _remember_backend(self, conversation_id: int) -> None:
        info = self.controller.model
        if info is None:
            return
        remote = parse_remote_path(info.path)
        if remote is not None:
            self.store.set_chat_backend(conversation_id, "remote", remote[0], remote[1])
        else:
            self.store.set_chat_backend(conversation_id, "local", None, info.path)

    def _restore_backend(self, conversation_id: int) -> None:
        """A chat last answered by another backend asks for it back; the history is the same
        whichever model answers, so this only changes who answers the next message."""
        binding = self.store.chat_backend(conversation_id)
        current = self.controller.model
        if binding is None:
            # never answered yet: its project's default model, when the project names one
            wanted = self.store.chat_defaults(conversation_id).model
            if wanted and (current is None or current.path != wanted):
                self.backendRequested.emit(wanted)
            return
        if binding.kind == "remote" and binding.connection_id:
            wanted = remote_model_path(binding.connection_id, binding.model)
            if current is None or current.path != wanted:
                self.backendRequested.emit(wanted)
            return
        if current is not None and current.architecture == REMOTE_ARCHITECTURE:
            # back to the local engine: the model it has open, else the chat's own file
            local = getattr(self.controller, "local", None)
            local_model = local.model if local is not None else None
            self.backendRequested.emit(local_model.path if local_model else binding.model)

    @_reports_write_errors
    def new_conversation(self, project_id: int | None = None) -> int:
        if self.busy:
            self.cancel()
        cid = self.store.create_conversation(project_id=project_id)
        self.conversationsChanged.emit()
        self.open_conversation(cid)
        return cid

    def ensure_conversation(self) -> int:
        if self.conversation_id is None or self.store.conversation(self.conversation_id) is None:
            existing = self.store.list_conversations()
            if existing:
                self.open_conversation(existing[0].id)
            else:
                self.new_conversation()
        return self.conversation_id

    @_reports_write_errors
    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title)
        self.conversationsChanged.emit()

    @_reports_write_errors
    def delete_conversation(self, conversation_id: int) -> None:
        if self.busy and conversation_id == self.conversation_id:
            self.cancel()
        self.store.delete_conversation(conversation_id)
        if conversation_id == self.conversation_id:
            self.conversation_id = None
        self.conversationsChanged.emit()
        self.ensure_conversation()

    @_reports_write_errors
    def set_system_prompt(self, text: str) -> None:
        self.store.set_system_prompt(self.ensure_conversation(), text)

    # --- personas (saved system prompts) --------------------------------------------------------
    def save_persona(self, name: str, prompt: str) -> bool:
        """Save `prompt` under `name` (replacing a persona of that name); False if either is
        empty."""
        name, prompt = name.strip(), prompt.strip()
        if not name or not prompt:
            return False
        self.settings.personas[name] = prompt
        self.settings_file.save(self.settings)
        return True

    def delete_persona(self, name: str) -> None:
        if self.settings.personas.pop(name, None) is not None:
            self.settings_file.save(self.settings)

    def use_persona(self, name: str) -> str:
        """Give the open chat the persona's system prompt ("" for none); returns the prompt."""
        prompt = self.settings.personas.get(name, "") if name else ""
        self.set_system_prompt(prompt)
        return prompt

    # --- generation -----------------------------------------------------------------------------
    @_reports_write_errors
    def send(self, text: str) -> bool:
        """Append a user message and start the reply. False when it cannot start now."""
        text = text.strip()
        if not text or self.busy or self.controller.model is None or self.controller.replaying:
            return False
        self.retry_saves()  # the earlier reply first, so the chat stays in order
        cid = self.ensure_conversation()
        first_message = not self.branch
        parent = self.branch[-1].id if self.branch else None
        user_id = self.store.add_message(cid, Role.USER, text, parent_id=parent)
        if first_message:
            # Name the chat after its first question so the sidebar is readable at a glance.
            self.store.rename_conversation(cid, _title_from(text))
            self.conversationsChanged.emit()
        user = self.store.message(user_id)
        self.branch.append(user)
        self.messageAdded.emit(user)
        self._start_reply(cid)
        return True

    @_reports_write_errors
    def regenerate_last(self) -> bool:
        """Answer the last user message of the branch again, as a new version of its reply."""
        if self.busy or self.controller.model is None or self.conversation_id is None:
            return False
        users = [m for m in self.branch if m.role == Role.USER]
        if not users:
            return False
        return self._reply_again_to(users[-1])

    @_reports_write_errors
    def regenerate_reply(self, message_id: int) -> bool:
        """A new version of this reply: the user message it answered is answered again, and the
        old reply (with the branch below it) stays as another version."""
        reply = self._on_branch(message_id)
        if reply is None or reply.role != Role.ASSISTANT or self.busy:
            return False
        if self.controller.model is None:
            return False
        earlier_users = [
            m for m in self.branch if m.role == Role.USER and m.position < reply.position
        ]
        if not earlier_users:
            return False
        return self._reply_again_to(earlier_users[-1])

    @_reports_write_errors
    def edit_and_regenerate(self, message_id: int, new_text: str) -> bool:
        """A new version of this user message with `new_text`, answered afresh; the old message
        and everything after it stay as the other version. Unchanged text answers it again."""
        message = self._on_branch(message_id)
        if (
            message is None
            or message.role != Role.USER
            or self.busy
            or self.controller.model is None
        ):
            return False
        text = new_text.strip() or message.content
        if self.controller.replaying:
            return False
        if text == message.content:
            return self._reply_again_to(message)
        cid = message.conversation_id
        edited_id = self.store.add_message(cid, Role.USER, text, parent_id=message.parent_id)
        self.branch = [m for m in self.branch if m.position < message.position]
        self.branch.append(self.store.message(edited_id))
        self._redraw()
        self._start_reply(cid)
        return True

    def _reply_again_to(self, user_message: StoredMessage) -> bool:
        if self.controller.replaying:
            return False
        self.branch = [m for m in self.branch if m.position <= user_message.position]
        self._redraw()  # the view drops the old reply; it stays in the store as a version
        self._start_reply(user_message.conversation_id)
        return True

    def _on_branch(self, message_id: int) -> StoredMessage | None:
        return next((m for m in self.branch if m.id == message_id), None)

    @_reports_write_errors
    def select_version(self, message_id: int) -> bool:
        """Show version `message_id` of its message; the chat below follows that version's
        branch. Not while a reply streams (it is on the current branch)."""
        if self.busy or self.conversation_id is None:
            return False
        message = self.store.message(message_id)
        if message is None or message.conversation_id != self.conversation_id:
            return False
        self.store.select_version(message_id)
        self._load_branch(max(len(self.branch), OPEN_MESSAGES))
        self._redraw()
        return True

    @_reports_write_errors
    def branch_from(self, message_id: int) -> int | None:
        """A new chat holding this chat's path up to `message_id`, opened. Not while a reply
        streams."""
        if self.busy or self._on_branch(message_id) is None:
            return None
        new_id = self.store.branch_conversation(message_id)
        if new_id is None:
            return None
        self.conversationsChanged.emit()
        self.open_conversation(new_id)
        return new_id

    def cancel(self) -> None:
        """Stop: the generation and any tool call running or waiting for approval."""
        documents = self.documents
        if self._recorder is not None and documents is not None and documents.cancel_retrieval():
            self._stop_before_request()  # its sources were being found: no request started
        self.controller.cancel()
        self.tools.cancel()

    # --- tools ----------------------------------------------------------------------------------
    def chat_tools(self) -> dict:
        """The open chat's tools record; "enabled" is its project's when it has none of its own
        (app/project_settings.py), "source" says which (SOURCE_*)."""
        if self.conversation_id is None:
            return {}
        chat = self.store.chat_tools(self.conversation_id)
        defaults = self.store.chat_defaults(self.conversation_id)
        project = defaults.project.name if defaults.project is not None else None
        return {
            **chat,
            "enabled": list(defaults.tools),
            "source": defaults.tools_source,
            "project": project,  # the chat's project's name (the Tools panel says where from)
        }

    @_reports_write_errors
    def set_tool_enabled(self, key: str, enabled: bool) -> None:
        """Offer the tool `key` (ToolRegistry keys) to the model in the open chat, or not."""
        cid = self.ensure_conversation()
        chat = self.store.chat_tools(cid)
        # from the tools the chat uses now: a chat of a project starts from the project's
        keys = set(self.store.chat_defaults(cid).tools)
        keys = keys | {key} if enabled else keys - {key}
        chat["enabled"] = sorted(keys)
        self.store.set_chat_tools(cid, chat)
        self.chatToolsChanged.emit(self.chat_tools())  # with where they come from: now the chat

    def answer_tool(self, message_id: int, decision: str) -> bool:
        """The user's answer to a tool call waiting for approval (engine.types.ToolApproval)."""
        return self.tools.answer(message_id, decision)

    def _on_tool_events(self, events: list) -> None:
        if self._recorder is None:
            return
        for event in events:
            if isinstance(event, ToolCallMalformed):
                self._malformed.append(
                    {
                        "id": event.id,
                        "name": event.name,
                        "text": event.text,
                        "problem": event.problem,
                    }
                )
        self.replyToolEvents.emit(events)

    def _on_tool_message_added(self, message: StoredMessage) -> None:
        if message.conversation_id == self.conversation_id:
            self.branch.append(message)
            self.toolMessageAdded.emit(message)

    def _on_tool_message_changed(self, message: StoredMessage) -> None:
        if message.conversation_id == self.conversation_id:
            self.branch = [message if m.id == message.id else m for m in self.branch]
            self.toolMessageChanged.emit(message)

    @_reports_write_errors
    def _continue_after_tools(self, conversation_id: int) -> None:
        """Every call of the round has its result: the model reads them and goes on."""
        if conversation_id != self.conversation_id or self.controller.model is None:
            self.busyChanged.emit(self.busy)
            return
        self._start_reply(conversation_id, continuing=True)

    # --- receipts and replay --------------------------------------------------------------------
    def receipt(self, message_id: int) -> dict | None:
        """How a reply was produced (engine/receipt.py), read from the store when asked."""
        return self.store.receipt(message_id)

    def replay(self, message_id: int) -> bool:
        """Re-run a reply from its receipt on the worker thread; replayFinished or replayFailed
        says how it compares. False when it cannot start (no receipt, busy, no model)."""
        if self.busy or self.controller.replaying or self.controller.model is None:
            return False
        if self.controller.model.architecture == REMOTE_ARCHITECTURE:
            self.replayFailed.emit(
                message_id,
                "Replay runs on the local engine: open this reply's model file, then replay.",
            )
            return False
        receipt = self.store.receipt(message_id)
        if receipt is None:
            self.replayFailed.emit(message_id, "This reply has no receipt to replay from.")
            return False
        self._replaying, self._replay_receipt = message_id, receipt
        self.controller.replay(receipt, self.store.tokens(message_id))
        self.replayStarted.emit(message_id)
        return True

    def _on_replay_finished(self, report) -> None:
        message_id, self._replaying = self._replaying, None
        note = self._summary_since(self._replay_receipt)
        if note is not None:  # the receipt's prompt ids hold the summary as it was sent
            report = dataclasses.replace(report, differences=(*report.differences, note))
        sources = self.documents.replay_note(self._replay_receipt) if self.documents else None
        if sources is not None:  # likewise the passages: changed documents are named
            report = dataclasses.replace(report, differences=(*report.differences, sources))
        if message_id is not None:
            self.replayFinished.emit(message_id, report)

    def _summary_since(self, receipt: dict | None) -> str | None:
        """Whether the summary a reply was built on has been edited or restored away since."""
        section = (receipt or {}).get("compaction")
        if not isinstance(section, dict):
            return None
        compaction = self.store.compaction(int(section.get("compaction_id") or 0))
        return edited_note(
            section, compaction.summary if compaction and compaction.active else None
        )

    def compaction_on(self, conversation_id: int, branch: list[StoredMessage]):
        """The chat's active compaction when every message it covers is on `branch` (another
        version of an early message leaves it aside), else None."""
        compaction = self.store.active_compaction(conversation_id)
        if compaction is None or not set(compaction.covered) <= {m.id for m in branch}:
            return None
        return compaction

    def _on_replay_failed(self, text: str) -> None:
        message_id, self._replaying = self._replaying, None
        if message_id is not None:
            self.replayFailed.emit(message_id, text)

    def build_request(self, conversation_id: int) -> GenerationRequest:
        # the chat's own system prompt, else its project's (app/project_settings.py)
        system_prompt = self.store.chat_defaults(conversation_id).system_prompt
        messages = []
        if system_prompt:
            messages.append({"role": Role.SYSTEM, "content": system_prompt})
        unsaved = {r.message_id: r for r in self._unsaved}
        branch = (
            self.branch
            if conversation_id == self.conversation_id and not self.earlier
            else self.store.branch(conversation_id)  # the whole history, loaded or not
        )
        if self.plain_completion:
            return self._completion_request(branch)
        self.request_compaction = compaction = self.compaction_on(conversation_id, branch)
        if compaction is not None:  # the summary stands in for the messages it covers
            branch = [m for m in branch if m.id not in set(compaction.covered)]
        for m in branch:
            if m.id in unsaved:  # its final save failed: the copy in memory is the reply
                m = unsaved[m.id].in_memory(m)
            if m.role == Role.TOOL and m.tool:
                # A result for every call, also one the app never finished (closed meanwhile).
                text = m.content or "The tool call did not finish."
                messages.append(
                    {"role": Role.TOOL, "tool_call_id": m.tool.get("tool_call_id"), "content": text}
                )
            elif m.role == Role.ASSISTANT and m.tool_calls and m.status != MessageStatus.STREAMING:
                messages.append(
                    {
                        "role": Role.ASSISTANT,
                        "content": m.content,  # "" not None: ChatML templates concatenate it
                        "tool_calls": m.tool_calls,
                    }
                )
            elif (
                m.role in (Role.USER, Role.ASSISTANT)
                and m.status != MessageStatus.STREAMING
                and (m.content or m.role == Role.USER)
            ):
                messages.append({"role": m.role, "content": m.content})
        if compaction is not None:
            messages = with_summary_note(messages, compaction.summary, len(compaction.covered))
        tools, tool_choice = self.tools.request_tools(conversation_id)
        presets = self.presets
        return GenerationRequest(
            messages=tuple(messages),
            overrides=self._request_overrides(),
            saved_preset=dict(presets.saved) if presets and presets.saved else None,
            json_mode=self.json_mode,
            json_schema=self.json_schema if self.json_mode == JsonMode.SCHEMA else None,
            top_logprobs=TOP_LOGPROBS,
            enable_thinking=self.thinking if self._has_thinking_switch() else None,
            tools=tools,
            tool_choice=tool_choice,
        )

    # --- plain completion (base models) ---------------------------------------------------------
    @property
    def plain_completion(self) -> bool:
        """Whether Send continues the typed text as it is, without a chat template: for a base
        model (ModelInfo.base_model) the user switched to it, remembered per model file."""
        info = self.controller.model
        return bool(
            info is not None and info.base_model and info.path in self.settings.completion_models
        )

    def set_plain_completion(self, on: bool) -> None:
        """Plain completion on or off for the loaded base model (and remembered for its file)."""
        info = self.controller.model
        if info is None or not info.base_model:
            return
        models = [p for p in self.settings.completion_models if p != info.path]
        self.settings.completion_models = [*models, info.path] if on else models
        self.settings_file.save(self.settings)

    def _completion_request(self, branch: list[StoredMessage]) -> GenerationRequest:
        """A base model continues the text of the message being answered, as it is: no chat
        template, no system prompt, no earlier turns (it was never taught turns), no tools."""
        users = [m for m in branch if m.role == Role.USER]
        presets = self.presets
        return GenerationRequest(
            prompt=users[-1].content if users else "",
            overrides=self._request_overrides(),
            saved_preset=dict(presets.saved) if presets and presets.saved else None,
            json_mode=self.json_mode,
            json_schema=self.json_schema if self.json_mode == JsonMode.SCHEMA else None,
            top_logprobs=TOP_LOGPROBS,
        )

    def _has_thinking_switch(self) -> bool:
        info = self.controller.model
        return bool(info is not None and info.thinking_switch)

    def set_thinking(self, on: bool) -> None:
        """Reasoning on or off for the next replies (templates that read enable_thinking)."""
        self.thinking = bool(on)

    def _start_reply(self, cid: int, continuing: bool = False) -> None:
        if not continuing:
            self.tools.begin_turn()
        self._malformed = []
        request = self.build_request(cid)
        self._reply_sources = None
        built_on = self.request_compaction if request.messages is not None else None
        self._reply_compaction = (
            None
            if built_on is None
            else receipt_section(built_on.id, built_on.covered, built_on.summary)
        )
        parent = self.branch[-1].id if self.branch else None
        reply_id = self.store.begin_reply(cid, json_mode=self.json_mode, parent_id=parent)
        self._recorder = ReplyRecorder(self.store, reply_id)
        self._remember_backend(cid)
        self._reply_message = self.store.message(reply_id)
        self.branch.append(self._reply_message)
        self._started, self._first_token_at, self._n_tokens = time.perf_counter(), None, 0
        self._prompt_estimate = self._estimate_prompt_tokens(cid, request)
        self.messageAdded.emit(self._reply_message)
        if not continuing:
            self.busyChanged.emit(True)
        if self.documents is None:
            self.controller.generate(request)
            return
        # issue 34: the chat's sources go into the request first. Finding them embeds the
        # question (a forward pass), so it runs on a thread while the reply row is open already;
        # Stop meanwhile ends the reply (cancel).
        self.documents.apply(
            cid, request, continuing, functools.partial(self._generate_with_sources, cid, reply_id)
        )

    def _generate_with_sources(
        self, cid: int, reply_id: int, request: GenerationRequest, sources: dict | None
    ) -> None:
        if self._recorder is None or self._recorder.message_id != reply_id:
            return  # the reply ended (Stop, the chat left) while its sources were found
        self._reply_sources = sources
        self._prompt_estimate = self._estimate_prompt_tokens(cid, request)
        self.controller.generate(request)

    def _stop_before_request(self) -> None:
        """End the open reply as cancelled when no request was started for it: the same
        Finished the engine gives for a Stop before its prompt was read, through the same path,
        so the reply is saved as cancelled and the queue and busy state follow as after any Stop."""
        info = self.controller.model
        nothing = Usage.nothing_read(info.n_ctx if info is not None else 0)
        self._on_finished(Finished(finish_reason=FINISH_CANCELLED, usage=nothing, text=""))

    def _estimate_prompt_tokens(self, cid: int, request: GenerationRequest) -> int:
        """For the live context bar until the engine reports the exact count: the last reply's
        exact context use plus ~4 characters per token for what was added since (+ template)."""
        if request.messages is None:  # a plain completion: the typed text and BOS
            return len(request.prompt or "") // 4 + 1
        replies = [
            m
            for m in self.branch
            if m.role == Role.ASSISTANT and m.usage and "context_used" in m.usage
        ]
        if replies:
            last = replies[-1]
            added = (request.messages[-1].get("content") or "") if request.messages else ""
            return int(last.usage["context_used"]) + len(added) // 4 + 8
        return sum(len(m.get("content") or "") // 4 + 8 for m in request.messages)

    def tick(self) -> None:
        """Called on every repaint tick while streaming: durability save + live usage."""
        if self._recorder is None:
            return
        self._recorder.maybe_save()
        self._note_storage()
        self.liveUsage.emit(self.live_usage())

    def retry_saves(self) -> bool:
        """Save what a failed write left in memory (a timer calls this while a problem lasts;
        sending calls it too). True when nothing is left unsaved."""
        had_unsaved = bool(self._unsaved)
        self._unsaved = [r for r in self._unsaved if not r.retry()]
        if had_unsaved and not self._unsaved:
            self._action_error = None  # the writes went through: there is space again
        if self._recorder is not None:
            self._recorder.maybe_save()
        self._note_storage()
        return not self._unsaved

    def _note_storage(self) -> None:
        errors = [r.save_error for r in self._unsaved]
        if self._recorder is not None:
            errors.append(self._recorder.save_error)
        errors.append(self._action_error)
        error = next((e for e in errors if e is not None), None)
        problem = describe_write_error(error) if error is not None else ""
        if problem != self._storage_problem:
            self._storage_problem = problem
            self.storageProblem.emit(problem)

    def live_usage(self) -> dict:
        now = time.perf_counter()
        n = self._n_tokens
        first = self._first_token_at
        decode_s = (now - first) if first is not None else 0.0
        info = self.controller.model
        return {
            "prompt_tokens": None,
            "completion_tokens": n,
            "cached_tokens": None,
            "ttft_ms": (first - self._started) * 1000 if first is not None else None,
            "prefill_ms": None,
            "prompt_tok_s": None,
            "decode_tok_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else None,
            "context_used": self._prompt_estimate + n,
            "context_limit": info.n_ctx if info else 0,
            "finish_reason": "generating…",
            "measured_over_network": bool(info and info.architecture == REMOTE_ARCHITECTURE),
        }

    # --- controller callbacks -------------------------------------------------------------------
    def _on_model_loaded(self, info: ModelInfo) -> None:
        resolve = self._resolve_preset

        saved = self.settings.presets.get(info.path)
        self.presets = None
        try:
            self.presets = PresetState(resolve, saved)
        except EngineError as exc:
            if saved:
                # A saved preset the engine no longer accepts must not block the model.
                self.presetProblem.emit(f"Your saved preset for this model was not used: {exc}")
                try:
                    self.presets = PresetState(resolve, None)
                except EngineError as exc2:
                    self.presetProblem.emit(str(exc2))
            else:
                # e.g. a malformed generation_config.json beside the model (PresetFileError)
                self.presetProblem.emit(str(exc))
        if self.presets is not None:
            self.presetChanged.emit(self.presets.view)

    def _on_text(self, text: str) -> None:
        if self._recorder is not None:
            if self._first_token_at is None:  # a server that reports no tokens (no logprobs)
                self._first_token_at = time.perf_counter()
            self._recorder.add_text(text)
            self.replyText.emit(text)

    def _on_progress(self, progress) -> None:
        if self._recorder is not None:  # the open chat's reply, not a replay's
            self.replyProgress.emit(progress)

    def _on_reasoning(self, text: str) -> None:
        if self._recorder is not None:
            self._recorder.add_reasoning(text)
            self.replyReasoning.emit(text)

    def _on_tokens(self, tokens: list) -> None:
        if self._recorder is None:
            return
        if self._first_token_at is None:
            self._first_token_at = time.perf_counter()
        self._n_tokens += len(tokens)
        self._recorder.add_tokens(tokens)
        self.replyTokens.emit(tokens)

    def _on_finished(self, finished: Finished) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return
        if self._reply_compaction is not None and finished.receipt is not None:
            finished = dataclasses.replace(
                finished, receipt=with_compaction(finished.receipt, self._reply_compaction)
            )
        if self._reply_sources is not None and finished.receipt is not None:
            finished = dataclasses.replace(
                finished, receipt=with_sources(finished.receipt, self._reply_sources)
            )
        status = recorder.finish(finished)
        calls = list(finished.tool_calls) if status == MessageStatus.COMPLETE else []
        dropped = 0
        if self.tools.tools_withdrawn:  # the request offered no tools: a call now is not run
            dropped, calls = len(calls), []
        malformed, self._malformed = self._malformed, []
        tool: dict = {"tool_calls": [c.to_openai() for c in calls], "malformed": malformed}
        if status == MessageStatus.COMPLETE and not (calls or malformed or finished.text.strip()):
            # an answer with no text says why, instead of an empty card (app/tool_runner.py)
            tool["empty_reason"] = self.tools.empty_reply_note(finished.finish_reason, dropped)
        if calls or malformed or "empty_reason" in tool:
            try:
                self.store.set_tool(recorder.message_id, tool)
            except StoreWriteError as exc:
                self._action_error = exc
                calls = []  # a round the store cannot hold would lose its pairing
        stored = self._stored_reply(recorder)
        if stored is not None and calls:
            self.tools.run_calls(stored.conversation_id, stored, calls)
        self.busyChanged.emit(self.busy)
        if stored is None:
            return  # its chat was deleted while it streamed
        if status == MessageStatus.ERROR:
            self.replyFailed.emit(finished.error or "Generation failed.", stored)
        else:
            self.replyFinished.emit(stored)

    def _on_errored(self, message: str) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return
        recorder.fail(message)
        stored = self._stored_reply(recorder)  # None if its chat was deleted
        self.busyChanged.emit(self.busy)
        self.replyFailed.emit(message, stored)

    def _stored_reply(self, recorder: ReplyRecorder) -> StoredMessage | None:
        """The finished reply as stored, or as held in memory when its save failed."""
        stored = self.store.message(recorder.message_id)
        if stored is not None and recorder.pending:
            self._unsaved.append(recorder)
            stored = recorder.in_memory(stored)
        if stored is not None:
            kept = dataclasses.replace(stored, tokens=[])  # the branch holds no token records
            self.branch = [kept if m.id == stored.id else m for m in self.branch]
        self._note_storage()
        return stored

    # --- presets --------------------------------------------------------------------------------
    def _resolve_preset(self, saved: dict | None, overrides: dict | None):
        """The model's saved preset, the open chat's project's values, then `overrides`."""
        defaults = (
            self.store.chat_defaults(self.conversation_id)
            if self.conversation_id is not None
            else ChatDefaults()
        )
        view, self._project_preset = resolve_with_project(
            self.controller.resolve_preset, saved, overrides, defaults
        )
        return view

    def _request_overrides(self) -> dict:
        """A request's overrides: the project's values under the ones typed in the panel."""
        typed = self.presets.overrides if self.presets else {}
        return {**self._project_preset, **typed}

    def refresh_chat_defaults(self) -> None:
        """After the open chat's project changed (moved, edited): tools and preset again."""
        self.chatToolsChanged.emit(self.chat_tools())
        if self.presets is None:
            return
        try:
            self.presets.view = self._resolve_preset(
                self.presets.saved or None, self.presets.overrides or None
            )
        except EngineError as exc:
            self.presetProblem.emit(str(exc))
            return
        self.presetChanged.emit(self.presets.view)

    def set_preset_value(self, field: str, value) -> str | None:
        if self.presets is None:
            return "Load a model first."
        error = self.presets.try_set(field, value)
        if error is None:
            self.presetChanged.emit(self.presets.view)
        return error

    def save_preset(self) -> None:
        if self.presets is None or self.controller.model is None:
            return
        self.settings.presets[self.controller.model.path] = self.presets.save()
        self.settings_file.save(self.settings)
        self.presetChanged.emit(self.presets.view)

    def reset_preset(self) -> None:
        if self.presets is None or self.controller.model is None:
            return
        self.presets.reset()
        self.settings.presets.pop(self.controller.model.path, None)
        self.settings_file.save(self.settings)
        self.presetChanged.emit(self.presets.view)

    # --- JSON mode ------------------------------------------------------------------------------
    def set_json_mode(self, mode: str, schema: dict | None = None) -> None:
        self.json_mode = mode
        if schema is not None:
            self.json_schema = schema
            self.settings.json_schema = json.dumps(schema, indent=2)


def _title_from(text: str, limit: int = 48) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
