"""The thinking switch: a template that reads enable_thinking (Qwen3's) is detected, the request's
choice reaches every render (the message spans are still found), and the window shows the
switch only for such a model and sends what it says."""

from PySide6.QtCore import Qt

from engine.chat_template import CHATML_TEMPLATE, ChatTemplate
from engine.generate import template_kwargs
from engine.prompt_ids import render_with_message_spans
from engine.types import GenerationRequest, ModelInfo
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window

# The part of Qwen3's template that implements the switch (the full one is 4 KB of tool calls).
QWEN3_LIKE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{%- endif %}{%- endif %}"
)
CHAT = [{"role": "user", "content": "Why is the sky blue?"}]


def test_only_a_template_that_reads_enable_thinking_has_the_switch():
    assert ChatTemplate(QWEN3_LIKE, name="qwen3").accepts_enable_thinking
    assert not ChatTemplate(CHATML_TEMPLATE, name="chatml").accepts_enable_thinking
    assert not ChatTemplate("{{ not_enable_thinking_x }}", name="x").accepts_enable_thinking


def test_the_switch_reaches_the_render_and_the_message_spans_are_still_found():
    template = ChatTemplate(QWEN3_LIKE, name="qwen3")
    plain = lambda _text: False  # noqa: E731
    default, spans = render_with_message_spans(template, CHAT, plain)
    off, off_spans = render_with_message_spans(
        template,
        CHAT,
        plain,
        template_kwargs=template_kwargs(GenerationRequest(enable_thinking=False)),
    )
    on, _ = render_with_message_spans(
        template,
        CHAT,
        plain,
        template_kwargs=template_kwargs(GenerationRequest(enable_thinking=True)),
    )
    assert off.endswith("<|im_start|>assistant<think>\n\n</think>")
    assert default == on and "<think>" not in on
    start, end = off_spans[0]
    assert off[start:end] == "Why is the sky blue?" and spans == off_spans
    assert template_kwargs(GenerationRequest()) == {}  # undefined for the template: its default


class ThinkingModel(FakeEngine):
    def describe(self, lm):
        info = super().describe(lm)
        return ModelInfo(**{**info.__dict__, "thinking_switch": True})


def send(qtbot, window, text):
    window.input.setPlainText(text)
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        qtbot.keyClick(window.input, Qt.Key_Return)


def test_the_window_shows_the_switch_for_such_a_model_and_sends_its_state(qtbot, tmp_path):
    engine = ThinkingModel(replies=["thought", "direct"])
    window = make_window(qtbot, tmp_path, engine)
    assert not window.thinking_box.isHidden() and window.thinking_box.isChecked()
    send(qtbot, window, "one")
    window.thinking_box.setChecked(False)
    send(qtbot, window, "two")
    assert [r.enable_thinking for r in engine.requests] == [True, False]
    close_window(window)

    plain = FakeEngine(replies=["ok"])
    window = make_window(qtbot, tmp_path / "other", plain)
    assert window.thinking_box.isHidden()
    send(qtbot, window, "three")
    assert plain.requests[-1].enable_thinking is None  # the template decides
    close_window(window)
