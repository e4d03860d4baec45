"""Will it run here? in the window: the model library's per-file estimate, and after a real load
the loaded model's prediction next to the speed it really reached.

Two PredictionRunners (app/library/prediction_runner.py), so a load never supersedes the
library's list of requests nor the other way round. Both keep the bandwidth probe's result in
the app's data directory (bandwidth_probe.json beside settings.json, so --data-dir moves it
too). After a local model loads, its prediction (at the context, KV cache type and threads it
was really loaded with) goes to the usage panel, which shows it beside each reply's decode
speed ("~29.0 tok/s (+7%)"), and into the model bar's tooltip.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject

from app.library.prediction_runner import PredictionRunner
from engine.types import ModelInfo

PREDICTION_TIP = "Predicted here before loading: "


class RunPredictionController(QObject):
    def __init__(self, usage_panel, model_bar, data_dir: Path | None, parent=None):
        super().__init__(parent)
        self.usage_panel = usage_panel
        self.model_bar = model_bar
        # imported here: engine.bandwidth_probe loads numpy, and the window opens before it does
        from engine.bandwidth_probe import CACHE_FILE

        cache = data_dir / CACHE_FILE if data_dir is not None else None
        self.library_runner = PredictionRunner(self, cache_path=cache)
        self.loaded_runner = PredictionRunner(self, cache_path=cache)
        self.loaded_runner.predicted.connect(self._on_loaded_predicted)
        self._loaded_path: str | None = None

    def model_loaded(self, info: ModelInfo, threads: int) -> None:
        """A local model is loaded: predict it as loaded (the panel clears until then)."""
        self._loaded_path = info.path
        self.usage_panel.set_prediction(None)
        self.loaded_runner.request([info.path], info.n_ctx, info.kv_cache_type, threads)

    def remote_loaded(self) -> None:
        """A server's model: nothing of this machine to predict."""
        self._loaded_path = None
        self.usage_panel.set_prediction(None)

    def _on_loaded_predicted(self, path: str, prediction) -> None:
        if path != self._loaded_path:  # another model was loaded since
            return
        self.usage_panel.set_prediction(prediction)
        label = self.model_bar.model_label
        tip = label.toolTip().split("\n" + PREDICTION_TIP)[0]
        label.setToolTip(
            f"{tip}\n{PREDICTION_TIP}{prediction.summary()}, prefill "
            f"~{prediction.prefill_tok_s:.0f} tok/s"
        )

    def wait(self, timeout: float = 10.0) -> None:
        """For tests and shutdown."""
        self.library_runner.wait(timeout)
        self.loaded_runner.wait(timeout)
