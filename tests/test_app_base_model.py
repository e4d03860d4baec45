"""A base model in the window (issue 31, defect 8): the banner says it has no chat template and
offers plain completion, which sends the typed text as it is (no template tokens), remembered for
the model file; a reply the engine stopped for repeating itself says so in its header."""

from __future__ import annotations

from dataclasses import replace

import pytest
from app_fakes import WAIT_MS, FakeEngine, close_window, make_window
from tiny_models import write_tiny_model

from app.engine_bridge import RealEngine
from app.settings import SettingsFile
from engine.events import Finished
from engine.gguf import open_gguf
from engine.tokenizer import Tokenizer
from engine.types import FinishReason, MessageStatus

TEXT = "The capital of France is"
REPEATING = "stopped: the model was repeating itself"


@pytest.fixture
def base_model(tmp_path):
    """A tiny llama with SmolLM2's tokenizer and no chat template: a base model."""
    return write_tiny_model(
        tmp_path / "tiny-base.gguf", "llama", omit_keys=("tokenizer.chat_template",)
    )


def send(qtbot, window, text: str):
    window.input.setPlainText(text)
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as done:
        window.send()
    return done.args[0]


def test_a_base_model_is_named_and_plain_completion_sends_the_text_as_it_is(
    qtbot, tmp_path, base_model
):
    window = make_window(
        qtbot, tmp_path, RealEngine(tmp_path / "digests.json"), model_path=str(base_model)
    )
    try:
        assert window.backends.model.base_model
        banner = window.notice_banner
        shown = banner.keys()  # the banner's notices, in order (a list, not a dict)
        assert "base-model" in shown and banner.isVisible()
        assert "base model without a chat template" in banner.text
        assert banner.action_button.isVisible()
        assert banner.action_button.text() == "Use plain completion"
        assert window.session.set_preset_value("max_new_tokens", 4) is None
        tokenizer = Tokenizer.from_gguf(open_gguf(base_model))
        im_start = tokenizer.token_id("<|im_start|>")
        assert im_start is not None

        # As a chat, the fallback ChatML template wraps the text in turn tokens.
        chat = send(qtbot, window, TEXT)
        chat_prompt = window.session.receipt(chat.id)["prompt"]["token_ids"]
        assert im_start in chat_prompt

        banner.action_button.click()
        assert window.session.plain_completion
        assert banner.action_button.text() == "Chat instead"
        assert "Plain completion" in banner.text
        assert "continue" in window.input.placeholderText()
        stored = SettingsFile(tmp_path / "settings.json").load()
        assert stored.completion_models == [str(base_model)]

        window.system_prompt.setText("You are a pirate.")  # a base model is given no system turn
        completion = send(qtbot, window, TEXT)
        receipt = window.session.receipt(completion.id)
        assert receipt["prompt"]["messages"] is None
        # exactly the typed text, as the tokenizer reads it with the model's BOS
        assert receipt["prompt"]["token_ids"] == tokenizer.encode(TEXT, add_special=True)
        assert completion.status == MessageStatus.COMPLETE

        banner.action_button.click()  # back to chat: the template again
        assert not window.session.plain_completion
        assert SettingsFile(tmp_path / "settings.json").load().completion_models == []
        again = send(qtbot, window, TEXT)
        assert im_start in window.session.receipt(again.id)["prompt"]["token_ids"]
    finally:
        close_window(window)


def test_plain_completion_is_remembered_for_the_model_file(qtbot, tmp_path, base_model):
    settings_file = SettingsFile(tmp_path / "settings.json")
    settings = settings_file.load()
    settings.completion_models = [str(base_model)]
    settings_file.save(settings)
    window = make_window(
        qtbot, tmp_path, RealEngine(tmp_path / "digests.json"), model_path=str(base_model)
    )
    try:
        assert window.session.plain_completion
        assert window.notice_banner.action_button.text() == "Chat instead"
    finally:
        close_window(window)


def test_a_chat_model_gets_no_base_model_notice_and_no_plain_completion(qtbot, tmp_path):
    settings_file = SettingsFile(tmp_path / "settings.json")
    settings = settings_file.load()
    path = "/models/fake-model.gguf"
    settings.completion_models = [path]  # even if the file was once listed
    settings_file.save(settings)
    engine = FakeEngine()
    window = make_window(qtbot, tmp_path, engine, model_path=path)
    try:
        shown = window.notice_banner.keys()
        assert "base-model" not in shown
        assert not window.notice_banner.action_button.isVisible()
        assert not window.session.plain_completion
        window.session.set_plain_completion(True)  # not for a chat model
        assert not window.session.plain_completion
        send(qtbot, window, "Hello there")
        assert engine.requests[-1].messages is not None and engine.requests[-1].prompt is None
    finally:
        close_window(window)


class RepeatingEngine(FakeEngine):
    """The fake engine, with every reply ended by the repetition stop."""

    def generate(self, lm, request, cancel):
        for event in super().generate(lm, request, cancel):
            if isinstance(event, Finished):
                event = replace(event, finish_reason=FinishReason.REPETITION)
            yield event


def test_a_repetition_stop_says_why_in_the_message_header_and_the_usage_panel(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, RepeatingEngine(replies=["again and again"]))
    try:
        stored = send(qtbot, window, "Say it")
        assert stored.finish_reason == "repetition" and stored.status == MessageStatus.COMPLETE
        widget = window.chat_view.widget_for(stored.id)
        assert REPEATING in widget.status_label.text()
        assert widget.status_label.isVisible()
        assert window.usage_panel.fields["finish_reason"].text() == REPEATING
        # and when the chat is opened again
        window.session.open_conversation(stored.conversation_id)
        assert REPEATING in window.chat_view.widget_for(stored.id).status_label.text()
    finally:
        close_window(window)
