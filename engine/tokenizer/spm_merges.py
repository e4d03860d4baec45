"""SentencePiece merges derived from a vocabulary's scores, and their on-disk cache.

llama.cpp merges the adjacent pair of symbols whose concatenation is the highest-scoring
vocabulary entry (leftmost on ties), starting from UTF-8 characters. That is a BPE whose merge
ranks are the scores: every split of a piece into two pieces, ranked by the piece's score (equal
scores, which real SentencePiece vocabularies do not have, rank by id). Deriving Gemma 3's ~514k
merges costs ~1.2 s of CPU, reading them back ~0.15 s, and that was most of the model's load time,
so they are kept on disk (4 MiB for Gemma), keyed by a hash of everything they depend on.

The file holds each merge as a pair of token ids (uint32), not the pieces' texts: read back as
texts, Gemma's 514k merges were ~1M new str objects (~90 MiB held at the peak of the model load,
beside the Rust side building its tables); as ids, the pairs refer to the vocabulary's own str
objects and only the tuples are new (issue 32).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_MERGES_FORMAT = b"spm-merges-v3"  # v3: pairs of token ids; v2 held the pieces' texts
# Splitting a piece at every position costs time quadratic in its length, so a hostile file with
# a multi-megabyte piece would stall loading for hours. Real pieces are short (Gemma 3's longest
# is 31 characters, SmolLM2's 81); a merge whose parts exceed this is left out, so such a piece
# is never produced by merging (llama.cpp would produce it; no real vocabulary has one).
MAX_MERGE_PART = 1024
_SEP = "\0"  # between token texts in the cache key's hash


def derive_merges(
    tokens: list[str], attrs: list[int], scores: list[float], vocab: dict[str, int], skip_attrs: int
) -> list[tuple[str, str]]:
    """Every way to build a piece from two pieces of at most MAX_MERGE_PART characters, best
    piece score first; pieces with any of `skip_attrs` (special text, which the partition
    removes before the merger) are left out.
    (The hot loop of loading a SentencePiece model: ~1.5M lookups for Gemma's 262k pieces,
    ~1.2 s; a sort of flat tuples measured faster than per-token lists.)"""
    ranked = []
    for token_id, text in enumerate(tokens):
        length = len(text)
        if length < 2 or length > 2 * MAX_MERGE_PART or attrs[token_id] & skip_attrs:
            continue
        if vocab[text] != token_id:
            continue  # a duplicated text: llama.cpp looks it up to the last id, and so do we
        score = scores[token_id]
        for k in range(max(1, length - MAX_MERGE_PART), min(length, MAX_MERGE_PART + 1)):
            left, right = text[:k], text[k:]
            if left in vocab and right in vocab:
                ranked.append((-score, token_id, k, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def merge_ids(merges: list[tuple[str, str]], vocab: dict[str, int]) -> np.ndarray:
    """Merges as (m, 2) uint32 token ids (the vocabulary's id of each piece, later ids winning)."""
    flat = [vocab[piece] for pair in merges for piece in pair]
    return np.array(flat, dtype=np.uint32).reshape(-1, 2)


def merges_from_ids(ids: np.ndarray, tokens: Sequence[str]) -> list[tuple[str, str]]:
    """The (left, right) pieces of id pairs: the vocabulary's own str objects, none copied."""
    get = tokens.__getitem__
    return list(zip(map(get, ids[:, 0].tolist()), map(get, ids[:, 1].tolist()), strict=True))


def cache_path(cache_dir: Path | None, tokens: list[str], scores, special: bytes) -> Path | None:
    """The cache file for this vocabulary (`special`: one byte per token, 1 if it is special),
    or None when caching is off."""
    if cache_dir is None:
        return None
    h = hashlib.sha256(_MERGES_FORMAT)
    h.update(_SEP.join(tokens).encode("utf-8", "surrogatepass"))
    # float64 bytes (what array("d", scores) hashed when scores were a list of floats)
    h.update(np.asarray(scores, dtype=np.float64).tobytes())
    h.update(special)
    return cache_dir / f"{h.hexdigest()[:40]}.merges"


def read_cached(path: Path | None) -> np.ndarray | None:
    """Merges as (m, 2) token ids from the cache file, or None if it is missing or damaged (its
    header holds the format, the merge count and a sha256 of the ids; the caller checks every id
    is in the vocabulary). Whatever fails is derived again and the file replaced."""
    if path is None:
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            # A FIFO would block the model load until a writer came, a device never ends:
            # never opened; the file is replaced by the next write_cached.
            log.warning("ignoring tokenizer cache file %s: not a regular file", path)
            return None
        # O_NONBLOCK: a FIFO swapped in after the stat does not block the open either.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("ignoring unreadable tokenizer cache file %s: %s", path, exc)
        return None
    header, _, payload = data.partition(b"\n")
    fields = header.split(b" ")
    if (
        len(fields) != 3
        or fields[0] != _MERGES_FORMAT
        or fields[1] != str(len(payload) // 8).encode()
        or len(payload) % 8
        or fields[2] != hashlib.sha256(payload).hexdigest().encode()
    ):
        log.warning("ignoring damaged tokenizer cache file %s", path)
        return None
    return np.frombuffer(payload, dtype="<u4").reshape(-1, 2)


def write_cached(path: Path | None, ids: np.ndarray) -> None:
    """Store merges given as (m, 2) token ids (see merge_ids)."""
    if path is None:
        return
    payload = np.ascontiguousarray(ids, dtype="<u4").tobytes()
    header = b" ".join(
        (
            _MERGES_FORMAT,
            str(len(payload) // 8).encode(),
            hashlib.sha256(payload).hexdigest().encode(),
        )
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(header + b"\n" + payload)
        os.replace(tmp, path)  # atomic: a concurrent reader sees no file or the whole file
    except OSError as exc:
        log.info(
            "cannot write the tokenizer cache (%s); merges will be derived again next time", exc
        )
