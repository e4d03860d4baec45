"""Compare side by side: the logic (divergence, preset parsing, shading), two columns streaming
at once through the worker (a fake engine), and the real engine on SmolLM2: greedy vs a sampled
preset, the divergence marked at the first differing token of two direct engine runs."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.compare import distribution_text, first_divergence, reply_html, shade
from app.views.compare_dialog import parse_preset
from engine.events import TokenSampled, TopAlternative
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


def tok(i: int, token_id: int, text: str = "x", logprob: float = -0.1, top=()) -> TokenSampled:
    return TokenSampled(index=i, token_id=token_id, text=text, logprob=logprob, top=top)


def test_first_divergence():
    a = [tok(0, 5), tok(1, 6), tok(2, 7)]
    assert first_divergence(a, [tok(0, 5), tok(1, 6), tok(2, 7)]) is None
    assert first_divergence(a, [tok(0, 5), tok(1, 9), tok(2, 7)]) == 1
    assert first_divergence(a, [tok(0, 4)]) == 0
    assert first_divergence(a, a[:2]) == 2  # one column ended first
    assert first_divergence([], []) is None


def test_parse_preset():
    assert parse_preset("temperature=0.8 top_k=40, seed=1 do_sample=true") == {
        "temperature": 0.8,
        "top_k": 40,
        "seed": 1,
        "do_sample": True,
    }
    assert parse_preset("") == {}
    with pytest.raises(ValueError, match="name=value"):
        parse_preset("temperature")
    with pytest.raises(ValueError, match="top_p=high"):
        parse_preset("top_p=high")


def test_confidence_shading_and_distribution():
    sure, unsure = shade(0.99), shade(0.2)
    alpha = lambda s: float(s.rsplit(",", 1)[1].rstrip(")"))  # noqa: E731
    assert alpha(sure) < 0.05 < alpha(unsure)
    top = (TopAlternative(7, " the", -0.5), TopAlternative(8, " a", -1.2))
    html = reply_html([tok(0, 7, " the", -0.5, top), tok(1, 9, "<b>", -3.0)], divergence=1)
    assert "&lt;b&gt;" in html and "border: 2px solid #d00" in html
    assert html.count("border") == 1
    rows = distribution_text(tok(0, 8, " a", -1.2, top))
    assert [r[0] for r in rows] == [" the", " a"] and rows[1][2] is True


class TwoReplies(FakeEngine):
    """Column A gets one reply, column B another. Before A's third event, B must already have
    produced one: true only when the columns stream at the same time, not one after the other."""

    def __init__(self):
        super().__init__(replies=["one two three four five", "uno dos tres"])
        self.yielded = [0, 0]
        self.overlapped = False

    def generate(self, lm, request, cancel):
        column = len(self.requests)
        events = super().generate(lm, request, cancel)

        def counted():
            for i, event in enumerate(events):
                if column == 0 and i == 2:
                    self.overlapped = self.yielded[1] > 0
                self.yielded[column] += 1
                yield event

        return counted()


def test_two_columns_stream_at_once(qtbot, tmp_path):
    engine = TwoReplies()
    window = make_window(qtbot, tmp_path, engine)
    try:
        dialog = window.open_compare()
        assert dialog is not None and window.compare_action.shortcut().toString() == "Ctrl+K"
        dialog.prompt.setPlainText("Count to five.")
        dialog.columns[1].preset.setText("temperature=0.9 seed=4")
        with qtbot.waitSignal(window.controller.compareDone, timeout=WAIT_MS):
            qtbot.mouseClick(dialog.run_button, Qt.LeftButton)
        assert [r.overrides for r in engine.requests] == [
            {"temperature": 0},
            {"temperature": 0.9, "seed": 4},
        ]
        assert all(r.messages[-1]["content"] == "Count to five." for r in engine.requests)
        assert all(r.top_logprobs == 5 for r in engine.requests)
        assert engine.overlapped, "column B had not started when A was two events in"
        a, b = dialog.states
        assert a.text == "one two three four five" and b.text == "uno dos tres"
        assert a.finished is not None and b.finished is not None
        assert "TTFT" in dialog.columns[0].usage.text() and "TTFT" in dialog.columns[1].usage.text()
        # The fake's token ids are 1000 + position in both columns: same ids up to B's end.
        assert dialog.divergence == 3
        assert window.store.messages(window.session.conversation_id) == []  # nothing stored
        dialog.reject()
    finally:
        close_window(window)


def test_bad_preset_is_reported_not_run(qtbot, tmp_path):
    engine = FakeEngine()
    window = make_window(qtbot, tmp_path, engine)
    try:
        dialog = window.open_compare()
        dialog.prompt.setPlainText("hi")
        dialog.columns[0].preset.setText("temperature")
        dialog.run()
        assert "Column A" in dialog.status.text() and engine.requests == []
        dialog.reject()
    finally:
        close_window(window)


def test_real_model_divergence_is_the_first_differing_token(qtbot, tmp_path, smollm2_path, smollm2):
    from app.engine_bridge import RealEngine
    from engine.cancel import CancelToken
    from engine.generate import generate
    from engine.types import GenerationRequest

    presets = ("temperature=0 max_new_tokens=20", "temperature=1.3 seed=7 max_new_tokens=20")
    prompt = "Write one sentence about autumn."
    # Independent runs of the engine itself, one preset at a time, no compare machinery.
    direct = []
    for text in presets:
        request = GenerationRequest(
            messages=({"role": "user", "content": prompt},), overrides=parse_preset(text)
        )
        done = [
            e for e in generate(smollm2, request, CancelToken()) if type(e).__name__ == "Finished"
        ]
        direct.append(list(done[0].token_ids))
    expected = next(i for i, (x, y) in enumerate(zip(*direct, strict=False)) if x != y)

    window = make_window(
        qtbot, tmp_path, RealEngine(digest_cache=tmp_path / "d.json"), model_path=str(smollm2_path)
    )
    try:
        dialog = window.open_compare()
        dialog.prompt.setPlainText(prompt)
        for column, text in zip(dialog.columns, presets, strict=True):
            column.preset.setText(text)
        with qtbot.waitSignal(window.controller.compareDone, timeout=120_000):
            dialog.run()
        a, b = dialog.states
        assert [t.token_id for t in a.tokens][: len(direct[0])] == direct[0]
        assert [t.token_id for t in b.tokens][: len(direct[1])] == direct[1]
        assert dialog.divergence == expected
        assert f"generated token {expected + 1}" in dialog.divergence_view.toPlainText()
        assert "border: 2px solid #d00" in reply_html(a.tokens, dialog.divergence)
        dialog.reject()
    finally:
        close_window(window)
