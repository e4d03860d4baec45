"""Receipts and replay with the real engine on SmolLM2: a sampled reply (no seed in the preset,
so the engine picks one and the receipt records it) replays token for token from its receipt;
a receipt whose preset was changed behind its back replays into a divergence, located at the
first token where a direct run with that preset differs, and the Details view says the preset
was changed. The JSON export carries the receipt.

The first test drives the path a new user takes, in the fast tier: the app's own engine bridge
(RealEngine: preset resolution, context fit, receipts, digests, replay) over the scripted model of
tests/fake_model.py, every setting left at its default (no max_new_tokens: an unbounded reply),
Enter, Details, Replay."""

import hashlib
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PySide6.QtCore import Qt

from app.backends.remote import REMOTE_ARCHITECTURE
from app.engine_bridge import RealEngine
from app.views.receipt_dialog import NO_RECEIPT
from engine.cancel import CancelToken
from engine.generate import generate
from engine.receipt import build_receipt, replay
from engine.types import GenerationRequest, ModelInfo
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window
from tests.fake_model import (
    BOS,
    EOS,
    IM_END,
    IM_START,
    VOCAB_SIZE,
    CancelAfter,
    fake_lm,
    one_hot,
    use_fake_detokenizer,
)


def sampled_logits(prefix):
    """Spread over the ordinary pieces (the default preset samples, so the reply depends on the
    seed the engine picks), a pure function of the prefix; the reply ends after 12 tokens."""
    if len(prefix) >= 24:
        return one_hot(EOS)
    logits = np.random.default_rng([len(prefix), *prefix]).normal(0.0, 1.0, VOCAB_SIZE)
    logits[[BOS, EOS, IM_END, IM_START]] = -30.0
    return logits.astype(np.float32)


class ScriptedModelEngine(RealEngine):
    """The app's engine bridge with only the model replaced by the scripted one: loading, the
    model's description and unloading are the fake's; generate, receipts, digests and replay are
    RealEngine's own."""

    def load(self, path, *, n_ctx, n_threads, progress, cache_type="f16"):
        progress("ready", 1.0)
        lm = fake_lm(sampled_logits, n_ctx=n_ctx or 64, path=Path(path))
        self._model_digests().start(lm.path)
        self.lm = lm
        return lm

    architecture = "llama"

    def describe(self, lm):
        return ModelInfo(
            path=str(lm.path),
            name=lm.path.name,
            architecture=self.architecture,
            n_ctx=lm.n_ctx,
            template=lm.chat_template.name,
        )

    def unload(self, lm):
        pass


def test_a_reply_with_default_settings_replays_exactly_from_details(qtbot, tmp_path, monkeypatch):
    # Issue 31: "Replay failed: Unexpected error: TypeError: int() argument must be a string ...
    # not 'NoneType'" on every reply made with the default settings.
    use_fake_detokenizer(monkeypatch)
    model = tmp_path / "scripted.gguf"
    model.write_bytes(b"GGUF scripted model")
    engine = ScriptedModelEngine(digest_cache=tmp_path / "digests.json")
    window = make_window(qtbot, tmp_path, engine, model_path=str(model))
    window.input.setPlainText("Hello")
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        qtbot.keyClick(window.input, Qt.Key_Return)
    reply = window.store.messages(window.session.conversation_id)[-1]
    receipt = reply.receipt
    assert receipt["preset"]["values"]["max_new_tokens"] is None  # the default: no cap
    assert receipt["preset"]["values"]["do_sample"] is True
    assert receipt["preset"]["sources"]["do_sample"] == "LocalChat chat defaults"
    assert isinstance(receipt["preset"]["seed_used"], int)
    assert receipt["model"]["sha256"] == hashlib.sha256(b"GGUF scripted model").hexdigest()
    assert receipt["output"]["finish_reason"] == "stop"
    n = len(receipt["output"]["token_ids"])
    assert n > 0 and receipt["output"]["token_ids"] == [t["token_id"] for t in reply.tokens]

    window.chat_view.widgets[-1].details_button.click()
    dialog = window.details_dialog
    outcome = []  # the report, or the failure's text: either ends the wait
    window.session.replayFinished.connect(lambda message_id, report: outcome.append(report))
    window.session.replayFailed.connect(lambda message_id, text: outcome.append(text))
    dialog.replay_button.click()
    qtbot.waitUntil(lambda: bool(outcome), timeout=WAIT_MS)
    report = outcome[0]
    assert not isinstance(report, str), f"Replay failed: {report}"
    assert report.identical and report.differences == (), report
    assert report.replayed_tokens == n and report.replay_text == reply.content
    assert dialog.result.text().startswith("<b style='color:#2e8b57'>✔ Reproduced exactly</b>")
    assert f"all {n} tokens are the same" in dialog.result.text()
    assert dialog.replay_button.isEnabled()
    close_window(window)


