"""Visible, reversible compaction in the window (issue 35), over the scripted engine of
tests/app_fakes.py: the offer near the context limit, the summary written by the engine and
stored, the prompt built on it, the receipt recording it, edit, show originals, restore, and a
cancelled or failed summary leaving the store as it was.

The numbers, by hand. The fake engine counts a message as its words + 4 tokens; every user
message and reply here is 60 words ("word" x 60, 299 characters), so a message is 64 tokens.
The context is 1,024 tokens and the preset's max_new_tokens 256, so the prompt's room is 768
and "near" is 0.85 x 768 = 652.8. After turn k the reply's context use is (2k - 1) x 64 + 60:
turn 5 -> 636 (no offer), turn 6 -> 764 (offer: "764 of 1,024 tokens").
Which turns: 12 messages of 299 characters make 764 tokens, 0.2129 a character. The summary
may take 1,024 // 8 = 128 tokens; the goal is a prompt of 0.5 x 768 = 384, so at least
764 + 128 - 384 = 508 tokens must go: 4 turns (8 messages, 2,392 characters, 509.3 tokens);
3 turns (382.0 tokens) are not enough.
"""

from __future__ import annotations

import json

import pytest

from app.features.compaction import UNCHANGED
from engine.errors import EngineError
from engine.events import Finished
from engine.types import ReplayReport
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window

WORDS = " ".join(["word"] * 60)
SUMMARY = "The user and the assistant exchanged four rounds of words."


def _engine(**kwargs) -> FakeEngine:
    return FakeEngine(replies=[WORDS] * 6 + [SUMMARY, "after"], **kwargs)


def _window(qtbot, tmp_path, engine, long_chat: str = "offer"):
    (tmp_path / "settings.json").write_text(
        json.dumps({"context_size": 1024, "long_chat": long_chat})
    )
    return make_window(qtbot, tmp_path, engine)


def _turns(qtbot, window, n: int) -> None:
    for _ in range(n):
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            assert window.session.send(WORDS)


def _summarise(qtbot, window) -> None:
    c = window.compaction
    with qtbot.waitSignal(window.session.controller.replyFinished, timeout=WAIT_MS):
        window.compaction_offer.summarise_button.click()
    qtbot.waitUntil(lambda: not c.running, timeout=WAIT_MS)


def _compactions(window) -> list[tuple]:
    rows = window.store._db.execute(
        "SELECT conversation_id, covered_json, summary, active FROM compactions"
    ).fetchall()
    return [tuple(row) for row in rows]


@pytest.fixture
def engine():
    return _engine()


def test_offer_appears_only_near_the_limit_with_the_counts(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine)
    try:
        assert window.session.controller.model.n_ctx == 1024
        _turns(qtbot, window, 5)
        assert not window.compaction_offer.isVisible()  # 636 < 652.8
        _turns(qtbot, window, 1)
        assert window.compaction_offer.isVisible()
        assert "(764 of 1,024 tokens)" in window.compaction_offer.label.text()
        # while the next reply streams the offer waits; that reply's count brings it back
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("one more")
            assert not window.compaction_offer.isVisible()
        assert window.compaction_offer.isVisible()
        window.compaction_offer.not_now_button.click()
        assert not window.compaction_offer.isVisible()
        _turns(qtbot, window, 1)
        assert not window.compaction_offer.isVisible()  # not asked again in this chat
        assert _compactions(window) == []
    finally:
        close_window(window)


