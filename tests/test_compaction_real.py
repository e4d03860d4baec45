"""Compaction on the real engine and SmolLM2 (issue 35), every setting at its default (4,096-token
context, "Offer a summary", the model's chat preset with no max_new_tokens): a long chat's next
reply brings it near the limit, the offer appears, the model writes the summary, the next reply
is built on it and its receipt records it; after the summary is edited, that reply still
replays exactly, and the replay says the summary was edited since."""

from __future__ import annotations

from app.engine_bridge import RealEngine
from tests.app_fakes import WAIT_MS, close_window, make_window

TOPICS = [
    ("Paris", "France", "the Seine"),
    ("Rome", "Italy", "the Tiber"),
    ("Berlin", "Germany", "the Spree"),
    ("Vienna", "Austria", "the Danube"),
    ("London", "England", "the Thames"),
    ("Prague", "Czechia", "the Vltava"),
    ("Warsaw", "Poland", "the Vistula"),
    ("Budapest", "Hungary", "the Danube"),
    ("Lisbon", "Portugal", "the Tagus"),
    ("Madrid", "Spain", "the Manzanares"),
]


def _long_chat(store) -> int:
    """30 stored turns about capitals and rivers (about 3,300 tokens in SmolLM2's template)."""
    cid = store.create_conversation("Capitals")
    parent = None
    questions = (
        "Tell me about {city}, the capital of {country}, and its river.",
        "Remind me again: which river flows through {city} in {country}?",
        "What is {city} best known for?",
    )
    for template in questions:
        for city, country, river in TOPICS:
            question = template.format(city=city, country=country)
            answer = (
                f"{city} is the capital of {country}. The river {river} flows through it. "
                f"{city} has a long history, many museums, old bridges over {river}, parks, "
                f"markets and cafes, and it is one of the most visited cities of Europe. "
                f"Most visitors walk along {river}, see the old town of {city} and try the "
                f"food of {country}. In the evening the bridges over {river} are lit."
            )
            parent = store.add_message(cid, "user", question, parent_id=parent)
            parent = store.add_message(cid, "assistant", answer, parent_id=parent)
    return cid


def test_a_long_chat_is_summarised_by_the_model_and_a_reply_on_it_replays_exactly(
    qtbot, tmp_path, smollm2_path
):
    engine = RealEngine(digest_cache=tmp_path / "digests.json")
    window = make_window(qtbot, tmp_path, engine, model_path=str(smollm2_path))
    try:
        session, store = window.session, window.store
        assert session.settings.long_chat == "offer" and session.controller.model.n_ctx == 4096
        cid = _long_chat(store)
        session.open_conversation(cid)
        with qtbot.waitSignal(session.replyFinished, timeout=WAIT_MS * 5):
            assert session.send("Which city is on the Tiber? Answer with one word.")
        used = session.branch[-1].usage["context_used"]
        assert used >= 0.85 * (4096 - 512), used  # the chat preset has no cap: 512 kept
        assert window.compaction_offer.isVisible()
        assert f"({used:,} of 4,096 tokens)" in window.compaction_offer.label.text()

        with qtbot.waitSignal(session.controller.replyFinished, timeout=WAIT_MS * 5):
            window.compaction_offer.summarise_button.click()
        qtbot.waitUntil(lambda: not window.compaction.running, timeout=WAIT_MS)
        compaction = store.active_compaction(cid)
        assert compaction is not None, window.compaction.card.status.text()
        assert compaction.summary.strip() and window.compaction.card.isVisible()
        assert compaction.receipt is not None  # how the summary itself was written
        ids = [m.id for m in store.branch(cid)]
        assert list(compaction.covered) == ids[: len(compaction.covered)]
        assert len(compaction.covered) % 2 == 0 and len(compaction.covered) < len(ids) - 2

        with qtbot.waitSignal(session.replyFinished, timeout=WAIT_MS * 5) as finished:
            assert session.send("Which river flows through Lisbon? Answer with one word.")
        reply = finished.args[0]
        receipt = store.receipt(reply.id)
        section = receipt["compaction"]
        assert section["covered_message_ids"] == list(compaction.covered)
        assert section["summary"] == compaction.summary
        # the prompt the model read holds the summary and none of the covered messages
        sent = receipt["prompt"]["messages"]
        assert compaction.summary.strip() in sent[0]["content"]
        # (the questions: each is asked once, while the answers repeat from round to round)
        covered_questions = {
            m.content
            for m in store.branch(cid)
            if m.id in set(compaction.covered) and m.role == "user"
        }
        assert len(covered_questions) == len(compaction.covered) // 2
        assert not any(m["content"] in covered_questions for m in sent[1:])
        assert reply.usage["context_used"] < used  # the summary made room

        store.set_compaction_summary(compaction.id, "The user asked about ten capitals.")
        with qtbot.waitSignal(session.replayFinished, timeout=WAIT_MS * 5) as replayed:
            assert session.replay(reply.id)
        report = replayed.args[1]
        assert report.identical, report
        assert len(report.differences) == 1 and "edited since" in report.differences[0]
    finally:
        close_window(window)