SAMPLED = {"do_sample": True, "temperature": 0.9, "top_p": 0.95, "max_new_tokens": 24}


def test_a_reply_replays_exactly_and_a_changed_preset_is_located(
    qtbot, tmp_path, smollm2_path, smollm2
):
    engine = RealEngine(digest_cache=tmp_path / "digests.json")
    window = make_window(qtbot, tmp_path, engine, model_path=str(smollm2_path))
    for name, value in SAMPLED.items():
        assert window.session.set_preset_value(name, value) is None
    window.input.setPlainText("Tell me about the sea.")
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        qtbot.keyClick(window.input, Qt.Key_Return)
    reply = window.store.messages(window.session.conversation_id)[-1]
    receipt = reply.receipt
    assert receipt["model"]["sha256"] == hashlib.sha256(smollm2_path.read_bytes()).hexdigest()
    assert receipt["model"]["file_name"] == smollm2_path.name
    assert receipt["preset"]["seed_used"] is not None  # picked by the engine, recorded
    assert receipt["preset"]["sources"]["temperature"] == "override"
    assert receipt["prompt"]["messages"][-1] == {
        "role": "user",
        "content": "Tell me about the sea.",
    }
    assert receipt["output"]["token_ids"] == [t["token_id"] for t in reply.tokens]
    assert receipt["prompt"]["n_tokens"] == reply.usage["prompt_tokens"]

    # Details shows the receipt; Replay reproduces it exactly.
    window.chat_view.widgets[-1].details_button.click()
    dialog = window.details_dialog
    assert receipt["model"]["sha256"] in dialog.body.toPlainText()
    with qtbot.waitSignal(window.session.replayFinished, timeout=WAIT_MS) as done:
        dialog.replay_button.click()
    report = done.args[1]
    assert report.identical and report.divergence is None and report.differences == ()
    assert report.replayed_tokens == len(receipt["output"]["token_ids"])
    assert "Reproduced exactly" in dialog.result.text()

    # The preset changed behind the receipt's back: the replay runs what the receipt now says.
    tampered = json.loads(json.dumps(receipt))
    tampered["preset"]["values"]["temperature"] = 1.6
    tampered["preset"]["values"]["top_p"] = 1.0
    window.store.set_receipt(reply.id, tampered)
    direct = generate(
        smollm2,
        GenerationRequest(
            prompt_ids=receipt["prompt"]["token_ids"],
            overrides={**tampered["preset"]["values"], "seed": receipt["preset"]["seed_used"]},
        ),
    )
    direct_ids = list(list(direct)[-1].token_ids)
    original_ids = receipt["output"]["token_ids"]
    expected = next(
        (i for i, (a, b) in enumerate(zip(original_ids, direct_ids, strict=False)) if a != b),
        min(len(original_ids), len(direct_ids)),
    )
    dialog = window.show_details(reply.id)
    with qtbot.waitSignal(window.session.replayFinished, timeout=WAIT_MS) as done:
        dialog.replay_button.click()
    report = done.args[1]
    assert not report.identical
    d = report.divergence
    assert d.index == expected, expected
    assert d.original.token_id == original_ids[expected]
    assert d.original.logprob == reply.tokens[expected]["logprob"]
    if expected < len(direct_ids):
        assert d.replayed.token_id == direct_ids[expected]
        assert d.replayed.logprob is not None and d.replayed.logprob <= 0
    assert report.differences == ("the receipt's preset was changed after it was recorded",)
    if d.original_logprob_in_replay is not None and d.replayed_logprob_in_original is not None:
        # temperature/top_p change the sampler, not the model's probabilities
        assert d.same_distribution is True
    assert f"First difference at token {expected + 1}" in dialog.result.text()
    assert "preset was changed" in dialog.result.text()

    out = tmp_path / "chat.json"
    window.export_to(str(out))
    exported = json.loads(out.read_text())
    assert (
        exported["messages"][-1]["receipt"]["preset"]["seed_used"] == receipt["preset"]["seed_used"]
    )
    close_window(window)


def scripted_window(qtbot, tmp_path, monkeypatch, engine=None):
    """A window over ScriptedModelEngine with one reply (recorded with its receipt)."""
    use_fake_detokenizer(monkeypatch)
    model = tmp_path / "scripted.gguf"
    model.write_bytes(b"GGUF scripted model")
    engine = engine or ScriptedModelEngine(digest_cache=tmp_path / "digests.json")
    window = make_window(qtbot, tmp_path, engine, model_path=str(model))
    window.input.setPlainText("Hello")
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        qtbot.keyClick(window.input, Qt.Key_Return)
    return window, window.store.messages(window.session.conversation_id)[-1]


