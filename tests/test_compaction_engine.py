"""The prompt-side rules of compaction (engine/compaction.py) and its receipt section
(engine/receipt.py with_compaction), with hand-computed numbers."""

from __future__ import annotations

from engine.compaction import (
    ChatItem,
    choose_covered,
    edited_note,
    near_limit,
    prompt_budget,
    receipt_section,
    summary_max_tokens,
    summary_request_messages,
    with_summary_note,
)
from engine.receipt import receipt_differences, section_checks, with_compaction

# sha256("abc"), FIPS 180-2 appendix B.1
ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def _chat(n_turns: int, chars: int = 100) -> list[ChatItem]:
    items = []
    for t in range(n_turns):
        items.append(ChatItem(2 * t + 1, "user", "u" * chars))
        items.append(ChatItem(2 * t + 2, "assistant", "a" * chars))
    return items


def test_near_limit_is_85_percent_of_the_prompts_room():
    # n_ctx 4096, max_new_tokens 512: room 3584; 0.85 x 3584 = 3046.4
    assert prompt_budget(4096, 512) == 3584
    assert not near_limit(3046, 4096, 512)
    assert near_limit(3047, 4096, 512)
    # no max_new_tokens: fit_chat's room, min(512, 2048 // 4) = 512 -> 1536; 0.85 x = 1305.6
    assert not near_limit(1305, 2048, None)
    assert near_limit(1306, 2048, None)


def test_summary_cap_is_an_eighth_of_a_small_context():
    assert summary_max_tokens(1024) == 128
    assert summary_max_tokens(8192) == 320  # the cap
    assert summary_max_tokens(256) == 64  # the floor


def test_choose_covered_takes_whole_oldest_turns_until_the_target():
    # 10 turns of 2 x 100 characters, 2,000 characters = 1,900 tokens (0.95 a character).
    # n_ctx 4096, max_new_tokens 512: room 3584, target 1,792; summary cap 320.
    # k turns covered: 1900 - 190k + 320 <= 1792  ->  k >= 2.2: 3 turns (ids 1..6)
    assert choose_covered(_chat(10), 1900, 4096, 512) == [1, 2, 3, 4, 5, 6]


def test_choose_covered_never_takes_the_latest_turn_nor_a_lone_one():
    assert choose_covered(_chat(1), 3500, 4096, 512) == []
    # far over the target: everything but the last turn
    assert choose_covered(_chat(3), 3500, 4096, 512) == [1, 2, 3, 4]
    # 2 turns of 1,750 tokens each: covering the first leaves 1750 + 320 = 2070 > 1792, and
    # the second (whose request would still fit: 3,500 <= 3,616) is the latest: it stays
    assert choose_covered(_chat(2), 3500, 4096, 512) == [1, 2]


def test_choose_covered_stops_where_the_summary_request_would_not_fit():
    # 4 turns of 2 x 1,000 chars = 8,000 chars for 3,000 tokens (0.375 a character).
    # n_ctx 2048, no max_new_tokens: room 1536, target 768, summary cap 256; the request holds
    # 2048 - 256 - 160 = 1,632 tokens: 1 turn = 750, 2 turns = 1,500, 3 turns = 2,250 > 1,632.
    # The target would want 3 turns (3000 - 2250 + 256 = 1006 is still over 768): 2 it is.
    assert choose_covered(_chat(4, 1000), 3000, 2048, None) == [1, 2, 3, 4]


def test_fixed_text_counts_but_is_never_covered():
    # the same chat as in the target test, plus 2,000 characters of system prompt always sent:
    # 4,000 characters for 1,900 tokens (0.475 each); a turn is 95 tokens.
    # 1900 - 95k + 320 <= 1792 -> k >= 4.5: 5 turns
    covered = choose_covered(_chat(10), 1900, 4096, 512, fixed_chars=2000)
    assert covered == list(range(1, 11))


def test_the_summary_request_holds_the_transcript_and_an_earlier_summary():
    items = [ChatItem(1, "user", " What is 2+2? "), ChatItem(2, "assistant", "4.")]
    messages = summary_request_messages(items, previous_summary="They said hello.")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == (
        "Summary of what came before:\nThey said hello.\n\n"
        "Conversation:\nUser: What is 2+2?\n\nAssistant: 4.\n\nWrite the summary now."
    )


def test_the_note_joins_the_system_prompt_or_comes_first():
    with_system = with_summary_note(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], "S.", 4
    )
    assert with_system == [
        {
            "role": "system",
            "content": "Be brief.\n\nSummary of the 4 earlier messages of this conversation, "
            "which are left out here:\nS.",
        },
        {"role": "user", "content": "hi"},
    ]
    alone = with_summary_note([{"role": "user", "content": "hi"}], "S.", 1)
    assert alone[0]["role"] == "system"
    assert alone[0]["content"].startswith("Summary of the 1 earlier message of")
    assert alone[1] == {"role": "user", "content": "hi"}


def test_the_receipt_records_and_checks_the_compaction():
    section = receipt_section(7, [1, 2, 3], "abc")
    assert section == {
        "compaction_id": 7,
        "covered_message_ids": [1, 2, 3],
        "summary": "abc",
        "summary_sha256": ABC_SHA256,
    }
    receipt = {"prompt": {"token_ids": [1, 2]}, "preset": {}, "output": {"token_ids": [3]}}
    receipt["checks"] = section_checks(receipt)
    recorded = with_compaction(receipt, section)
    assert recorded["compaction"] == section and "compaction" in recorded["checks"]
    assert "compaction" not in receipt  # the original is not changed
    now = {
        "model": {"sha256": None, "file_name": None},
        "chat_template": {"sha256": None, "name": None},
        "engine": {"version": None, "kernels": None},
    }
    assert receipt_differences(recorded, now) == []
    tampered = {**recorded, "compaction": {**section, "summary": "abd"}}
    assert "the receipt's compaction was changed after it was recorded" in (
        receipt_differences(tampered, now)
    )


def test_a_replay_says_when_the_summary_was_edited_or_restored():
    section = receipt_section(7, [1, 2], "abc")
    assert edited_note(section, "abc") is None
    assert edited_note(None, "anything") is None  # a reply built on no summary
    assert "edited since" in edited_note(section, "abc, edited")
    assert "no longer used" in edited_note(section, None)