def test_summarise_stores_the_summary_and_the_next_prompt_is_built_on_it(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        branch = [m.id for m in window.session.branch]
        _summarise(qtbot, window)
        # the summary request: the model's own instructions and the 4 oldest turns
        request = engine.requests[6]
        assert request.messages[0]["role"] == "system"
        assert request.messages[1]["content"].count("User: ") == 4
        assert request.messages[1]["content"].count("Assistant: ") == 4
        assert request.overrides["do_sample"] is False
        assert request.overrides["max_new_tokens"] == 128
        rows = _compactions(window)
        assert rows == [(window.session.conversation_id, json.dumps(branch[:8]), SUMMARY, 1)]
        card = window.compaction.card
        assert card.isVisible() and card.title.text() == "Summary of 8 earlier messages"
        assert card.summary_text == SUMMARY
        hidden = [w.message.id for w in window.chat_view.widgets if not w.isVisibleTo(window)]
        assert hidden == branch[:8]
        # the originals stay in the store
        assert [m.id for m in window.store.branch(window.session.conversation_id)] == branch
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            assert window.session.send("next question")
        messages = engine.requests[7].messages
        assert messages[0]["role"] == "system"
        assert messages[0]["content"].endswith(SUMMARY)
        assert "8 earlier messages" in messages[0]["content"]
        # the 2 newest turns and the new question follow, nothing older
        assert [m["content"] for m in messages[1:]] == [WORDS] * 4 + ["next question"]
    finally:
        close_window(window)


class ReceiptEngine(FakeEngine):
    """The fake engine, with a receipt on each Finished (the real bridge attaches one) and a
    replay that always reproduces (engine/receipt.py replay runs from the prompt's token ids,
    which hold the summary as sent: tests/test_compaction_real.py checks that on SmolLM2)."""

    def generate(self, lm, request, cancel):
        for event in super().generate(lm, request, cancel):
            if isinstance(event, Finished):
                receipt = {"prompt": {"messages": [dict(m) for m in request.messages]}}
                event = Finished(**{**event.__dict__, "receipt": receipt})
            yield event

    def replay(self, lm, receipt, original_tokens, cancel):
        return ReplayReport(True, 1, 1, None, ())


def test_the_receipt_of_a_reply_on_a_summary_records_it(qtbot, tmp_path):
    engine = ReceiptEngine(replies=[WORDS] * 6 + [SUMMARY, "after"])
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        covered = [m.id for m in window.session.branch][:8]
        _summarise(qtbot, window)
        earlier = window.session.branch[-1].id
        assert "compaction" not in window.store.receipt(earlier)  # built on no summary
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as reply:
            window.session.send("next question")
        receipt = window.store.receipt(reply.args[0].id)
        section = receipt["compaction"]
        assert section["covered_message_ids"] == covered
        assert section["summary"] == SUMMARY
        # sha256 of SUMMARY, computed with `printf %s "$SUMMARY" | sha256sum`
        assert (
            section["summary_sha256"]
            == "423d219f7c3005ff941ce34b6d3772dbbcd44dc68d8db5118f9eb13445647c8a"
        )
        assert "compaction" in receipt["checks"]
    finally:
        close_window(window)


def test_cancel_leaves_the_store_as_it_was_and_says_so(qtbot, tmp_path):
    engine = _engine(pause_after=2)
    window = _window(qtbot, tmp_path, engine)
    try:
        engine.gate.set()  # the chat's replies run through
        _turns(qtbot, window, 6)
        engine.gate.clear()  # the summary stops after 2 words
        window.compaction_offer.summarise_button.click()
        card = window.compaction.card
        qtbot.waitUntil(lambda: card.summary_text.strip() != "", timeout=WAIT_MS)
        assert window.session.busy and not window.session.send("while summarising")
        with qtbot.waitSignal(window.session.controller.replyFinished, timeout=WAIT_MS):
            card.cancel_button.click()
            engine.gate.set()
        assert _compactions(window) == []
        assert card.status.text() == f"Summary cancelled. {UNCHANGED}"
        assert not window.session.busy
        assert all(w.isVisibleTo(window) for w in window.chat_view.widgets)
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("next")
        assert len(engine.requests[-1].messages) == 13  # every message, no summary note
    finally:
        close_window(window)


def test_a_failed_summary_leaves_the_store_as_it_was_and_says_why(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        engine.fail_generate_with = EngineError("the model ran out of memory")
        with qtbot.waitSignal(window.session.controller.replyErrored, timeout=WAIT_MS):
            window.compaction_offer.summarise_button.click()
        assert _compactions(window) == []
        assert "the model ran out of memory" in window.compaction.card.status.text()
        assert UNCHANGED in window.compaction.card.status.text()
        assert not window.session.busy
    finally:
        close_window(window)


def test_edit_show_originals_and_restore(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        covered = [m.id for m in window.session.branch][:8]
        _summarise(qtbot, window)
        card = window.compaction.card
        card.text.setPlainText("Edited: they talked about words.")
        assert card.save_button.isVisibleTo(window)
        card.save_button.click()
        assert _compactions(window)[0][2] == "Edited: they talked about words."
        assert not card.save_button.isVisibleTo(window)
        # show originals: in place, greyed
        card.originals_button.click()
        shown = {w.message.id: w for w in window.chat_view.widgets}
        assert all(shown[i].isVisibleTo(window) and not shown[i].isEnabled() for i in covered)
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("next")
        assert (
            engine.requests[-1].messages[0]["content"].endswith("Edited: they talked about words.")
        )
        card.restore_button.click()
        assert _compactions(window)[0][3] == 0  # inactive, kept
        assert not card.isVisible()
        assert all(w.isVisibleTo(window) and w.isEnabled() for w in window.chat_view.widgets)
        assert not window.compaction_offer.isVisible()  # restored on purpose: not offered again
    finally:
        close_window(window)


def test_drop_oldest_setting_never_offers(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine, long_chat="drop_oldest")
    try:
        _turns(qtbot, window, 6)
        assert not window.compaction_offer.isVisible()
        assert _compactions(window) == []
    finally:
        close_window(window)


def test_auto_setting_summarises_without_asking(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine, long_chat="auto")
    try:
        _turns(qtbot, window, 6)
        qtbot.waitUntil(lambda: len(_compactions(window)) == 1, timeout=WAIT_MS)
        assert not window.compaction_offer.isVisible()
        assert _compactions(window)[0][2] == SUMMARY
        # the last reply's count predates the summary: no second summary on its strength
        qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            assert window.session.send("next")
        assert len(engine.requests) == 8 and len(_compactions(window)) == 1
        assert engine.requests[-1].messages[0]["content"].endswith(SUMMARY)
    finally:
        close_window(window)


def test_reopening_the_chat_shows_its_summary(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        _summarise(qtbot, window)
        cid = window.session.conversation_id
        window.session.new_conversation()
        assert not window.compaction.card.isVisible()
        window.session.open_conversation(cid)
        assert window.compaction.card.isVisible()
        assert window.compaction.card.summary_text == SUMMARY
        hidden = [w for w in window.chat_view.widgets if not w.isVisibleTo(window)]
        assert len(hidden) == 8
    finally:
        close_window(window)


def test_settings_choose_what_happens_to_a_long_chat(qtbot, tmp_path):
    from app.settings import Settings, SettingsFile
    from app.views.settings_dialog import SettingsDialog

    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert dialog.long_chat.currentText() == "Offer a summary"  # the default
    assert [dialog.long_chat.itemText(i) for i in range(dialog.long_chat.count())] == [
        "Drop the oldest turns",
        "Offer a summary",
        "Summarise automatically",
    ]
    dialog.long_chat.setCurrentIndex(2)
    assert dialog.result_settings().long_chat == "auto"
    (tmp_path / "settings.json").write_text(json.dumps({"long_chat": "shorten it somehow"}))
    assert SettingsFile(tmp_path / "settings.json").load().long_chat == "offer"


def test_an_empty_summary_is_not_stored(qtbot, tmp_path):
    engine = FakeEngine(replies=[WORDS] * 6 + [""])
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        _summarise(qtbot, window)
        assert _compactions(window) == []
        assert window.compaction.card.status.text() == (
            f"The model wrote an empty summary. {UNCHANGED}"
        )
        assert all(w.isVisibleTo(window) for w in window.chat_view.widgets)
    finally:
        close_window(window)


def test_a_replay_says_the_summary_was_edited_or_restored_since(qtbot, tmp_path):
    engine = ReceiptEngine(replies=[WORDS] * 6 + [SUMMARY, "after"])
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        _summarise(qtbot, window)
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as reply:
            window.session.send("next question")
        reply_id = reply.args[0].id

        def replayed():
            with qtbot.waitSignal(window.session.replayFinished, timeout=WAIT_MS) as done:
                assert window.session.replay(reply_id)
            return done.args[1].differences

        assert replayed() == ()  # the summary as the reply read it
        card = window.compaction.card
        card.text.setPlainText("Edited.")
        card.save_button.click()
        (note,) = replayed()
        assert "edited since" in note and "as recorded in the receipt" in note
        card.restore_button.click()
        (note,) = replayed()
        assert "no longer used by the chat" in note
    finally:
        close_window(window)


def test_a_summary_that_cannot_be_saved_changes_nothing_and_says_why(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        window.store._db.execute(
            "CREATE TRIGGER full BEFORE INSERT ON compactions "
            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
        )
        _summarise(qtbot, window)
        assert _compactions(window) == []
        status = window.compaction.card.status.text()
        assert status.startswith("The summary could not be saved (") and UNCHANGED in status
        assert all(w.isVisibleTo(window) for w in window.chat_view.widgets)
    finally:
        close_window(window)


def test_an_empty_edit_is_refused_and_the_summary_kept(qtbot, tmp_path, engine):
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        _summarise(qtbot, window)
        card = window.compaction.card
        card.text.setPlainText("   ")
        assert not card.save_button.isEnabled()
        window.compaction.save_edit("   ")  # e.g. by keyboard before the button updated
        assert card.status.text() == "A summary cannot be empty."
        assert _compactions(window)[0][2] == SUMMARY and card.summary_text == SUMMARY
    finally:
        close_window(window)


def test_a_second_summary_extends_the_first(qtbot, tmp_path):
    engine = FakeEngine(replies=[WORDS] * 6 + [SUMMARY] + [WORDS] * 30 + ["Second summary."])
    window = _window(qtbot, tmp_path, engine)
    try:
        _turns(qtbot, window, 6)
        _summarise(qtbot, window)
        first = _compactions(window)[0]
        for _ in range(30):  # until the chat nears the limit again
            if window.compaction_offer.isVisible():
                break
            _turns(qtbot, window, 1)
        assert window.compaction_offer.isVisible()
        _summarise(qtbot, window)
        request = engine.requests[-1].messages[1]["content"]
        assert request.startswith(f"Summary of what came before:\n{SUMMARY}\n\nConversation:\n")
        rows = _compactions(window)
        assert len(rows) == 2 and rows[0][3] == 0 and rows[1][3] == 1
        older, newer = json.loads(first[1]), json.loads(rows[1][1])
        assert newer[: len(older)] == older and len(newer) > len(older)
        assert window.compaction.card.title.text() == f"Summary of {len(newer)} earlier messages"
    finally:
        close_window(window)


def test_a_long_chat_opens_with_its_summary_without_reading_its_history(
    qtbot, tmp_path, engine, monkeypatch
):
    """A chat longer than the window shows (app/session.py OPEN_MESSAGES) opens with its last
    messages only; its summary's messages are checked against the branch's ids, not read."""
    window = _window(qtbot, tmp_path, engine)
    try:
        store = window.store
        cid = store.create_conversation("long")
        ids: list[int] = []
        for k in range(250):
            role = "user" if k % 2 == 0 else "assistant"
            ids.append(store.add_message(cid, role, f"m{k}", parent_id=ids[-1] if ids else None))
        store.add_compaction(cid, ids[:10], "Ten old messages.")

        def whole_branch(*args, **kwargs):
            raise AssertionError("the whole history was read")

        monkeypatch.setattr(store, "branch", whole_branch)
        window.session.open_conversation(cid)
        assert window.session.earlier == 50
        assert window.compaction.card.isVisible()
        assert window.compaction.card.title.text() == "Summary of 10 earlier messages"
    finally:
        close_window(window)
