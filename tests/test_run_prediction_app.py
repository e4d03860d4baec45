"""Will it run here? in the window: the library's per-file estimate (computed off the GUI thread,
a warning when the model will not fit), and the loaded model's prediction error in the usage
panel. Fake predictions (no probe, no model load)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor

from app.features.run_prediction import PREDICTION_TIP, RunPredictionController
from app.library.prediction_runner import PredictionRunner
from app.library.scan_runner import LibraryScanRunner
from app.theme import text_color
from app.views.library_dialog import PREDICTION_COLUMN, LibraryDialog
from app.views.model_bar import ModelBar
from app.views.usage_panel import UsagePanel
from engine.errors import UnsupportedModelError
from engine.run_prediction import RunPrediction
from engine.types import ModelInfo
from tests.app_fakes import WAIT_MS

FIXTURES = Path(__file__).parent / "fixtures"
GB = 1_000_000_000


def fake_prediction(path: str, *, memory: int, free: int | None, decode: float) -> RunPrediction:
    return RunPrediction(
        path=path,
        n_ctx=4096,
        cache_type="f16",
        threads=2,
        kernel_path="vnni",
        weights_bytes=memory - 300_000_000,
        kv_bytes=200_000_000,
        overhead_bytes=100_000_000,
        available_bytes=free,
        decode_tok_s=decode,
        prefill_tok_s=250.0,
        bandwidth_bytes_per_s=3e10,
    )


class FakePredictor(QObject):
    """A PredictionRunner's signals; answers each request on a thread like the real one."""

    predicted = Signal(str, object)
    failed = Signal(str, str)

    def __init__(self, answers: dict[str, RunPrediction | str]):
        super().__init__()
        self.answers = answers
        self.requests: list[tuple] = []
        self.threads: list[str] = []

    def request(self, paths, n_ctx, cache_type, threads=0):
        self.requests.append((sorted(paths), n_ctx, cache_type, threads))

        def run():
            self.threads.append(threading.current_thread().name)
            for path in paths:
                answer = self.answers[Path(path).name]
                if isinstance(answer, str):
                    self.failed.emit(path, answer)
                else:
                    self.predicted.emit(path, replace_path(answer, path))

        threading.Thread(target=run, name="fake-prediction").start()


def replace_path(p: RunPrediction, path: str) -> RunPrediction:
    from dataclasses import replace

    return replace(p, path=path)


