"""A weight tensor as stored in the GGUF file: quantized blocks, never a dequantized copy.

`data` is a read-only view into the memory-mapped file. For 2-D weights it has shape
(rows, row_bytes) in uint8 (rows = output features, one row = one dot product); for F32/F16/BF16
tensors it is the typed array itself in numpy order. Kernels read the blocks directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


@dataclass(frozen=True, eq=False)
class QTensor:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: (out_features, in_features) for a 2-D weight
    data: np.ndarray  # raw storage, see module docstring

    @property
    def block_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return GGML_QUANT_SIZES[self.qtype][1]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return int(self.shape[-1])
