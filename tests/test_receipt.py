"""engine/receipt.py without a model: model-file digests computed once and cached, the request a
replay runs, locating the first divergence of two token streams, and what differs in a receipt."""

import hashlib
import os

import pytest

from engine import receipt as receipt_mod
from engine.receipt import (
    ModelDigests,
    ReceiptError,
    first_divergence,
    receipt_differences,
    replay_request,
    section_checks,
)


def test_a_model_file_is_hashed_once_and_again_only_when_it_changes(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    calls = []
    real = receipt_mod.file_sha256
    monkeypatch.setattr(receipt_mod, "file_sha256", lambda p: calls.append(p) or real(p))
    cache = tmp_path / "cache" / "digests.json"
    digests = ModelDigests(cache)
    digests.start(model)
    assert digests.digest(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert digests.digest(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert ModelDigests(cache).digest(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert len(calls) == 1  # the second instance read the cache file
    model.write_bytes(b"GGUF changed")
    os.utime(model, ns=(1, 1))
    assert ModelDigests(cache).digest(model) == hashlib.sha256(b"GGUF changed").hexdigest()
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 2, 4], 2),
        ([5, 2, 3], [1, 2, 3], 0),
        ([1, 2], [1, 2, 3], 2),  # the original ended, the replay went on
        ([1, 2, 3], [1], 1),  # the replay ended early
        ([], [], None),
    ],
)
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


def make_receipt():
    r = {
        "model": {"file_name": "a.gguf", "sha256": "aa" * 32},
        "engine": {"version": "0.1.0", "kernels": "JIT avx2, 2 threads"},
        "chat_template": {"name": "chatml", "sha256": "cc" * 32},
        "prompt": {"token_ids": [1, 2, 3]},
        "preset": {
            "values": {"temperature": 0.7, "seed": None, "max_new_tokens": 64, "top_p": 0.9},
            "seed_used": 42,
        },
        "json_mode": "off",
        "json_schema": None,
        "output": {"token_ids": [7, 8], "finish_reason": "stop"},
    }
    r["checks"] = section_checks(r)
    return r


def environment_like(r):
    return {k: dict(r[k]) for k in ("model", "engine", "chat_template")}


def test_a_matching_receipt_has_no_differences():
    r = make_receipt()
    assert receipt_differences(r, environment_like(r), {"values": r["preset"]["values"]}) == []


def test_each_kind_of_difference_is_named():
    r = make_receipt()
    now = environment_like(r)
    now["model"] = {"file_name": "b.gguf", "sha256": "bb" * 32}
    now["chat_template"] = {"name": "chatml (fallback)", "sha256": "dd" * 32}
    now["engine"] = {"version": "0.2.0", "kernels": "numpy"}
    r["preset"]["values"]["temperature"] = 1.2  # edited after it was recorded
    resolved = {"values": {**r["preset"]["values"], "top_p": 1.0, "max_new_tokens": 3}}
    found = receipt_differences(r, now, resolved)
    assert found[0].startswith("model file: a.gguf") and "b.gguf" in found[0]
    assert found[1].startswith("chat template: chatml") and "(fallback)" in found[1]
    assert "engine version: 0.1.0 in the receipt, 0.2.0 now" in found
    assert "kernels: JIT avx2, 2 threads in the receipt, numpy now" in found
    assert "the receipt's preset was changed after it was recorded" in found
    assert "preset top_p: 0.9 in the receipt, 1.0 in the replay" in found
    assert not any("max_new_tokens" in x for x in found)  # capped on purpose by the replay
    assert len(found) == 6


def test_same_file_under_another_name_is_told_apart_from_another_file():
    r = make_receipt()
    now = environment_like(r)
    now["model"] = {"file_name": "renamed.gguf", "sha256": r["model"]["sha256"]}
    assert receipt_differences(r, now) == [
        "model file name: a.gguf in the receipt, renamed.gguf now (same contents)"
    ]


def test_the_replay_request_runs_every_recorded_value_with_the_seed_used():
    r = make_receipt()
    request = replay_request(r, n_tokens=3)
    assert list(request.prompt_ids) == [1, 2, 3]
    assert request.overrides == {"temperature": 0.7, "seed": 42, "max_new_tokens": 3, "top_p": 0.9}
    assert request.json_mode == "off" and request.top_logprobs == receipt_mod.REPLAY_TOP_LOGPROBS
    with pytest.raises(ReceiptError, match="no usable prompt or preset"):
        replay_request({"preset": {}})


def test_a_divergence_says_whether_the_model_saw_the_same_distribution():
    from engine.events import TokenSampled, TopAlternative
    from engine.receipt import _describe

    record = {
        "index": 0,
        "token_id": 5,
        "text": " a",
        "logprob": -0.5,
        "top": [{"token_id": 5, "logprob": -0.5}, {"token_id": 9, "logprob": -1.5}],
    }
    same = TokenSampled(
        0, 9, " b", -1.5, (TopAlternative(5, " a", -0.5), TopAlternative(9, " b", -1.5))
    )
    d = _describe(0, [5], [record], [same], lm=None)
    assert (d.original.token_id, d.original.logprob, d.replayed.token_id) == (5, -0.5, 9)
    assert (d.original_logprob_in_replay, d.replayed_logprob_in_original) == (-0.5, -1.5)
    assert d.same_distribution is True
    other = TokenSampled(
        0, 9, " b", -0.2, (TopAlternative(9, " b", -0.2), TopAlternative(5, " a", -2.0))
    )
    assert _describe(0, [5], [record], [other], lm=None).same_distribution is False
    ended = _describe(1, [5], [record], [same, other], lm=None)  # the original had ended
    assert ended.original is None and ended.same_distribution is None
