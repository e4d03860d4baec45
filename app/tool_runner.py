"""ToolRunner: what happens between a reply that ends on tool calls and the next generation.

The session hands it a finished reply's calls (`run_calls`). Each call becomes a role "tool"
message in the conversation (a child of the one before, so the tree stays a line), shown at once
as pending. The calls then run one after another:

- a built-in tool (app/tools/builtin.py) runs without asking, except fetch_url, which reaches the
  network and so asks like an MCP tool;
- an MCP tool waits for the user (`answer`: Allow once, Always for this tool in this chat, Deny)
  unless the chat already allows it always. Deny answers the model with "the user denied".

A call runs on its own thread (an MCP call can take up to its timeout); the outcome comes back
over a queued signal, is stored on the tool message (`Store.update_tool_message`), and the next
call starts. When every call has its answer `roundDone` asks the session to generate again.
`cancel` (Stop) cancels the running MCP call through its token and marks the calls left as
cancelled, so the history stays paired (every tool_call_id has its tool message).

Rounds are counted per user turn: after `max_rounds` the next request offers no tools
(tool_choice "none"), so a model that keeps calling must answer in text; `capNotice` says so.

A call identical to an earlier one of the same user turn (same tool, same arguments as canonical
JSON) is not run again: small models that do not read a result call the same tool over and over
(one called the calculator 5 more times after its result, issue 31). Its message gets the
earlier call's result with a note saying so (approval "repeated"), and after `max_repeats` such
calls the next request offers no tools either, with a notice naming the call. An answer that then ends with no
text gets a line saying why (`empty_reply_note`), instead of an empty card.
"""

from __future__ import annotations

import json
import threading

from PySide6.QtCore import QObject, Signal

from app.finish_reasons import FINISH_WORDS
from app.store import Store, StoredMessage
from app.tool_registry import OfferedTool, ToolRegistry
from app.tools.builtin import ToolContext, builtin_needs_approval, run_builtin
from app.tools.errors import McpServerCrashed, ToolError, UnknownToolError
from app.tools.mcp_client import ToolCancelled
from app.tools.result import ToolResult
from engine.cancel import CancelToken
from engine.types import MessageStatus, Role, ToolApproval, ToolChoice

DEFAULT_MAX_ROUNDS = 8
DEFAULT_MAX_REPEATS = 2  # identical calls in one user turn before the tools are withdrawn
REPEATED = "repeated"  # the approval of a call that was not run: it repeats an earlier one
DENIED_TEXT = "The user denied this tool call. Do not call it again; answer without it."
CANCELLED_TEXT = "The user stopped this tool call before it finished."
DECISIONS = (ToolApproval.ONCE, ToolApproval.ALWAYS, ToolApproval.DENIED)