@pytest.fixture
def models(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("tiny_llama", "tiny_qwen3", "tiny_gemma3"):
        shutil.copy(FIXTURES / f"{name}.gguf", folder / f"{name}.gguf")
    (folder / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 60)
    return folder


def row_of(dialog, name: str) -> int:
    for row in range(dialog.table.rowCount()):
        if dialog.table.item(row, 0).text() == name:
            return row
    raise AssertionError(name)


def cell(dialog, name: str):
    return dialog.table.item(row_of(dialog, name), PREDICTION_COLUMN)


def test_library_shows_the_estimate_and_warns_when_it_will_not_fit(qtbot, models):
    predictor = FakePredictor(
        {
            "tiny_llama.gguf": fake_prediction(
                "", memory=1_300_000_000, free=9_800_000_000, decode=29.6
            ),
            "tiny_qwen3.gguf": fake_prediction("", memory=12 * GB, free=9_800_000_000, decode=3.2),
            "tiny_gemma3.gguf": "the file vanished",
        }
    )
    dialog = LibraryDialog(
        LibraryScanRunner(known=[]),
        [str(models)],
        predictor=predictor,
        load_options=(8192, "q8_0", 3),
    )
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: cell(dialog, "tiny_gemma3.gguf") is not None, timeout=WAIT_MS)
    qtbot.waitUntil(
        lambda: cell(dialog, "tiny_gemma3.gguf").text() == "no estimate", timeout=WAIT_MS
    )
    qtbot.waitUntil(lambda: "needs" in cell(dialog, "tiny_qwen3.gguf").text(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: "needs" in cell(dialog, "tiny_llama.gguf").text(), timeout=WAIT_MS)
    # asked once, off the GUI thread, for the runnable files only, with the app's load settings
    names = sorted(str(models / f"{n}.gguf") for n in ("tiny_gemma3", "tiny_llama", "tiny_qwen3"))
    assert predictor.requests == [(names, 8192, "q8_0", 3)]
    assert predictor.threads == ["fake-prediction"]

    fits = cell(dialog, "tiny_llama.gguf")
    assert fits.text() == "needs ~1.3 GB of 9.8 GB free · ~30 tok/s"
    assert "Weights" not in fits.text() and "KV cache 200 MB" in fits.toolTip()
    too_big = cell(dialog, "tiny_qwen3.gguf")
    assert too_big.text() == "⚠ needs ~12.0 GB of 9.8 GB free · ~3.2 tok/s: too big"
    bad = QColor(text_color(dialog.palette(), "bad"))
    assert too_big.foreground().color() == bad
    assert fits.foreground().color() != bad
    assert "does NOT fit" in too_big.toolTip()
    assert "the file vanished" in cell(dialog, "tiny_gemma3.gguf").toolTip()
    assert cell(dialog, "broken.gguf").text() == ""  # unreadable: nothing to predict

    # the detail line under the table says it too, in the warning colour
    dialog.select_path(str(models / "tiny_qwen3.gguf"))
    assert "does NOT fit" in dialog.detail.text() and text_color(dialog.palette(), "bad") in (
        dialog.detail.text()
    )
    # sorting by the column orders by memory, not by text
    dialog.table.sortItems(PREDICTION_COLUMN, Qt.AscendingOrder)
    assert dialog.table.item(0, 0).text() in ("broken.gguf", "tiny_gemma3.gguf")
    assert dialog.table.item(dialog.table.rowCount() - 1, 0).text() == "tiny_qwen3.gguf"


def test_without_a_predictor_the_column_is_hidden(qtbot, models):
    dialog = LibraryDialog(LibraryScanRunner(known=[]), [str(models)])
    qtbot.addWidget(dialog)
    assert dialog.table.isColumnHidden(PREDICTION_COLUMN)


def test_runner_predicts_off_the_gui_thread_and_reports_failures(qtbot, models):
    seen_threads = []
    machines = []

    def predict(path, n_ctx, cache_type, machine):
        seen_threads.append(threading.current_thread().name)
        if "qwen3" in path:
            raise UnsupportedModelError("architecture qwen9 is not supported")
        return fake_prediction(path, memory=GB, free=2 * GB, decode=float(n_ctx))

    runner = PredictionRunner(predict=predict, machine=lambda t: machines.append(t) or "m")
    got, failed = {}, {}
    runner.predicted.connect(lambda path, p: got.__setitem__(Path(path).name, p))
    runner.failed.connect(lambda path, why: failed.__setitem__(Path(path).name, why))
    paths = [str(models / n) for n in ("tiny_llama.gguf", "tiny_qwen3.gguf", "gone.gguf")]
    runner.request(paths, 1024, "f16", 0)
    qtbot.waitUntil(lambda: len(got) + len(failed) == 3, timeout=WAIT_MS)
    runner.wait()
    assert got["tiny_llama.gguf"].decode_tok_s == 1024.0
    assert "qwen9" in failed["tiny_qwen3.gguf"]
    assert failed["gone.gguf"] == "the file is gone"
    assert set(seen_threads) == {"run-prediction"} and machines == [None]  # measured once


def test_usage_panel_shows_the_prediction_and_its_error(qtbot):
    panel = UsagePanel()
    qtbot.addWidget(panel)
    usage = {"prompt_tokens": 12, "completion_tokens": 40, "decode_tok_s": 27.1}
    panel.show_usage(usage, "stop")
    assert panel.text_of("predicted_tok_s") == "—"
    panel.set_prediction(fake_prediction("/m/qwen.gguf", memory=GB, free=None, decode=29.0))
    panel.show_usage(usage, "stop")
    # (29.0 - 27.1) / 27.1 = +7.0%
    assert panel.text_of("predicted_tok_s") == "~29.0 tok/s (+7%)"
    tip = panel.fields["predicted_tok_s"].toolTip()
    assert "decode 27.1 tok/s, predicted 29.0 (+7%)" in tip and "qwen.gguf" in tip
    panel.show_usage({**usage, "decode_tok_s": 36.25}, "stop")  # (29 - 36.25) / 36.25 = -20%
    assert panel.text_of("predicted_tok_s") == "~29.0 tok/s (-20%)"
    # a server's reply is not this machine's speed: no comparison
    panel.show_usage({**usage, "measured_over_network": True}, "stop")
    assert panel.text_of("predicted_tok_s") == "—"
    panel.set_prediction(None)
    panel.show_usage(usage, "stop")
    assert panel.text_of("predicted_tok_s") == "—"


def test_loaded_model_gets_its_prediction_in_the_panel_and_model_bar(qtbot, tmp_path):
    panel, bar = UsagePanel(), ModelBar()
    qtbot.addWidget(panel)
    qtbot.addWidget(bar)
    controller = RunPredictionController(panel, bar, tmp_path)
    asked = []

    def predict(path, n_ctx, cache_type, machine):
        asked.append((Path(path).name, n_ctx, cache_type, machine))
        return fake_prediction(path, memory=GB, free=9_800_000_000, decode=29.0)

    controller.loaded_runner._predict = predict
    controller.loaded_runner._machine = lambda threads: f"machine({threads})"
    assert controller.library_runner is not controller.loaded_runner
    model = str(FIXTURES / "tiny_llama.gguf")
    bar.show_loaded("tiny_llama.gguf", "llama · context 2,048")
    info = ModelInfo(model, "tiny_llama.gguf", "llama", 2048, "chatml", kv_cache_type="q8_0")
    controller.model_loaded(info, 3)
    qtbot.waitUntil(lambda: panel.prediction is not None, timeout=WAIT_MS)
    controller.wait()
    assert asked == [("tiny_llama.gguf", 2048, "q8_0", "machine(3)")]
    assert PREDICTION_TIP + "needs ~1.0 GB of 9.8 GB free · ~29 tok/s" in bar.model_label.toolTip()
    panel.show_usage({"completion_tokens": 9, "decode_tok_s": 29.0}, "stop")
    assert panel.text_of("predicted_tok_s") == "~29.0 tok/s (+0%)"
    # a prediction of a model loaded before this one, arriving late, is not this model's
    controller._on_loaded_predicted(
        "/m/old.gguf", fake_prediction("/m/old.gguf", memory=GB, free=None, decode=5.0)
    )
    assert panel.prediction.decode_tok_s == 29.0
    controller.remote_loaded()
    assert panel.prediction is None


def test_usage_tooltip_says_when_other_programs_slow_the_reply(qtbot, monkeypatch):
    import app.views.usage_panel as usage_panel

    panel = UsagePanel()
    qtbot.addWidget(panel)
    panel.set_prediction(fake_prediction("/m/smol.gguf", memory=GB, free=None, decode=150.0))
    monkeypatch.setattr(usage_panel.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(usage_panel.os, "getloadavg", lambda: (7.0, 6.0, 4.0))
    panel.show_usage({"completion_tokens": 60, "decode_tok_s": 30.0}, "stop")
    assert panel.text_of("predicted_tok_s") == "~150.0 tok/s (+400%)"
    assert "load average 7.0 on 2 CPUs" in panel.fields["predicted_tok_s"].toolTip()
    monkeypatch.setattr(usage_panel.os, "getloadavg", lambda: (0.4, 0.3, 0.2))
    panel.show_usage({"completion_tokens": 60, "decode_tok_s": 140.0}, "stop")
    assert "load average" not in panel.fields["predicted_tok_s"].toolTip()


def test_runner_probes_again_once_per_session_and_keeps_the_better(qtbot, tmp_path, monkeypatch):
    """A probe taken while the machine was busy must not stay in the cache for good: the
    first request of each app session measures again and keeps the better value."""
    import engine.bandwidth_probe as bp
    from engine.run_prediction import planned_path

    cache = tmp_path / "bandwidth_probe.json"
    threads, path, cpu = planned_path(None)
    bp._write_cache(cache, bp.Bandwidth(10e9, bp.machine_key(threads, path, cpu), 0.0, 0.3))
    measured = iter([30e9, 20e9])
    calls = []
    monkeypatch.setattr(
        bp, "measure_read_bandwidth", lambda t: calls.append(t) or (next(measured), 0.3)
    )
    seen = []

    def predict(p, n_ctx, cache_type, machine):
        seen.append(machine.bandwidth_bytes_per_s)
        return fake_prediction(p, memory=GB, free=None, decode=1.0)

    model = str(FIXTURES / "tiny_llama.gguf")
    for _session in range(2):  # two app sessions
        runner = PredictionRunner(cache_path=cache, predict=predict)
        for _ in range(2):
            with qtbot.waitSignal(runner.predicted, timeout=WAIT_MS):
                runner.request([model], 512, "f16", 0)
            runner.wait()
    # session 1: 10 cached -> probe 30 kept; its second request uses the cache; session 2:
    # probe 20 < 30, the better one stays
    assert calls == [threads, threads]
    assert seen == [30e9, 30e9, 30e9, 30e9]
