"""What the README promises about the window, each checked once: the repaint cap, live usage while
a reply streams, the Ctrl+O / Ctrl+E shortcuts, opening the built-in model when none is chosen,
and the preset panel over the engine's real preset resolution (not the fake's copy of it)."""

import dataclasses
import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from app.views import main_window
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


def test_streaming_is_drawn_by_the_frame_timer_at_most_30_times_a_second(qtbot, tmp_path):
    words = " ".join(f"w{i}" for i in range(500))
    # 2 ms per token: tokens (and the worker's batches of them) arrive far more often than the
    # ~33 ms frame ticks, which is when a per-token repaint would show up
    window = make_window(qtbot, tmp_path, FakeEngine(replies=[words], token_delay_s=0.002))
    assert window.frame_timer.interval() >= 1000 / 30 - 1  # ~30 Hz
    ticks = []
    window.frame_timer.timeout.connect(lambda: ticks.append(1))
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        window.input.setPlainText("flood")
        window.send()
    assert window.chat_view.widgets[-1].text == words
    # The view draws once per timer tick at most (plus the final flush), never once per token or
    # per batch of tokens. Structural: true however slow or fast the machine is.
    assert window.chat_view.frames_drawn <= len(ticks) + 1
    close_window(window)


def test_usage_panel_is_live_while_the_reply_streams(qtbot, tmp_path):
    engine = FakeEngine(replies=["one two three four five"], pause_after=3)
    window = make_window(qtbot, tmp_path, engine)
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        window.input.setPlainText("count")
        window.send()
        qtbot.waitUntil(
            lambda: window.usage_panel.text_of("completion_tokens") == "3", timeout=WAIT_MS
        )
        assert window.usage_panel.title() == "Usage — generating…"
        assert window.session.busy
        engine.gate.set()
    assert window.usage_panel.text_of("completion_tokens") == "5"
    assert window.usage_panel.title() == "Usage — selected reply"
    close_window(window)


def test_ctrl_o_opens_a_model_and_ctrl_e_exports_the_chat(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["Exported answer."]))
    assert (
        window.open_action.shortcut().toString(),
        window.export_action.shortcut().toString(),
    ) == (
        "Ctrl+O",
        "Ctrl+E",
    )
    chosen = str(tmp_path / "chosen.gguf")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (chosen, ""))
    with qtbot.waitSignal(window.controller.modelLoaded, timeout=WAIT_MS) as loaded:
        qtbot.keyClick(window, Qt.Key_O, Qt.ControlModifier)
    assert loaded.args[0].path == chosen

    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        window.input.setPlainText("Export me")
        window.send()
    target = tmp_path / "chat.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    qtbot.keyClick(window, Qt.Key_E, Qt.ControlModifier)
    qtbot.waitUntil(target.is_file, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: "messages" in target.read_text(), timeout=WAIT_MS)
    record = json.loads(target.read_text())
    assert [m["content"] for m in record["messages"]] == ["Export me", "Exported answer."]
    close_window(window)


def test_with_no_model_chosen_the_built_in_model_is_opened(qtbot, tmp_path, monkeypatch):
    import engine.model_files

    built_in = tmp_path / "built-in.gguf"
    monkeypatch.setattr(engine.model_files, "default_model_path", lambda: built_in)
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    assert window.settings.last_model in (None, "")
    with qtbot.waitSignal(window.controller.modelLoaded, timeout=WAIT_MS) as loaded:
        window.start()
    assert loaded.args[0].path == str(built_in)
    close_window(window)


def test_the_last_model_is_reopened_when_it_still_exists(qtbot, tmp_path, monkeypatch):
    import engine.model_files

    monkeypatch.setattr(engine.model_files, "default_model_path", lambda: tmp_path / "default.gguf")
    last = tmp_path / "last.gguf"
    last.write_bytes(b"GGUF")
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    window.settings.last_model = str(last)
    with qtbot.waitSignal(window.controller.modelLoaded, timeout=WAIT_MS) as loaded:
        window.start()
    assert loaded.args[0].path == str(last)
    close_window(window)


class RealPresetEngine(FakeEngine):
    """The fake engine's scripted replies, but presets resolved by engine.presets through the
    bridge's real `resolve_preset`, over a model file with a generation_config.json beside it."""

    def __init__(self, model_dir, metadata):
        super().__init__()
        self.model_dir, self.metadata = model_dir, metadata

    def describe(self, lm):
        # The GUI resolves presets from the ModelInfo the worker hands over (never the model).
        from engine.presets import sampling_metadata

        info = super().describe(lm)
        return dataclasses.replace(info, sampling_metadata=sampling_metadata(self.metadata))

    def resolve_preset(self, model, saved, overrides):
        from app.engine_bridge import RealEngine

        return RealEngine().resolve_preset(model, saved, overrides)


def test_preset_panel_over_the_real_preset_resolution(qtbot, tmp_path):
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    model = model_dir / "real-preset.gguf"
    (model_dir / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.6, "top_p": None})
    )
    engine = RealPresetEngine(model_dir, {"general.sampling.top_k": 20})
    window = make_window(qtbot, tmp_path, engine, model_path=str(model))
    panel = window.preset_panel
    shown = {
        name: (panel.value_text(name), panel.source_text(name))
        for name in ("temperature", "do_sample", "top_k", "top_p", "min_p")
    }
    assert shown == {
        "temperature": ("0.6", "generation_config.json"),
        "do_sample": ("True", "generation_config.json"),
        "top_k": ("20", "gguf metadata"),
        "top_p": ("1.0", "default"),
        "min_p": ("0.0", "default"),
    }

    panel.table.item(panel.row_of("top_p"), 1).setText("1.5")
    assert panel.error_label.isVisible()
    assert panel.error_label.text().startswith("Refused: top_p=1.5 is invalid: must be ")
    assert panel.error_label.text().endswith("(value from override)")
    assert panel.value_text("top_p") == "1.0"

    panel.table.item(panel.row_of("top_k"), 1).setText("5")
    assert not panel.error_label.isVisible()
    assert (panel.value_text("top_k"), panel.source_text("top_k")) == ("5", "override")
    panel.save_button.click()
    assert panel.source_text("top_k") == "saved preset"
    assert window.settings_file.load().presets[str(model)] == {"top_k": 5}
    panel.reset_button.click()
    assert (panel.value_text("top_k"), panel.source_text("top_k")) == ("20", "gguf metadata")
    close_window(window)


def test_frame_interval_constant_is_what_the_window_uses():
    assert main_window.FRAME_MS <= 34  # README: "up to 30 repaints per second"