def click_replay(qtbot, window, dialog):
    """Replay from the dialog -> ReplayReport, or the failure's text."""
    outcome = []
    window.session.replayFinished.connect(lambda message_id, report: outcome.append(report))
    window.session.replayFailed.connect(lambda message_id, text: outcome.append(text))
    dialog.replay_button.click()
    qtbot.waitUntil(lambda: bool(outcome), timeout=WAIT_MS)
    return outcome[0]


def test_an_edited_receipt_replays_into_a_divergence_shown_in_details(qtbot, tmp_path, monkeypatch):
    window, reply = scripted_window(qtbot, tmp_path, monkeypatch)
    receipt = json.loads(json.dumps(reply.receipt))
    n = len(receipt["output"]["token_ids"])
    real = receipt["output"]["token_ids"][1]
    receipt["output"]["token_ids"][1] = 30 if real != 30 else 29  # "z" or "y"
    window.store.set_receipt(reply.id, receipt)
    dialog = window.show_details(reply.id)
    report = click_replay(qtbot, window, dialog)
    assert not report.identical and report.divergence.index == 1
    text = dialog.result.text()
    assert "✖ Did not reproduce." in text
    assert f"First difference at token 2 of {n}" in text
    assert "the receipt&#x27;s output was changed after it was recorded" in text
    assert window.state_label.text() == "Replay diverged"
    assert dialog.replay_button.isEnabled()
    close_window(window)


def test_a_receipt_that_cannot_be_replayed_says_why_in_details(qtbot, tmp_path, monkeypatch):
    window, reply = scripted_window(qtbot, tmp_path, monkeypatch)
    receipt = dict(reply.receipt)
    del receipt["output"]
    window.store.set_receipt(reply.id, receipt)
    dialog = window.show_details(reply.id)
    failure = click_replay(qtbot, window, dialog)
    assert isinstance(failure, str) and "the receipt has no recorded output tokens" in failure
    assert dialog.result.text().startswith("<b>Replay failed:</b> ")
    assert "no recorded output tokens" in dialog.result.text()
    assert window.state_label.text() == "Replay failed"
    assert dialog.replay_button.isEnabled()  # another try is possible
    close_window(window)


def test_a_reply_without_a_receipt_cannot_be_replayed(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["Hi there."]))
    window.input.setPlainText("Hello")
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        qtbot.keyClick(window.input, Qt.Key_Return)
    reply = window.store.messages(window.session.conversation_id)[-1]
    assert reply.receipt is None  # the scripted engine records none
    dialog = window.show_details(reply.id)
    assert not dialog.replay_button.isEnabled()
    assert NO_RECEIPT in dialog.body.toPlainText()
    with qtbot.waitSignal(window.session.replayFailed, timeout=WAIT_MS) as failed:
        assert window.session.replay(reply.id) is False
    assert failed.args == [reply.id, "This reply has no receipt to replay from."]
    assert dialog.result.text() == (
        "<b>Replay failed:</b> This reply has no receipt to replay from."
    )
    close_window(window)


def test_a_remote_model_does_not_replay_a_local_reply(qtbot, tmp_path, monkeypatch):
    class RemoteLooking(ScriptedModelEngine):
        architecture = REMOTE_ARCHITECTURE

    engine = RemoteLooking(digest_cache=tmp_path / "digests.json")
    window, reply = scripted_window(qtbot, tmp_path, monkeypatch, engine)
    dialog = window.show_details(reply.id)
    assert dialog.replay_button.isEnabled()
    failure = click_replay(qtbot, window, dialog)
    assert failure == (
        "Replay runs on the local engine: open this reply's model file, then replay."
    )
    assert "Replay runs on the local engine" in dialog.result.text()
    assert not window.controller.replaying
    close_window(window)


def test_stopping_a_replay_gives_no_verdict_and_a_second_waits(qtbot, tmp_path, monkeypatch):
    window, reply = scripted_window(qtbot, tmp_path, monkeypatch)
    gate, entered = threading.Event(), threading.Event()

    def hold(call):  # the replay's first forward pass waits until the test lets it go
        entered.set()
        gate.wait(WAIT_MS / 1000)

    window.controller.bridge.lm.model.on_forward = hold
    dialog = window.show_details(reply.id)
    outcome = []
    window.session.replayFinished.connect(lambda message_id, report: outcome.append(report))
    window.session.replayFailed.connect(lambda message_id, text: outcome.append(text))
    with qtbot.waitSignal(window.session.replayStarted, timeout=WAIT_MS):
        dialog.replay_button.click()
    assert not dialog.replay_button.isEnabled()
    assert dialog.result.text() == "Replaying… (Esc in the main window stops it)"
    qtbot.waitUntil(entered.is_set, timeout=WAIT_MS)
    assert window.session.replay(reply.id) is False  # one replay at a time
    window.cancel_button.click()
    gate.set()
    qtbot.waitUntil(lambda: bool(outcome), timeout=WAIT_MS)
    report = outcome[0]
    assert not isinstance(report, str), report
    assert report.stopped and not report.identical and report.replayed_tokens == 0
    assert dialog.result.text().startswith("<b>Replay stopped</b> after 0 of ")
    assert window.state_label.text() == "Replay stopped"
    assert len(outcome) == 1
    close_window(window)


