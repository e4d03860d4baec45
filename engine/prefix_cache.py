"""Prefix reuse across requests: keep the KV state of recent sequences, hand back the longest match.

A chat resends the whole conversation every turn. With this cache a follow-up turn prefills only
the new tokens, an edited or regenerated turn recomputes from the first changed token, and an
exact repeat of a prompt runs no forward pass at all (the entry keeps the logits after it).

Contract with the generation loop (engine/generate.py, "Prefix cache" seam):
    hit = cache.lookup(lm, prompt_ids, min_capacity)      # -> PrefixHit | None
    cache.store(lm, token_ids, kv_cache, next_logits)     # after prefill, and at a clean end

Why it is exact and transactional:
- An entry is a private, compact copy of the K/V rows of `token_ids` (only those rows, not the
  whole context capacity). `lookup` copies the matching rows into a fresh KVCache that the
  request then owns, so a request can never write into stored state, and a request that is
  cancelled or fails leaves the entries exactly as they were (the loop only calls `store` for
  states whose rows all belong to `token_ids`: after a finished prefill and at a clean end).
- K/V rows depend only on the tokens at and before their position, so rows [0, n) of any stored
  sequence are valid for every sequence sharing its first n tokens. Gemma 3's sliding-window
  layers are no exception: the KV cache keeps every position and applies the window as a mask
  in attention, so a restored prefix attends exactly as a freshly computed one.
- Logits are kept only for "the whole stored sequence up to length L" (L = a prompt length that
  was prefilled), and given back only when the new prompt is exactly those L tokens.

Memory: entries are charged their exact bytes (K + V rows + logits); least recently used entries
are evicted beyond `budget_bytes`. A sequence that extends a stored one (the next turn of the
same chat) replaces it instead of being stored next to it.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.errors import ConfigValidationError
from engine.model_protocol import LanguageModel
from engine.types import PrefixHit

DEFAULT_BUDGET_BYTES = 512 * 2**20  # a few long chats of a small model; the app may set its own


@dataclass
class _Entry:
    model_ref: (
        weakref.ref
    )  # the model whose K/V these are; entries of an unloaded model are dropped
    tokens: tuple[int, ...]
    k: np.ndarray  # (n_layers, len(tokens), n_kv_heads, head_dim), same dtype as the KVCache
    v: np.ndarray
    logits_at: dict[int, np.ndarray] = field(default_factory=dict)  # prefix length -> next logits

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes + sum(a.nbytes for a in self.logits_at.values()))


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading positions where a and b hold the same token (vectorised)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """LRU store of KV prefixes, shared by the requests of one app session (thread-safe); the
    generation loop's `SupportsPrefixReuse` seam (engine/types.py)."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES, *, min_reuse_tokens: int = 1):
        if not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ConfigValidationError(
                "prefix_cache_budget_bytes", budget_bytes, "an integer >= 0"
            )
        self.budget_bytes = budget_bytes
        self.min_reuse_tokens = max(1, int(min_reuse_tokens))
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # oldest first
        self._next_id = 0
        self._lock = threading.Lock()

    # --- inspection ------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    # --- the loop's seam -------------------------------------------------------------------------
    def lookup(
        self, lm: LanguageModel, prompt_ids: Sequence[int], min_capacity: int
    ) -> PrefixHit | None:
        """The longest stored prefix of prompt_ids, copied into a new KVCache of min_capacity."""
        model = lm.model
        prompt = [int(t) for t in prompt_ids]
        with self._lock:
            self._drop_dead_models()
            best_id, best_n = None, 0
            for entry_id, entry in self._entries.items():
                if entry.model_ref() is not model:
                    continue
                n = common_prefix_length(entry.tokens, prompt)
                # Prefer the longer match; on a tie, the entry that also has the logits.
                if n > best_n or (
                    n == best_n
                    and n
                    and best_id is not None
                    and n in entry.logits_at
                    and n not in self._entries[best_id].logits_at
                ):
                    best_id, best_n = entry_id, n
            if best_id is None or best_n < self.min_reuse_tokens:
                return None
            entry = self._entries[best_id]
            self._entries.move_to_end(best_id)  # most recently used
            logits = entry.logits_at.get(best_n) if best_n == len(prompt) else None
            cache = model.new_cache(max(int(min_capacity), best_n))
            cache.k[:, :best_n] = entry.k[:, :best_n]
            cache.v[:, :best_n] = entry.v[:, :best_n]
            cache.commit(prompt[:best_n])
            return PrefixHit(cache, best_n, None if logits is None else logits.copy())

    def store(
        self, lm: LanguageModel, token_ids: Sequence[int], cache, next_logits: np.ndarray | None
    ) -> None:
        """Keep a copy of the K/V rows of token_ids (all of `cache`), and next_logits after them."""
        tokens = tuple(int(t) for t in token_ids)
        if not tokens:
            return
        if cache.n_tokens != len(tokens) or tuple(cache.tokens[: len(tokens)]) != tokens:
            # Never store rows that do not belong to token_ids (a half-written state).
            raise ValueError(
                f"prefix cache store: the KV cache holds {cache.n_tokens} tokens that differ from the "
                f"{len(tokens)} token ids given"
            )
        model = lm.model
        logits = None if next_logits is None else np.array(next_logits, dtype=np.float32)
        with self._lock:
            self._drop_dead_models()
            for entry_id, entry in list(self._entries.items()):
                if entry.model_ref() is not model:
                    continue
                if len(entry.tokens) >= len(tokens) and entry.tokens[: len(tokens)] == tokens:
                    # Already covered by a stored sequence: at most add the logits.
                    if logits is not None and len(tokens) not in entry.logits_at:
                        entry.logits_at[len(tokens)] = logits
                    self._entries.move_to_end(entry_id)
                    self._evict()
                    return
            carried: dict[int, np.ndarray] = {}
            for entry_id, entry in list(self._entries.items()):
                # The new sequence extends this one (next turn of the same chat): replace it, and
                # keep its logits (they stay valid: same tokens, same positions).
                if entry.model_ref() is model and tokens[: len(entry.tokens)] == entry.tokens:
                    carried.update(entry.logits_at)
                    del self._entries[entry_id]
            n = len(tokens)
            entry = _Entry(
                weakref.ref(model), tokens, cache.k[:, :n].copy(), cache.v[:, :n].copy(), carried
            )
            if logits is not None:
                entry.logits_at[n] = logits
            if entry.nbytes > self.budget_bytes:
                return  # bigger than the whole budget: keeping it would evict everything else
            self._entries[self._next_id] = entry
            self._next_id += 1
            self._evict()

    # --- internals -------------------------------------------------------------------------------
    def _evict(self) -> None:
        total = sum(e.nbytes for e in self._entries.values())
        while total > self.budget_bytes and self._entries:
            _, oldest = self._entries.popitem(last=False)
            total -= oldest.nbytes

    def _drop_dead_models(self) -> None:
        for entry_id in [i for i, e in self._entries.items() if e.model_ref() is None]:
            del self._entries[entry_id]
