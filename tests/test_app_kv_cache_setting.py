"""Settings > KV cache: the choice is offered from engine.types.KV_CACHE_TYPES, saved, survives
a hand-edited file (an unknown value falls back to f16), and reaches the engine's load through
controller -> worker -> bridge; the real bridge's ModelInfo and load line say which type runs."""

import json

from PySide6.QtWidgets import QDialog

from app.settings import Settings, SettingsFile
from app.views.settings_dialog import SettingsDialog
from engine.types import KV_CACHE_TYPES
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


def test_dialog_offers_every_cache_type_and_returns_the_choice(qtbot):
    dialog = SettingsDialog(Settings(kv_cache_type="q8_0"))
    qtbot.addWidget(dialog)
    offered = [dialog.kv_cache.itemData(i) for i in range(dialog.kv_cache.count())]
    assert offered == list(KV_CACHE_TYPES)
    assert dialog.kv_cache.currentData() == "q8_0"
    dialog.kv_cache.setCurrentIndex(dialog.kv_cache.findData("f16"))
    assert dialog.result_settings().kv_cache_type == "f16"


def test_an_unknown_saved_cache_type_falls_back_to_f16(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"kv_cache_type": "q3_bogus"}))
    assert SettingsFile(path).load().kv_cache_type == "f16"


def test_the_chosen_cache_type_is_saved_and_used_by_the_next_load(qtbot, tmp_path, monkeypatch):
    engine = FakeEngine()
    window = make_window(qtbot, tmp_path, engine)
    assert engine.loads[-1][3] == "f16"

    def choose_q8(self):
        self.kv_cache.setCurrentIndex(self.kv_cache.findData("q8_0"))
        return QDialog.Accepted

    monkeypatch.setattr(SettingsDialog, "exec", choose_q8)
    window.open_settings()
    assert window.settings_file.load().kv_cache_type == "q8_0"
    with qtbot.waitSignal(window.controller.modelLoaded, timeout=WAIT_MS):
        window.open_model("/models/other.gguf")
    assert engine.loads[-1] == ("/models/other.gguf", 4096, None, "q8_0")
    close_window(window)


def test_real_bridge_loads_with_the_cache_type_and_describes_it(smollm2_path):
    from app.engine_bridge import RealEngine

    bridge = RealEngine()
    lm = bridge.load(
        smollm2_path, n_ctx=256, n_threads=1, progress=lambda *a: None, cache_type="q8_0"
    )
    try:
        assert lm.model.new_cache(8).cache_type == "q8_0"
        info = bridge.describe(lm)
        assert info.kv_cache_type == "q8_0"
        assert "KV cache q8_0" in info.summary
    finally:
        bridge.unload(lm)