class ToolRunner(QObject):
    messageAdded = Signal(object)  # StoredMessage: a new role "tool" message
    messageChanged = Signal(object)  # StoredMessage: its approval or result changed
    approvalNeeded = Signal(object)  # StoredMessage waiting for Allow / Always / Deny
    roundDone = Signal(int)  # conversation id: every call answered, generate again
    stopped = Signal()  # cancelled: nothing more will run for this turn
    capNotice = Signal(str)  # the round limit was reached
    _outcome = Signal(int, object)  # message id, ToolResult | ToolError (from a call's thread)

    def __init__(self, store: Store, registry: ToolRegistry, parent: QObject | None = None):
        super().__init__(parent)
        self.store, self.registry = store, registry
        self.max_rounds = DEFAULT_MAX_ROUNDS
        # The first round's tool_choice. "auto" lets the model decide every round; "required" or
        # a named function forces one call (decoded under the tool's grammar, so it is always
        # valid) and the rounds after it answer from the result (tool_choice "none").
        self.first_choice: object = ToolChoice.AUTO
        self.max_repeats = DEFAULT_MAX_REPEATS
        self.rounds = 0  # tool rounds run in the current user turn
        self.calls_in_turn = 0  # calls the model made in the current user turn, repeats included
        self.repeats = 0  # of those, calls identical to an earlier one (not run)
        self._first_calls: dict[str, tuple[int, int]] = {}  # call_key -> (number, message id)
        self._repeated_names: list[str] = []
        self._queue: list[int] = []  # tool message ids still to run, in order
        self._running: int | None = None  # the message whose call runs now
        self._waiting: int | None = None  # the message waiting for the user's answer
        self._offered: dict[str, OfferedTool] = {}
        self._cid: int | None = None
        self._cancel = CancelToken()
        self._outcome.connect(self._on_outcome)

    @property
    def active(self) -> bool:
        return bool(self._queue) or self._running is not None or self._waiting is not None

    # --- requests --------------------------------------------------------------------------------
    def begin_turn(self) -> None:
        self.rounds = self.calls_in_turn = self.repeats = 0
        self._first_calls = {}
        self._repeated_names = []

    @property
    def tools_withdrawn(self) -> bool:
        """The current turn's next request offers no tools: a call the model makes anyway is not
        run (the round limit, or too many repeated calls)."""
        return self.rounds >= self.max_rounds or self.repeats >= self.max_repeats

    def request_tools(self, conversation_id: int) -> tuple[list[dict] | None, object]:
        """(tools, tool_choice) for the next request of this chat: its enabled tools that can
        run now, with "none" once the round limit is reached."""
        enabled = self.store.chat_defaults(conversation_id).tools  # its own, else its project's
        offered = self.registry.offered(enabled)
        if not offered:
            return None, ToolChoice.AUTO
        if self.repeats >= self.max_repeats:
            names = ", ".join(dict.fromkeys(self._repeated_names))
            self.capNotice.emit(
                f"The model repeated the same tool call ({names}) {self.repeats} times in this "
                "turn; the repeats were not run again. It now has to answer without tools."
            )
            return [t.schema for t in offered], ToolChoice.NONE
        if self.rounds >= self.max_rounds:
            self.capNotice.emit(
                f"The model called tools {self.rounds} times in a row (limit "
                f"{self.max_rounds}); it now has to answer without them."
            )
            return [t.schema for t in offered], ToolChoice.NONE
        if self.first_choice != ToolChoice.AUTO:
            choice = self.first_choice if self.rounds == 0 else ToolChoice.NONE
            return [t.schema for t in offered], choice
        return [t.schema for t in offered], ToolChoice.AUTO

    # --- a round ---------------------------------------------------------------------------------
    def run_calls(self, conversation_id: int, reply: StoredMessage, calls) -> None:
        """Add a tool message per call after `reply` and start running them."""
        self._cid = conversation_id
        self._cancel = CancelToken()
        self._offered = {
            t.name: t
            for t in self.registry.offered(
                self.store.chat_tools(conversation_id).get("enabled") or []
            )
        }
        always = set(self.store.chat_tools(conversation_id).get("always") or [])
        parent = reply.id
        self._queue = []
        for call in calls:
            self.calls_in_turn += 1
            first = self._first_calls.get(call_key(call.name, call.arguments))
            offered = self._offered.get(call.name)
            if first is not None:
                approval = REPEATED  # never asked for nor run: it gets the first call's result
                self.repeats += 1
                self._repeated_names.append(call.name)
            elif offered is None or (
                offered.server is None and not builtin_needs_approval(offered.name)
            ):
                approval = ToolApproval.AUTOMATIC
            elif offered.key in always:
                approval = ToolApproval.ALWAYS
            else:
                approval = ToolApproval.PENDING
            tool = {
                "tool_call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "key": offered.key if offered else None,
                "server": offered.server if offered else None,
                "approval": approval,
                "is_error": False,
                "error": None,
                "number": self.calls_in_turn,  # its place among the turn's calls, from 1
            }
            if first is not None:
                tool["repeat_of"], tool["repeat_of_id"] = first
            message_id = self.store.add_message(
                conversation_id,
                Role.TOOL,
                "",
                status=MessageStatus.STREAMING,
                parent_id=parent,
                tool=tool,
            )
            parent = message_id
            if first is None:
                self._first_calls[call_key(call.name, call.arguments)] = (
                    self.calls_in_turn,
                    message_id,
                )
            self._queue.append(message_id)
            self.messageAdded.emit(self.store.message(message_id))
        self.rounds += 1
        self._next()

    def answer(self, message_id: int, decision: str) -> bool:
        """The user's answer for the call waiting on `message_id`; False if none waits there."""
        if message_id != self._waiting or decision not in DECISIONS:
            return False
        self._waiting = None
        message = self.store.message(message_id)
        tool = dict(message.tool or {})
        tool["approval"] = decision
        if decision == ToolApproval.DENIED:
            tool["is_error"] = True
            self._finish(message_id, DENIED_TEXT, MessageStatus.COMPLETE, tool)
            self._next()
            return True
        if decision == ToolApproval.ALWAYS and tool.get("key"):
            chat = self.store.chat_tools(message.conversation_id)
            chat["always"] = sorted(set(chat.get("always") or []) | {tool["key"]})
            self.store.set_chat_tools(message.conversation_id, chat)
        self.store.set_tool(message_id, tool)
        self.messageChanged.emit(self.store.message(message_id))
        self._execute(message_id, tool)
        return True

    def cancel(self) -> None:
        """Stop: cancel the running call and answer every call left as cancelled."""
        if not self.active:
            return
        self._cancel.cancel()
        left = ([self._running] if self._running is not None else []) + (
            [self._waiting] if self._waiting is not None else []
        )
        left += self._queue
        self._queue, self._running, self._waiting = [], None, None
        for message_id in left:
            message = self.store.message(message_id)
            if message is None:
                continue
            tool = dict(message.tool or {})
            if tool.get("approval") == ToolApproval.PENDING:
                tool["approval"] = ToolApproval.CANCELLED
            tool["is_error"], tool["error"] = True, "ToolCancelled"
            self._finish(message_id, CANCELLED_TEXT, MessageStatus.CANCELLED, tool)
        self.stopped.emit()

    # --- inside a round --------------------------------------------------------------------------
    def _next(self) -> None:
        while True:  # a loop, not recursion: a reply may hold many repeated calls
            if not self._queue:
                cid, self._cid = self._cid, None
                if cid is not None:
                    self.roundDone.emit(cid)
                return
            message_id = self._queue.pop(0)
            message = self.store.message(message_id)
            if message is None:  # its chat was deleted meanwhile
                self._queue = []
                self.stopped.emit()
                return
            tool = dict(message.tool or {})
            if tool.get("approval") == REPEATED:
                self._answer_repeat(message_id, tool)
                continue
            if tool.get("approval") == ToolApproval.PENDING:
                self._waiting = message_id
                self.approvalNeeded.emit(message)
                return
            self._execute(message_id, tool)
            return

    def _answer_repeat(self, message_id: int, tool: dict) -> None:
        """The earlier identical call's result (it ran before this one: calls run in order), with
        a note, so the model reads that it already has the answer."""
        first = self.store.message(tool.get("repeat_of_id") or -1)
        earlier = first.content if first is not None and first.content else "(no result)"
        tool["is_error"] = bool(first is not None and (first.tool or {}).get("is_error"))
        note = (
            f"[Not run again: this call is the same as call #{tool.get('repeat_of')} of this "
            "turn, with the same arguments, and the result above is that call's. Answer the "
            "user with it instead of calling again.]"
        )
        self._finish(message_id, f"{earlier}\n\n{note}", MessageStatus.COMPLETE, tool)

    def _execute(self, message_id: int, tool: dict) -> None:
        self._running = message_id
        name, arguments = tool.get("name", ""), tool.get("arguments") or {}
        offered = self._offered.get(name)
        token = self._cancel
        server = None
        problem: ToolError | None = None
        if offered is None:
            problem = UnknownToolError(f"No tool named {name!r} is enabled in this chat.")
        elif offered.server is not None:
            state = self.registry.servers.get(offered.server)
            server = state.server if state is not None else None
            if server is None:
                why = f": {state.message}" if state is not None and state.message else ""
                problem = McpServerCrashed(f"MCP server {offered.server!r} is not running{why}")

        context = ToolContext(
            allow_private_addresses=self.registry.settings.fetch_allow_private, cancel=token
        )

        def run() -> None:
            outcome: ToolResult | ToolError
            try:
                if problem is not None:
                    outcome = problem
                elif server is None:
                    outcome = run_builtin(name, arguments, context)
                else:
                    outcome = server.call_tool(
                        name, arguments, timeout=self.registry.call_timeout_s, cancel=token
                    )
            except ToolError as exc:
                outcome = exc
            except Exception as exc:
                outcome = ToolError(f"The tool {name!r} failed: {type(exc).__name__}: {exc}")
            self._outcome.emit(message_id, outcome)

        threading.Thread(target=run, name=f"tool-{name}", daemon=True).start()

    def _on_outcome(self, message_id: int, outcome) -> None:
        if message_id != self._running:
            return  # cancelled meanwhile: its message already says so
        self._running = None
        message = self.store.message(message_id)
        if message is None:
            self._queue = []
            self.stopped.emit()
            return
        tool = dict(message.tool or {})
        if isinstance(outcome, ToolResult):
            tool["is_error"], tool["error"] = outcome.is_error, None
            self._finish(message_id, outcome.text, MessageStatus.COMPLETE, tool)
        else:
            tool["is_error"], tool["error"] = True, type(outcome).__name__
            status = (
                MessageStatus.CANCELLED
                if isinstance(outcome, ToolCancelled)
                else MessageStatus.COMPLETE
            )
            self._finish(message_id, f"Error: {outcome}", status, tool)
            if isinstance(outcome, McpServerCrashed) and tool.get("server"):
                self.registry.mark_failed(tool["server"], str(outcome))
        self._next()

    def _finish(self, message_id: int, content: str, status: str, tool: dict) -> None:
        self.store.update_tool_message(message_id, content=content, status=status, tool=tool)
        self.messageChanged.emit(self.store.message(message_id))

    # --- an answer with no text ------------------------------------------------------------------
    def empty_reply_note(self, finish_reason: str, dropped_calls: int = 0) -> str:
        """Why a finished reply has no text, for the line under it: the finish reason, the tool
        calls of this turn, and why the tools were withdrawn when they were."""
        calls = self.calls_in_turn
        after = f" after {calls} tool call{'s' if calls != 1 else ''}" if calls else ""
        why = FINISH_WORDS.get(str(finish_reason), "")
        note = (
            f"The model ended its turn without text{after} "
            f"(finish reason: {finish_reason}{' — ' + why if why else ''})."
        )
        if self.repeats >= self.max_repeats:
            note += (
                f" {self.repeats} of its calls repeated an earlier one, so the tools were "
                "withdrawn for this answer."
            )
        elif self.rounds >= self.max_rounds:
            note += f" It reached the limit of {self.max_rounds} tool rounds, so the tools were withdrawn."
        if dropped_calls:
            note += (
                f" It still called {dropped_calls} tool{'s' if dropped_calls != 1 else ''}, "
                "which did not run."
            )
        return note


def call_key(name: str, arguments) -> str:
    """A call's identity in a turn: the tool's name and its arguments as canonical JSON (key
    order and spacing do not make two calls different)."""
    return json.dumps(
        {"name": name, "arguments": arguments},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
