"""Visible, reversible compaction (issue 35): the wiring between the chat, the store and the engine.

After each reply (and when a chat opens) the open chat's exact context use, as the engine
reported it for the last reply, is compared with the room the prompt may take
(engine/compaction.py near_limit). Near the limit, Settings > "When a chat is too long" decides:

- drop_oldest: nothing here; the engine leaves the oldest turns out as before;
- offer (default): the offer under the chat, [Summarise] [Not now];
- auto: the summary is written without asking (it can still be cancelled).

The summary is an ordinary generation request on the engine's worker (the loaded model, greedy,
at most summary_max_tokens), streamed into the summary card with [Cancel]. Only a finished,
non-empty summary is stored (Store.add_compaction, one transaction); a cancel, an error, an
empty answer or a failed write leaves the store as it was and the card says why. While it is
written the session counts as busy, so nothing else is sent meanwhile.

The session builds every later request on the chat's active compaction (app/session.py
build_request) and records it in the reply's receipt; this controller only shows it: the card
at the top of the chat, the covered messages hidden (or greyed when "Show originals" is on),
an edit saved as the new summary, "Restore originals" turning the compaction off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QTimer

from app.store import StoredCompaction, StoreWriteError
from app.views.chat_view import ChatView
from app.views.compaction_widgets import CompactionOffer, SummaryCard
from engine.compaction import (
    ChatItem,
    choose_covered,
    near_limit,
    summary_max_tokens,
    summary_note,
    summary_request_messages,
)
from engine.events import FINISH_CANCELLED, Finished
from engine.types import GenerationRequest, MessageStatus, Role

UNCHANGED = "The chat is unchanged: no summary was saved and every message is still sent."


@dataclass
class _Job:
    """The summary being written: for which chat, standing in for which messages."""

    conversation_id: int
    covered: tuple[int, ...]
    text: list[str] = field(default_factory=list)


class CompactionController(QObject):
    def __init__(self, session, chat_view: ChatView, offer: CompactionOffer, parent=None):
        super().__init__(parent)
        self.session, self.store, self.chat_view, self.offer = (
            session,
            session.store,
            chat_view,
            offer,
        )
        self.card = SummaryCard()
        chat_view.top_slot.addWidget(self.card)
        self._job: _Job | None = None
        self._declined: set[int] = set()  # chats whose offer got "Not now" (this run)
        self._originals_shown = False

        session.conversationOpened.connect(lambda _conv, _messages: self.refresh())
        session.replyFinished.connect(lambda _stored: self.check())
        # a reply started (typed, or sent from the queue): the offer waits for its count
        session.busyChanged.connect(lambda busy: busy and self.offer.setVisible(False))
        engine = session.controller
        engine.replyText.connect(self._on_text)
        engine.replyFinished.connect(self._on_finished)
        engine.replyErrored.connect(self._on_errored)
        offer.summariseRequested.connect(self.start)
        offer.dismissed.connect(self.decline)
        self.card.cancelRequested.connect(self.cancel)
        self.card.saveRequested.connect(self.save_edit)
        self.card.originalsToggled.connect(self.show_originals)
        self.card.restoreRequested.connect(self.restore)
        self.card.closeRequested.connect(self.refresh)

    @property
    def running(self) -> bool:
        return self._job is not None

    # --- when to offer ------------------------------------------------------------------------
    def check(self) -> None:
        """Offer (or, by setting, start) a summary when the open chat is near the limit."""
        mode = self.session.settings.long_chat
        cid = self.session.conversation_id
        info = self.session.controller.model
        if (
            mode == "drop_oldest"
            or cid is None
            or info is None
            or self._job is not None
            or self.session.busy
            or (mode == "offer" and cid in self._declined)
        ):
            self.offer.setVisible(False)
            return
        used = self._context_used()
        if (
            used is None
            or not near_limit(used, info.n_ctx, self._max_new_tokens())
            or not self._plan(cid, used)[0]  # reads the whole branch: only when near
        ):
            self.offer.setVisible(False)
            return
        if mode == "auto":
            # after the reply's Finished has reached every slot: started from inside that
            # emission, the summary's job would take the reply's Finished for its own
            QTimer.singleShot(0, self.start)
        else:
            self.offer.show_offer(used, info.n_ctx)

    def decline(self) -> None:
        if self.session.conversation_id is not None:
            self._declined.add(self.session.conversation_id)
        self.offer.setVisible(False)

    def _context_used(self) -> int | None:
        """The exact tokens of the open chat's last prompt plus its reply (the next prompt
        holds them all), as the engine reported them; None when unknown, or when that reply
        predates the chat's summary (its count is of the prompt before the summary: until the
        next reply there is no count of the chat as it is sent now)."""
        for m in reversed(self.session.branch):
            if m.role == Role.ASSISTANT and m.usage and m.usage.get("context_used"):
                active = self._active()
                if active is not None and m.created_at < active.created_at:
                    return None
                return int(m.usage["context_used"])
        return None

    def _max_new_tokens(self) -> int | None:
        presets = self.session.presets
        return presets.view.values.get("max_new_tokens") if presets is not None else None

    def _branch(self, cid: int):
        session = self.session
        if cid == session.conversation_id and not session.earlier:
            return session.branch
        return self.store.branch(cid)  # the whole history, loaded in the view or not

    def _plan(self, cid: int, used: int):
        """-> (ids to summarise now, the messages not summarised yet, the active compaction)."""
        branch = self._branch(cid)
        previous = self.session.compaction_on(cid, branch)
        already = set(previous.covered) if previous else set()
        items = [
            ChatItem(m.id, str(m.role), m.content or "")
            for m in branch
            if m.id not in already and m.status != MessageStatus.STREAMING
        ]
        conv = self.store.conversation(cid)
        fixed = len(conv.system_prompt.strip()) if conv else 0
        if previous is not None:
            fixed += len(summary_note(previous.summary, len(previous.covered)))
        info = self.session.controller.model
        covered = choose_covered(items, used, info.n_ctx, self._max_new_tokens(), fixed)
        return covered, items, previous

    # --- writing the summary --------------------------------------------------------------------
    def start(self) -> bool:
        """Ask the loaded model for a summary of the oldest turns of the open chat (the turns
        an earlier summary covers stay covered: the new one extends it)."""
        session = self.session
        cid, info, used = session.conversation_id, session.controller.model, self._context_used()
        if self._job is not None or session.busy or cid is None or info is None or used is None:
            return False
        covered, items, previous = self._plan(cid, used)
        if not covered:
            return False
        chosen = set(covered)
        request = GenerationRequest(
            messages=tuple(
                summary_request_messages(
                    [i for i in items if i.id in chosen], previous.summary if previous else None
                )
            ),
            # greedy: the same chat summarises the same way; the cap keeps it a summary
            overrides={"do_sample": False, "max_new_tokens": summary_max_tokens(info.n_ctx)},
            enable_thinking=False if info.thinking_switch else None,
        )
        self._job = _Job(cid, (*(previous.covered if previous else ()), *covered))
        self.offer.setVisible(False)
        self.card.show_running(len(self._job.covered))
        session.compacting = True
        session.busyChanged.emit(True)
        try:
            session.controller.generate(request)
        except RuntimeError as exc:  # the engine took another request meanwhile
            self._end_job()
            self._problem(f"The summary could not start ({exc}). {UNCHANGED}")
            return False
        return True

    def cancel(self) -> None:
        if self._job is not None:
            self.session.controller.cancel()

    def _end_job(self) -> _Job | None:
        job, self._job = self._job, None
        self.session.compacting = False
        self.session.busyChanged.emit(self.session.busy)
        return job

    def _on_text(self, text: str) -> None:
        if self._job is not None:
            self._job.text.append(text)
            self.card.append(text)

    def _on_errored(self, message: str) -> None:
        job = self._end_job() if self._job is not None else None
        if job is not None and job.conversation_id == self.session.conversation_id:
            self._problem(f"The summary could not be written: {message} {UNCHANGED}")

    def _on_finished(self, finished: Finished) -> None:
        if self._job is None:
            return
        job = self._end_job()
        assert job is not None
        here = job.conversation_id == self.session.conversation_id
        summary = (finished.text or "".join(job.text)).strip()
        if finished.finish_reason == FINISH_CANCELLED:
            problem = f"Summary cancelled. {UNCHANGED}"
        elif finished.error:
            problem = f"The summary could not be written: {finished.error} {UNCHANGED}"
        elif not summary:
            problem = f"The model wrote an empty summary. {UNCHANGED}"
        else:
            try:
                self.store.add_compaction(
                    job.conversation_id, list(job.covered), summary, finished.receipt
                )
            except StoreWriteError as exc:
                problem = f"The summary could not be saved ({exc}). {UNCHANGED}"
            else:
                problem = ""
        if not here:
            return  # the user left that chat (which cancels the summary); nothing to show
        if problem:
            self._problem(problem)
        else:
            self.refresh()

    def _problem(self, message: str) -> None:
        """Say why no summary was made, on the card: beside the summary still in use, if any."""
        active = self._active()
        if active is not None:
            self.card.show_summary(len(active.covered), active.summary, note=message)
        else:
            self.card.show_problem(message)
        self.card.setVisible(True)

    # --- the summary in the chat ----------------------------------------------------------------
    def _active(self) -> StoredCompaction | None:
        """The open chat's compaction in use: active, with all its messages on the branch."""
        session, cid = self.session, self.session.conversation_id
        if cid is None:
            return None
        if not session.earlier:
            return session.compaction_on(cid, session.branch)
        # a long chat shows its last messages only: the branch's ids, not its text (opening
        # a chat must not cost its length, app/session.py OPEN_MESSAGES)
        active = self.store.active_compaction(cid)
        if active is None or not set(active.covered) <= set(self.store.branch_ids(cid)):
            return None
        return active

    def refresh(self) -> None:
        """Show the open chat's summary (or none) and hide or grey the messages it covers."""
        if self._job is not None and self._job.conversation_id == self.session.conversation_id:
            return  # the card shows the summary being written
        active = self._active()
        if active is None:
            self.card.setVisible(False)
            self._originals_shown = False
        else:
            self.card.show_summary(len(active.covered), active.summary)
        self._apply_covered(active)
        self.check()

    def _apply_covered(self, active: StoredCompaction | None) -> None:
        covered = set(active.covered) if active is not None else set()
        for widget in self.chat_view.widgets:
            is_covered = widget.message.id in covered
            # greyed and read-only when shown: the model does not see them while summarised
            widget.setEnabled(not is_covered)
            widget.setVisible(not is_covered or self._originals_shown)

    def show_originals(self, shown: bool) -> None:
        self._originals_shown = shown
        self._apply_covered(self._active())

    def save_edit(self, text: str) -> None:
        active = self._active()
        if active is None:
            return
        if not text.strip():
            self.card.show_summary(
                len(active.covered), active.summary, note="A summary cannot be empty."
            )
            return
        try:
            self.store.set_compaction_summary(active.id, text.strip())
        except StoreWriteError as exc:
            self.card.show_summary(
                len(active.covered), text, note=f"The edit could not be saved ({exc})."
            )
            return
        self.card.saved(text.strip())

    def restore(self) -> None:
        """The originals again: the summary stops standing in for them (kept for receipts)."""
        active = self._active()
        if active is None:
            return
        try:
            self.store.deactivate_compaction(active.id)
        except StoreWriteError as exc:
            self.card.show_summary(
                len(active.covered), active.summary, note=f"Could not restore ({exc})."
            )
            return
        self._declined.add(active.conversation_id)  # asked for the originals: no new offer
        self._originals_shown = False
        self.card.setVisible(False)
        self._apply_covered(None)