def test_a_replay_of_a_served_model_runs_on_its_scheduler(tmp_path, monkeypatch):
    # While the model is served, the scheduler's thread runs every forward pass on it
    # (ARCHITECTURE.md, thread ownership): a replay must not run generate beside it.
    use_fake_detokenizer(monkeypatch)
    model = tmp_path / "scripted.gguf"
    model.write_bytes(b"GGUF scripted model")
    engine = ScriptedModelEngine(digest_cache=tmp_path / "digests.json")
    lm = engine.load(str(model), n_ctx=64, n_threads=None, progress=lambda *a: None)
    request = GenerationRequest(messages=({"role": "user", "content": "Hello"},))
    receipt = list(engine.generate(lm, request, CancelToken()))[-1].receipt
    submitted = []

    class Scheduler:
        """Stands for the BatchScheduler serving lm: takes the request, runs it as its own."""

        def submit(self, request, cancel, preset=None):
            submitted.append(request)
            return SimpleNamespace(events=lambda: generate(lm, request, cancel))

    engine._scheduler, engine._scheduler_lm = Scheduler(), lm
    report = engine.replay(lm, receipt, [], CancelToken())
    assert report.identical and report.differences == (), report
    assert [list(r.prompt_ids) for r in submitted] == [receipt["prompt"]["token_ids"]]
    engine._scheduler_lm = object()  # serving another model: this one is the worker's own
    assert engine.replay(lm, receipt, [], CancelToken()).identical
    assert len(submitted) == 1


def test_real_replies_with_default_settings_replay_exactly(qtbot, tmp_path, smollm2_path):
    # The same default path on the real engine and model: nothing set, so the chat defaults
    # sample with a seed the engine picks and the reply has no cap. The second turn's prompt
    # was partly served from the prefix cache; its replay prefills all of it and must still
    # give the same tokens.
    engine = RealEngine(digest_cache=tmp_path / "digests.json")
    window = make_window(qtbot, tmp_path, engine, model_path=str(smollm2_path))
    for question in ("What is 2 + 2? Answer with one word.", "And 3 + 3? One word."):
        window.input.setPlainText(question)
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            qtbot.keyClick(window.input, Qt.Key_Return)
        reply = window.store.messages(window.session.conversation_id)[-1]
        receipt = reply.receipt
        assert receipt["preset"]["values"]["max_new_tokens"] is None
        assert isinstance(receipt["preset"]["seed_used"], int)
        dialog = window.show_details(reply.id)
        report = click_replay(qtbot, window, dialog)
        assert not isinstance(report, str), f"Replay failed: {report}"
        assert report.identical and report.differences == (), report
        assert report.replayed_tokens == len(receipt["output"]["token_ids"])
        assert "Reproduced exactly" in dialog.result.text()
    assert reply.usage["cached_tokens"], "the second turn did not reuse the first one's prefix"
    close_window(window)


def test_a_stopped_replay_gives_no_verdict(smollm2):
    # The reply must run to its 20-token cap so the Stop lands mid-replay; an unseeded sampled
    # reply sometimes ended after 4 tokens and the replay finished before the Stop. So: the
    # first of a few fixed seeds whose reply reaches the cap.
    for seed in range(10):
        request = GenerationRequest(
            messages=({"role": "user", "content": "Count to twenty."},),
            overrides={**SAMPLED, "max_new_tokens": 20, "seed": seed},
        )
        finished = list(generate(smollm2, request))[-1]
        if len(finished.token_ids) == 20:
            break
    assert len(finished.token_ids) == 20, "no seed gave a reply that reached its cap"
    receipt = build_receipt(smollm2, request, finished, "0" * 64)
    report = replay(smollm2, receipt, [], "0" * 64, CancelAfter(400))
    assert report.stopped and not report.identical and report.divergence is None
    assert report.replayed_tokens < report.original_tokens == len(finished.token_ids)
    full = replay(smollm2, receipt, [], "0" * 64)
    assert full.identical and not full.stopped
