"""The message queue: Send while a reply streams queues the message instead of refusing it.

- Queued per chat, shown under the chat (app/views/pending_messages.py): editable, removable,
  reorderable.
- When a reply finishes (and any tool rounds it started are done), the first queued message of
  that chat is sent, and so on in order, one per reply.
- After a Stop or an error the queue waits and says so: the user stopped for a reason, and a
  message written for the interrupted answer may no longer fit. "Send now" resumes it. A chat
  left while its reply streamed (which stops the reply) waits the same way when reopened.
- Kept in the settings file (Settings.queued_messages: chat id -> texts), not in the chats
  database: a queued message is not yet part of the chat's tree (it has no parent or place until
  it is sent), so it has no row to live in, and the settings file is written atomically (temp
  file + replace) on every change. A queue read at start-up waits ("from the last session")
  until the user sends it: nothing goes to a model the user has not seen answer yet.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

from engine.types import MessageStatus

MAX_QUEUED = 50  # per chat; a 51st is refused with a message, not dropped silently
MAX_QUEUED_CHARS = 200_000  # one queued message; longer belongs in a document, not a queue

STOPPED = "the reply was stopped."
FAILED = "the reply failed."
FROM_LAST_SESSION = "they were queued in an earlier session."
LEFT_CHAT = "the reply stopped when you left this chat."
NOT_SENT = "the message could not be sent now (is a model loaded?)."


class QueueFullError(ValueError):
    """The queue of a chat has MAX_QUEUED messages already, or the message is too long."""


class MessageQueue(QObject):
    changed = Signal()  # the open chat's queue or its waiting reason changed
    refused = Signal(str)  # a message could not be queued: why, for the user

    def __init__(self, session, settings, settings_file, view, parent: QObject | None = None):
        super().__init__(parent)
        self.session, self.settings, self.settings_file = session, settings, settings_file
        self.view = view
        self._queues: dict[int, list[str]] = _read(settings.queued_messages)
        # chats whose queue waits, and why; every queue read from the settings file waits
        self._waiting: dict[int, str] = dict.fromkeys(self._queues, FROM_LAST_SESSION)
        self._outcome: str | None = None  # how the open chat's last reply ended
        self._reply_chat: int | None = None  # the chat whose reply streams
        session.busyChanged.connect(self._on_busy)
        session.replyFinished.connect(self._on_reply_finished)
        session.replyFailed.connect(self._on_reply_failed)
        session.conversationOpened.connect(lambda _conv, _messages: self._show())
        session.conversationsChanged.connect(self._forget_deleted_chats)
        view.editRequested.connect(self.edit)
        view.removeRequested.connect(self.remove)
        view.moveRequested.connect(self.move)
        view.sendNowRequested.connect(self.send_now)
        self._show()

    # --- the open chat's queue -------------------------------------------------------------------
    def pending(self, conversation_id: int | None = None) -> list[str]:
        cid = self.session.conversation_id if conversation_id is None else conversation_id
        return list(self._queues.get(cid, [])) if cid is not None else []

    def waiting_because(self, conversation_id: int | None = None) -> str | None:
        cid = self.session.conversation_id if conversation_id is None else conversation_id
        return self._waiting.get(cid) if cid is not None else None

    def add(self, text: str) -> bool:
        """Queue `text` for the open chat (Send while a reply streams). False, with `refused`
        emitted, when it cannot be queued; the caller keeps the text in the input then."""
        text = text.strip()
        if not text:
            return False
        cid = self.session.ensure_conversation()
        if cid is None:  # the store could not create the chat (session reported why)
            return False
        queue = self._queues.setdefault(cid, [])
        if len(queue) >= MAX_QUEUED:
            self.refused.emit(
                f"{MAX_QUEUED} messages are queued in this chat already; wait for the replies "
                "or remove some."
            )
            return False
        if len(text) > MAX_QUEUED_CHARS:
            self.refused.emit(
                f"This message has {len(text):,} characters; a queued message may have at most "
                f"{MAX_QUEUED_CHARS:,}. Send it when the reply has finished."
            )
            return False
        queue.append(text)
        self._save()
        self._show()
        return True

    def edit(self, index: int, text: str) -> None:
        queue = self._open_queue()
        if not 0 <= index < len(queue):
            return
        text = text.strip()
        if not text:  # emptied: the user no longer wants it
            self.remove(index)
            return
        queue[index] = text[:MAX_QUEUED_CHARS]
        self._save()
        self._show()

    def remove(self, index: int) -> None:
        queue = self._open_queue()
        if 0 <= index < len(queue):
            del queue[index]
            self._tidy(self.session.conversation_id)
            self._save()
            self._show()

    def move(self, index: int, delta: int) -> None:
        queue = self._open_queue()
        target = index + delta
        if 0 <= index < len(queue) and 0 <= target < len(queue):
            queue[index], queue[target] = queue[target], queue[index]
            self._save()
            self._show()

    def send_now(self) -> None:
        """Resume a waiting queue: send its first message now (or when the reply streaming now
        finishes)."""
        cid = self.session.conversation_id
        if cid is None:
            return
        self._waiting.pop(cid, None)
        if not self.session.busy:
            self._send_next(cid)
        self._show()

    # --- the reply's end -----------------------------------------------------------------------
    def _on_busy(self, busy: bool) -> None:
        if busy:
            self._outcome = None
            self._reply_chat = self.session.conversation_id
            return
        # ChatSession emits busyChanged(False) just before replyFinished / replyFailed: decide
        # once they have said how the reply ended.
        QTimer.singleShot(0, self._after_reply)

    def _on_reply_finished(self, stored) -> None:
        self._outcome = "stopped" if stored.status == MessageStatus.CANCELLED else "complete"

    def _on_reply_failed(self, _message: str, _stored) -> None:
        self._outcome = "failed"

    def _after_reply(self) -> None:
        if self.session.busy:  # a tool round or the next queued message already runs
            return
        cid, outcome = self._reply_chat, self._outcome
        if cid is None or not self._queues.get(cid) or cid in self._waiting:
            return
        if cid != self.session.conversation_id:
            self._waiting[cid] = LEFT_CHAT  # it was stopped by leaving the chat
        elif outcome == "complete":
            self._send_next(cid)
        else:  # stopped, failed, or tools stopped before a reply ended
            self._waiting[cid] = FAILED if outcome == "failed" else STOPPED
        self._show()

    def _send_next(self, cid: int) -> None:
        queue = self._queues.get(cid) or []
        if not queue or cid != self.session.conversation_id:
            return
        text = queue[0]
        if self.session.send(text):
            queue.pop(0)
            self._tidy(cid)
            self._save()
        else:
            self._waiting[cid] = NOT_SENT
        self._show()

    # --- bookkeeping -----------------------------------------------------------------------------
    def _open_queue(self) -> list[str]:
        cid = self.session.conversation_id
        return self._queues.get(cid, []) if cid is not None else []

    def _tidy(self, cid: int | None) -> None:
        if cid is not None and not self._queues.get(cid):
            self._queues.pop(cid, None)
            self._waiting.pop(cid, None)

    def _forget_deleted_chats(self) -> None:
        gone = [cid for cid in self._queues if self.session.store.conversation(cid) is None]
        for cid in gone:
            self._queues.pop(cid, None)
            self._waiting.pop(cid, None)
        if gone:
            self._save()
            self._show()

    def _save(self) -> None:
        self.settings.queued_messages = {str(cid): list(q) for cid, q in self._queues.items() if q}
        self.settings_file.save(self.settings)

    def _show(self) -> None:
        self.view.show_queue(self.pending(), self.waiting_because())
        self.changed.emit()


def _read(saved) -> dict[int, list[str]]:
    """Settings.queued_messages as the settings file holds it ({"12": ["text", ...]}), already
    validated by Settings.validated."""
    queues: dict[int, list[str]] = {}
    for key, texts in (saved or {}).items():
        try:
            cid = int(key)
        except (TypeError, ValueError):
            continue
        kept = [t for t in texts if isinstance(t, str) and t.strip()][:MAX_QUEUED]
        if kept:
            queues[cid] = kept
    return queues
