"""End to end with the real engine and the embedded default model (SmolLM2-135M-Instruct):
type a question, get an answer, usage and TTFT filled in; JSON mode gives parseable output;
the headless --smoke mode the packaging smoke test relies on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.engine_bridge import RealEngine
from tests.app_fakes import close_window, make_window

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def model_path(smollm2_path):
    return str(smollm2_path)


def wait_reply(qtbot, window, timeout=180_000):
    return qtbot.waitSignal(
        window.session.busyChanged, timeout=timeout, check_params_cb=lambda busy: busy is False
    )


def test_question_gets_an_answer_with_usage_and_ttft(qtbot, tmp_path, model_path, monkeypatch):
    shown = []
    monkeypatch.setattr("PySide6.QtWidgets.QMessageBox.critical", lambda *a, **k: shown.append(a))
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=model_path)
    assert window.controller.model.architecture == "llama"
    assert window.preset_panel.isEnabled() and window.preset_panel.table.rowCount() > 5
    assert window.session.set_preset_value("max_new_tokens", 12) is None
    assert window.preset_panel.source_text("max_new_tokens") == "override"
    # greedy, stated: SmolLM2 states no sampling values, so chat would sample with the LocalChat
    # chat defaults and end at a different length each run
    assert window.session.set_preset_value("do_sample", False) is None

    with wait_reply(qtbot, window):
        window.input.setPlainText("What is the capital of France?")
        qtbot.keyClick(window.input, Qt.Key_Return)
    assert shown == []
    reply = window.store.messages(window.session.conversation_id)[-1]
    assert reply.role == "assistant" and reply.content.strip()
    assert reply.status == "complete" and reply.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage["prompt_tokens"] > 10 and 1 <= usage["completion_tokens"] <= 12
    assert usage["ttft_ms"] > 0 and usage["decode_tok_s"] > 0
    panel = window.usage_panel
    assert int(panel.text_of("prompt_tokens")) == usage["prompt_tokens"]
    assert int(panel.text_of("completion_tokens")) == usage["completion_tokens"]
    assert "tok/s" in panel.text_of("decode_tok_s")
    assert panel.context_bar.value() == usage["context_used"]
    assert window.ttft_panel.strip.values_ms == [pytest.approx(usage["ttft_ms"])]
    assert "ms" in window.ttft_panel.current.text()
    assert len(window.token_inspector.tokens) == usage["completion_tokens"]
    assert window.token_inspector.tokens[0]["top"], "top alternatives requested (top_logprobs=5)"

    # Second turn: the prefix cache reuses the first turn's KV state.
    with wait_reply(qtbot, window):
        window.input.setPlainText("And of Italy?")
        qtbot.keyClick(window.input, Qt.Key_Return)
    second = window.store.messages(window.session.conversation_id)[-1]
    assert second.content.strip() and second.usage["cached_tokens"] > 0
    close_window(window)


def test_json_schema_mode_gives_parseable_output(qtbot, tmp_path, model_path):
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=model_path)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    window.json_bar.set_schema(json.dumps(schema), schema)
    window.json_bar._previous_index = 0
    window.json_bar.combo.setCurrentIndex(2)  # schema already set: no dialog
    assert window.session.json_mode == "schema"
    window.session.set_preset_value("max_new_tokens", 40)
    with wait_reply(qtbot, window):
        window.input.setPlainText("Name the capital of France as JSON.")
        qtbot.keyClick(window.input, Qt.Key_Return)
    reply = window.store.messages(window.session.conversation_id)[-1]
    value = json.loads(reply.content)
    assert set(value) == {"city"} and isinstance(value["city"], str)
    assert reply.finish_reason == "grammar_complete"
    assert window.chat_view.widgets[-1].json_status.text() == "✔ valid JSON object"
    close_window(window)


def test_smoke_mode_prints_a_reply(model_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    result = subprocess.run(
        [sys.executable, "-m", "app", "--smoke", "Say hello.", "--model", model_path],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "[smoke] finish=" in result.stderr


def test_long_chat_is_fitted_by_dropping_oldest_turns(model_path):
    """RealEngine fits a chat longer than the context (n_ctx=256) with engine.context_fit."""
    from app.engine_bridge import ContextTrimmed
    from engine.cancel import CancelToken
    from engine.events import Finished
    from engine.types import GenerationRequest

    engine = RealEngine()
    lm = engine.load(model_path, n_ctx=256, n_threads=None, progress=lambda *a: None)
    try:
        history = []
        for i in range(6):
            history += [
                {"role": "user", "content": f"Question {i}: " + "tell me more " * 12},
                {"role": "assistant", "content": f"Answer {i}: " + "here is more " * 12},
            ]
        history.append({"role": "user", "content": "Last question: say hi."})
        events = list(
            engine.generate(
                lm,
                GenerationRequest(messages=tuple(history), overrides={"max_new_tokens": 4}),
                CancelToken(),
            )
        )
        trimmed, finished = events[0], events[-1]
        assert isinstance(trimmed, ContextTrimmed) and trimmed.dropped_turns >= 1
        assert trimmed.prompt_tokens + 4 <= 256 and trimmed.context_limit == 256
        assert isinstance(finished, Finished) and finished.finish_reason in ("stop", "length")
        assert finished.usage.prompt_tokens == trimmed.prompt_tokens
    finally:
        engine.unload(lm)


def test_json_object_mode_gives_parseable_output(qtbot, tmp_path, model_path):
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=model_path)
    window.json_bar.combo.setCurrentIndex(1)  # any JSON object
    assert window.session.json_mode == "object"
    window.session.set_preset_value("max_new_tokens", 48)
    window.session.set_preset_value("do_sample", False)  # greedy: the object closes within 48
    with wait_reply(qtbot, window):
        window.input.setPlainText(
            "Give me a JSON object describing Paris with keys name and country."
        )
        qtbot.keyClick(window.input, Qt.Key_Return)
    reply = window.store.messages(window.session.conversation_id)[-1]
    assert reply.finish_reason == "grammar_complete"
    assert isinstance(json.loads(reply.content), dict)
    assert window.chat_view.widgets[-1].json_status.text() == "✔ valid JSON object"
    close_window(window)
