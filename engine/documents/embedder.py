"""What the documents package needs from an embedding model (engine/embedding.py's Embedder meets
it; tests use a small deterministic one). A Protocol, so this package does not import the model
code and its kernels just to type-check."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class TextEmbedder(Protocol):
    @property
    def dim(self) -> int: ...

    @property
    def model_id(self) -> str: ...

    @property
    def max_tokens(self) -> int: ...

    def count_tokens(self, text: str) -> int: ...

    def embed(self, texts: list[str], cancel: Any = None) -> np.ndarray:
        """float32 (len(texts), dim), each row L2-normalised."""
        ...
