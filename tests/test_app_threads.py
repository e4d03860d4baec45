"""Thread ownership: the loaded model belongs to the worker thread. The GUI thread gets plain data
(ModelInfo) over the signal and resolves presets from it, never from the model object."""

import threading
from pathlib import Path

from app.controller import EngineController
from app.engine_bridge import RealEngine
from engine.presets import resolve_preset
from engine.types import ModelInfo, ResolvedPreset
from tests.app_fakes import FakeEngine, FakeModel


class WorkerOwnedModel:
    """A fake model that records every attribute read made off the thread that created it."""

    def __init__(self, model: FakeModel):
        self._model, self._owner, self.foreign_reads = model, threading.current_thread(), []

    def __getattr__(self, name):
        if threading.current_thread() is not self._owner:
            self.foreign_reads.append((threading.current_thread().name, name))
        return getattr(self._model, name)


class PathReadingEngine(FakeEngine):
    """Resolves presets from `.path`, as the real bridge does (the checkpoint's folder)."""

    def load(self, path, *, n_ctx, n_threads, progress, cache_type="f16"):
        self.model = WorkerOwnedModel(
            super().load(path, n_ctx=n_ctx, n_threads=n_threads, progress=progress)
        )
        return self.model

    def resolve_preset(self, model, saved, overrides):
        assert model.path
        return super().resolve_preset(model, saved, overrides)


def test_the_gui_thread_never_reads_the_workers_model(qtbot):
    engine = PathReadingEngine()
    controller = EngineController(engine)
    try:
        with qtbot.waitSignal(controller.modelLoaded, timeout=10_000) as loaded:
            controller.load_model("/models/fake.gguf")
        assert isinstance(loaded.args[0], ModelInfo)
        view = controller.resolve_preset({"temperature": 0.5}, None)  # on the GUI thread
        assert view.values["temperature"] == 0.5
        assert engine.model.foreign_reads == []
    finally:
        controller.shutdown()


def test_a_model_info_resolves_the_same_preset_as_the_model(tmp_path):
    # The GUI resolves from describe()'s plain data: the GGUF's sampling keys and the file's
    # generation_config.json must give exactly what resolving from the loaded model gives.
    (tmp_path / "generation_config.json").write_text('{"top_p": 0.8, "do_sample": true}')
    metadata = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.name": "m"}

    class Loaded:
        path = tmp_path / "m.gguf"
        gguf = type(
            "G", (), {"metadata": metadata, "arch": "llama", "quant_mix": lambda self: {"Q8_0": 1}}
        )()
        backend = type("B", (), {"isa": "avx2", "n_threads": 2})()
        chat_template = type("T", (), {"name": "chatml", "is_fallback": False})()
        n_ctx = 512

    info = RealEngine().describe(Loaded())
    assert info.sampling_metadata == {"general.sampling.temp": 0.6, "general.sampling.top_k": 20}
    from_info = RealEngine().resolve_preset(info, {"top_k": 5}, None)
    from_model = resolve_preset(Loaded(), saved={"top_k": 5})
    assert isinstance(from_info, ResolvedPreset) and from_info == from_model
    assert from_info.values["temperature"] == 0.6 and from_info.sources["top_p"] == (
        "generation_config.json"
    )
    assert Path(info.path).name == "m.gguf"
