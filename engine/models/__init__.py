"""Forward passes. One shared decoder (transformer.py) covers every supported architecture;
`build_model` is the single entry point the loader uses."""

from __future__ import annotations

from engine.config import ModelConfig
from engine.models.transformer import DEFAULT_MAX_BATCH, TransformerModel


def build_model(
    gguf_file, config: ModelConfig | None = None, backend=None, max_batch: int = DEFAULT_MAX_BATCH
) -> TransformerModel:
    """A ready-to-run model over the file's memory-mapped weights (nothing is dequantized up
    front except the tiny norm vectors)."""
    if config is None:
        config = ModelConfig.from_gguf(gguf_file)
    if backend is None:
        from engine.kernels.backend import get_backend

        backend = get_backend()
    return TransformerModel(config, gguf_file.tensors, backend, max_batch=max_batch)
