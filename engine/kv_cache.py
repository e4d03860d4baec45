"""Key/value storage for one sequence: float16, allocated once at full capacity.

Layout (the attention kernels code against it, see Backend.attention):
    k, v: (n_layers, capacity, n_kv_heads, head_dim) float16, C-contiguous;
    k[layer] is the (capacity, n_kv, head_dim) block of one layer; row j = position j.
Sliding-window layers store the whole context too: the window is a mask in attention, so
`truncate` (speculative rollback, prefix reuse) is exact for every layer type.

A KVCache is the per-sequence state of one request: two requests on one model each own one,
and the model's forward lock serialises the chunks that write into them (see
engine/models/transformer.py). A cache is never shared between running requests: the prefix
cache hands out copies. Rows at and past `n_tokens` are scratch: a forward chunk writes its
rows before `commit`, so a chunk that is cancelled or fails leaves `n_tokens` and `tokens`
exactly as they were, and the next write at those positions replaces the rows.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ContextOverflowError

_BYTES_PER_ELEMENT = 2  # float16


class KVCache:
    def __init__(self, n_layers: int, capacity: int, n_kv_heads: int, head_dim: int):
        if capacity <= 0:
            raise ContextOverflowError(f"KV cache capacity {capacity} must be at least 1 token")
        shape = (n_layers, capacity, n_kv_heads, head_dim)
        self.k = np.zeros(shape, dtype=np.float16)
        self.v = np.zeros(shape, dtype=np.float16)
        self.n_tokens = 0
        # The token ids whose keys/values are stored, in order (prefix reuse compares against it).
        self.tokens: list[int] = []

    @classmethod
    def for_config(cls, config, n_ctx: int) -> KVCache:
        return cls(config.n_layers, n_ctx, config.n_kv_head, config.head_dim)

    @staticmethod
    def bytes_needed(config, n_ctx: int) -> int:
        """Bytes K and V take for n_ctx tokens, computed without allocating (Python ints never
        overflow, so absurd n_ctx values give an honest huge number to refuse)."""
        return (
            2
            * int(config.n_layers)
            * int(n_ctx)
            * int(config.n_kv_head)
            * int(config.head_dim)
            * _BYTES_PER_ELEMENT
        )

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)

    def layer(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) views of one layer, each (capacity, n_kv, head_dim) float16."""
        return self.k[index], self.v[index]

    def reserve(self, n_new: int) -> int:
        """Check that n_new more tokens fit; returns the position of the first one."""
        if self.n_tokens + n_new > self.capacity:
            raise ContextOverflowError(
                f"{self.n_tokens} cached + {n_new} new tokens exceed the context window of {self.capacity}"
            )
        return self.n_tokens

    def commit(self, token_ids) -> None:
        """Record that the next len(token_ids) rows of every layer now hold these tokens."""
        self.tokens.extend(int(t) for t in token_ids)
        self.n_tokens = len(self.tokens)

    def truncate(self, n: int) -> None:
        """Forget every token from position n on (rows are overwritten by later writes)."""
        if not 0 <= n <= self.n_tokens:
            raise ValueError(f"truncate({n}): must be between 0 and n_tokens={self.n_tokens}")
        del self.tokens[n:]
        self.n_tokens = n

    def clone(self) -> KVCache:
        """An independent copy with the same capacity (only the valid rows are copied)."""
        n_layers, capacity, n_kv, head_dim = self.k.shape
        copy = KVCache(n_layers, capacity, n_kv, head_dim)
        copy.k[:, : self.n_tokens] = self.k[:, : self.n_tokens]
        copy.v[:, : self.n_tokens] = self.v[:, : self.n_tokens]
        copy.tokens = list(self.tokens)
        copy.n_tokens = self.n_tokens
        return copy
