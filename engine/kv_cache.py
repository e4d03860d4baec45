"""Key/value storage for one sequence, allocated once at full capacity, float16 or q8_0.

Layout (the attention kernels code against it, see Backend.attention):
    k, v: (n_layers, capacity, n_kv_heads, row) C-contiguous, where a row holds the head_dim
    values of one (position, kv head): float16 [head_dim] for cache_type "f16", or uint8
    [head_dim / 32 * 34] of ggml block_q8_0 for "q8_0" (engine/kv_quant.py; 0.53x the bytes);
    k[layer] is the (capacity, n_kv, row) block of one layer; row j = position j.
New rows go in through `write`, which rounds to float16 or quantizes to q8_0.
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

from engine.errors import ConfigValidationError, ContextOverflowError
from engine.kv_quant import Q8_0_BLOCK, q8_0_row_bytes, quantize_q8_0
from engine.types import DEFAULT_KV_CACHE_TYPE, KV_CACHE_TYPES, KvCacheType


def check_cache_type(cache_type, head_dim: int | None = None) -> KvCacheType:
    """The KvCacheType named by cache_type; ConfigValidationError naming it when it is not a
    known type, or q8_0 for a head_dim that is not a multiple of its 32-value blocks."""
    if not isinstance(cache_type, str) or cache_type not in KV_CACHE_TYPES:
        raise ConfigValidationError("cache_type", cache_type, f"one of {', '.join(KV_CACHE_TYPES)}")
    kind = KvCacheType(cache_type)
    if kind is KvCacheType.Q8_0 and head_dim is not None and head_dim % Q8_0_BLOCK:
        raise ConfigValidationError(
            "cache_type",
            cache_type,
            f"f16 for this model: q8_0 needs head_dim to be a multiple of {Q8_0_BLOCK}, "
            f"not {head_dim}",
        )
    return kind


def kv_cache_type(model) -> KvCacheType:
    """The cache type a model's new_cache makes (stand-in models without one make f16)."""
    return KvCacheType(getattr(model, "cache_type", DEFAULT_KV_CACHE_TYPE))


def _row_shape(cache_type: KvCacheType, head_dim: int) -> tuple[int, np.dtype]:
    if cache_type is KvCacheType.Q8_0:
        return q8_0_row_bytes(head_dim), np.dtype(np.uint8)
    return head_dim, np.dtype(np.float16)


class KVCache:
    def __init__(
        self,
        n_layers: int,
        capacity: int,
        n_kv_heads: int,
        head_dim: int,
        cache_type: str = DEFAULT_KV_CACHE_TYPE,
    ):
        if capacity <= 0:
            raise ContextOverflowError(f"KV cache capacity {capacity} must be at least 1 token")
        self.cache_type = check_cache_type(cache_type, head_dim)
        self.head_dim = head_dim
        row, dtype = _row_shape(self.cache_type, head_dim)
        shape = (n_layers, capacity, n_kv_heads, row)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        # Per layer (k, v) views, made once: the JIT backend caches addresses per array object.
        self._layers = [(self.k[i], self.v[i]) for i in range(n_layers)]
        self.n_tokens = 0
        # The token ids whose keys/values are stored, in order (prefix reuse compares against it).
        self.tokens: list[int] = []

    @classmethod
    def for_config(cls, config, n_ctx: int, cache_type: str = DEFAULT_KV_CACHE_TYPE) -> KVCache:
        return cls(config.n_layers, n_ctx, config.n_kv_head, config.head_dim, cache_type)

    @staticmethod
    def bytes_needed(config, n_ctx: int, cache_type: str = DEFAULT_KV_CACHE_TYPE) -> int:
        """Bytes K and V take for n_ctx tokens, computed without allocating (Python ints never
        overflow, so absurd n_ctx values give an honest huge number to refuse)."""
        row, dtype = _row_shape(check_cache_type(cache_type), int(config.head_dim))
        return 2 * int(config.n_layers) * int(n_ctx) * int(config.n_kv_head) * row * dtype.itemsize

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)

    def layer(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) views of one layer, each (capacity, n_kv, row) in the cache's layout; the same
        two view objects on every call."""
        return self._layers[index]

    def write(self, index: int, p0: int, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        """Store float32 (n, n_kv, head_dim) keys and values of layer `index` at rows p0.."""
        n = k_rows.shape[0]
        k_dst, v_dst = self.k[index, p0 : p0 + n], self.v[index, p0 : p0 + n]
        if self.cache_type is KvCacheType.Q8_0:
            # One quantize call for both: at decode the rows are tiny and numpy's per-call
            # overhead, not the arithmetic, is the cost (about 35 -> 23 us per layer).
            both = quantize_q8_0(np.stack((k_rows, v_rows)))
            k_dst[...] = both[0]
            v_dst[...] = both[1]
        else:
            k_dst[...] = k_rows
            v_dst[...] = v_rows

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
        """An independent copy with the same capacity and type (only valid rows are copied)."""
        n_layers, capacity, n_kv, _ = self.k.shape
        copy = KVCache(n_layers, capacity, n_kv, self.head_dim, self.cache_type)
        copy.k[:, : self.n_tokens] = self.k[:, : self.n_tokens]
        copy.v[:, : self.n_tokens] = self.v[:, : self.n_tokens]
        copy.tokens = list(self.tokens)
        copy.n_tokens = self.n_tokens
        return copy
