"""Tiny random `bert` and `nomic-bert` GGUFs (written here with gguf-py) against a float64 numpy
reference written from the same weights, plus the WordPiece vocabulary, batching, cancel, bad
input and the CLI. Fast tier: no real model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, PoolingType, TokenType

from engine import embedding as embedding_module
from engine.embedding import Embedder, EmbeddingCancelled
from engine.errors import ConfigValidationError, ModelFileError, UnsupportedModelError
from engine.models import bert as bert_module
from tests.fake_model import CancelAfter

ROOT = Path(__file__).resolve().parents[1]

# WordPiece pieces in llama.cpp's phantom-space form: "▁x" starts a word, "x" continues one.
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PIECES = ["▁hello", "▁world", "▁the", "▁cat", "▁sat", "s", "▁play", "ing", "▁.", "▁,", "▁東"]
PIECES += ["▁京", "▁cafe", "▁on", "▁a", "▁mat", "▁dog", "▁runs", "▁fast", "▁to", "▁home"]
VOCAB = SPECIALS + PIECES
ID = {t: i for i, t in enumerate(VOCAB)}
D, HEADS, FF, LAYERS, CTX = 32, 4, 48, 2, 16
EPS = 1e-12
THETA = 1000.0


def _f16(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def _vec(rng: np.random.Generator, n: int, center: float = 0.0) -> np.ndarray:
    return (center + rng.standard_normal(n) * 0.1).astype(np.float32)


def write_encoder(
    path: Path,
    arch: str,
    pooling: int = PoolingType.MEAN,
    seed: int = 0,
    vocab: list[str] | None = None,
    drop: str | None = None,
) -> tuple[Path, dict[str, np.ndarray]]:
    """A tiny encoder GGUF laid out as llama.cpp's converter writes `arch`, and its weights as
    float64 (the values the file holds) for the reference. `drop` leaves one tensor out."""
    rng = np.random.default_rng(seed)
    vocab = vocab or VOCAB
    w: dict[str, np.ndarray] = {
        "token_embd.weight": _f16(rng, len(vocab), D),
        "token_types.weight": _f16(rng, 2, D),
        "token_embd_norm.weight": _vec(rng, D, 1.0),
        "token_embd_norm.bias": _vec(rng, D),
    }
    if arch == "bert":
        w["position_embd.weight"] = _f16(rng, CTX, D)
    for i in range(LAYERS):
        p = f"blk.{i}."
        if arch == "bert":
            for name in ("attn_q", "attn_k", "attn_v"):
                w[p + name + ".weight"] = _f16(rng, D, D)
                w[p + name + ".bias"] = _vec(rng, D)
            w[p + "attn_output.bias"] = _vec(rng, D)
            w[p + "ffn_up.bias"] = _vec(rng, FF)
            w[p + "ffn_down.bias"] = _vec(rng, D)
        else:
            w[p + "attn_qkv.weight"] = _f16(rng, 3 * D, D)
            w[p + "ffn_gate.weight"] = _f16(rng, FF, D)
        w[p + "attn_output.weight"] = _f16(rng, D, D)
        w[p + "ffn_up.weight"] = _f16(rng, FF, D)
        w[p + "ffn_down.weight"] = _f16(rng, D, FF)
        for norm in ("attn_output_norm", "layer_output_norm"):
            w[p + norm + ".weight"] = _vec(rng, D, 1.0)
            w[p + norm + ".bias"] = _vec(rng, D)
    writer = GGUFWriter(str(path), arch)
    writer.add_context_length(CTX)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(FF)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_layer_norm_eps(EPS)
    writer.add_causal_attention(False)
    writer.add_pooling_type(PoolingType(pooling))
    if arch == "nomic-bert":
        writer.add_rope_freq_base(THETA)
    writer.add_token_type_count(2)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(vocab)
    writer.add_token_types(
        [TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL for t in vocab]
    )
    writer.add_bos_token_id(vocab.index("[CLS]"))
    writer.add_sep_token_id(vocab.index("[SEP]"))
    writer.add_unk_token_id(vocab.index("[UNK]"))
    writer.add_pad_token_id(vocab.index("[PAD]"))
    for name, value in w.items():
        if name == drop:
            continue
        if value.dtype == np.float16:
            writer.add_tensor(name, value, raw_dtype=GGMLQuantizationType.F16)
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, {k: v.astype(np.float64) for k, v in w.items()}


# --- the float64 reference (written from the formulas, not from engine/models/bert.py) ---------


def _ln(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + EPS) * w + b


def _rope_neox(x, positions):
    """x: (n, heads, hd); pairs (i, i + hd/2) rotated by pos * THETA^(-2i/hd)."""
    hd = x.shape[-1]
    half = hd // 2
    out = x.copy()
    for t, pos in enumerate(positions):
        for i in range(half):
            angle = pos * THETA ** (-2.0 * i / hd)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[t, :, i], x[t, :, i + half]
            out[t, :, i] = a * c - b * s
            out[t, :, i + half] = a * s + b * c
    return out


def reference(arch: str, w: dict[str, np.ndarray], ids: list[int], pooling: int) -> np.ndarray:
    n, hd = len(ids), D // HEADS
    pos = np.arange(n)
    x = w["token_embd.weight"][ids] + w["token_types.weight"][0]
    if arch == "bert":
        x = x + w["position_embd.weight"][pos]
    x = _ln(x, w["token_embd_norm.weight"], w["token_embd_norm.bias"])
    erf = np.vectorize(math.erf)
    for i in range(LAYERS):
        p = f"blk.{i}."
        if arch == "bert":
            q, k, v = (x @ w[p + f"attn_{c}.weight"].T + w[p + f"attn_{c}.bias"] for c in "qkv")
        else:
            q, k, v = np.split(x @ w[p + "attn_qkv.weight"].T, 3, axis=1)
        q, k, v = (m.reshape(n, HEADS, hd) for m in (q, k, v))
        if arch == "nomic-bert":
            q, k = _rope_neox(q, pos), _rope_neox(k, pos)
        att = np.zeros((n, HEADS, hd))
        for h in range(HEADS):
            s = q[:, h] @ k[:, h].T / math.sqrt(hd)
            e = np.exp(s - s.max(1, keepdims=True))
            att[:, h] = (e / e.sum(1, keepdims=True)) @ v[:, h]
        o = att.reshape(n, D) @ w[p + "attn_output.weight"].T + w.get(p + "attn_output.bias", 0)
        x = _ln(x + o, w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"])
        up = x @ w[p + "ffn_up.weight"].T + w.get(p + "ffn_up.bias", 0)
        if arch == "bert":
            act = 0.5 * up * (1 + erf(up / math.sqrt(2)))
        else:
            g = x @ w[p + "ffn_gate.weight"].T
            act = g / (1 + np.exp(-g)) * up
        f = act @ w[p + "ffn_down.weight"].T + w.get(p + "ffn_down.bias", 0)
        x = _ln(x + f, w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"])
    pooled = x[0] if pooling == PoolingType.CLS else x.mean(0)
    return pooled / np.linalg.norm(pooled)


TEXTS = ["hello world", "the cats sat on a mat.", "the dog runs fast to home, hello"]
# hand-tokenized: "cats" = cat ##s, "playing" = play ##ing, "Café" lower-cased and de-accented
IDS = [
    [ID["[CLS]"], ID["▁hello"], ID["▁world"], ID["[SEP]"]],
    [2, ID["▁the"], ID["▁cat"], ID["s"], ID["▁sat"], ID["▁on"], ID["▁a"], ID["▁mat"], ID["▁."], 3],
    [2, ID["▁the"], ID["▁dog"], ID["▁runs"], ID["▁fast"], ID["▁to"], ID["▁home"], ID["▁,"]]
    + [ID["▁hello"], 3],
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    d = tmp_path_factory.mktemp("encoders")
    return {
        "bert": write_encoder(d / "bert.gguf", "bert", PoolingType.MEAN, seed=1),
        "bert-cls": write_encoder(d / "bert-cls.gguf", "bert", PoolingType.CLS, seed=2),
        "nomic-bert": write_encoder(d / "nomic.gguf", "nomic-bert", PoolingType.MEAN, seed=3),
    }


@pytest.mark.parametrize(
    ("name", "arch", "pooling"),
    [
        ("bert", "bert", PoolingType.MEAN),
        ("bert-cls", "bert", PoolingType.CLS),
        ("nomic-bert", "nomic-bert", PoolingType.MEAN),
    ],
)
@pytest.mark.parametrize("blas_from", [1, 10**9], ids=["blas", "jit"])
def test_tiny_encoder_matches_float64_reference(
    models, name, arch, pooling, blas_from, monkeypatch
):
    # both ways a float weight is multiplied: numpy's BLAS (big batches) and the JIT kernel
    monkeypatch.setattr(bert_module, "BLAS_MIN_TOKENS", blas_from)
    path, weights = models[name]
    with Embedder.load(path) as emb:
        assert emb.config.arch == arch and emb.dim == D and emb.max_tokens == CTX
        got = emb.embed(TEXTS)
    assert got.shape == (3, D) and got.dtype == np.float32
    for ids, row in zip(IDS, got, strict=True):
        want = reference(arch, weights, ids, pooling)
        np.testing.assert_allclose(row, want, atol=2e-5)


def test_wordpiece_ids_from_the_phantom_space_vocabulary(models):
    with Embedder.load(models["bert"][0]) as emb:
        assert [emb.token_ids(t) for t in TEXTS] == IDS
        # play + ##ing; an unknown word is one [UNK]; accents stripped, case folded; CJK split
        assert emb.token_ids("Playing zebra CAFÉ 東京") == [
            2, ID["▁play"], ID["ing"], ID["[UNK]"], ID["▁cafe"], ID["▁東"], ID["▁京"], 3
        ]  # fmt: skip
        assert emb.token_ids("") == [2, 3]
        assert emb.count_tokens("hello world") == 4


def test_a_cased_vocabulary_keeps_case(tmp_path):
    cased = SPECIALS + ["▁Hello", "▁hello", "▁World", "▁Paris", "▁The", "▁A", "▁world"]
    path, _ = write_encoder(tmp_path / "cased.gguf", "bert", vocab=cased)
    with Embedder.load(path) as emb:
        assert emb.token_ids("Hello world") == [2, 5, 11, 3]
        assert emb.token_ids("hello World") == [2, 6, 7, 3]


def test_long_text_is_truncated_to_max_tokens_with_sep_kept(models):
    words = " ".join(["hello"] * 30)
    with Embedder.load(models["bert"][0]) as emb:
        ids = emb.token_ids(words)
        assert ids == [2] + [ID["▁hello"]] * (CTX - 2) + [3]
        assert emb.count_tokens(words) == 32
        a, b = emb.embed([words, " ".join(["hello"] * (CTX - 2))])
    np.testing.assert_allclose(a, b, atol=1e-6)
    with Embedder.load(models["bert"][0], max_tokens=6) as short:
        assert short.token_ids(words) == [2] + [ID["▁hello"]] * 4 + [3]


def test_batches_split_and_reassemble_in_the_callers_order(models, monkeypatch):
    texts = TEXTS + ["hello", "the cat sat on the mat, the dog runs home"]
    with Embedder.load(models["nomic-bert"][0]) as emb:
        alone = np.stack([emb.embed([t])[0] for t in texts])
        monkeypatch.setattr(embedding_module, "BATCH_TOKENS", 12)  # forces several passes
        together = emb.embed(texts)
    np.testing.assert_allclose(together, alone, atol=2e-6)


def test_cancel_inside_the_forward_pass(models):
    with Embedder.load(models["bert"][0]) as emb:
        with pytest.raises(EmbeddingCancelled):
            emb.embed(TEXTS, cancel=CancelAfter(1))  # passes the batch check, stops at a layer
        assert emb.embed(["hello"]).shape == (1, D)  # usable afterwards


def test_empty_list_and_bad_texts(models):
    with Embedder.load(models["bert"][0]) as emb:
        assert emb.embed([]).shape == (0, D)
        with pytest.raises(TypeError, match=r"texts\[1\] is int"):
            emb.embed(["ok", 3])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="not one string"):
            emb.embed("hello")


def test_bad_files_get_typed_errors_naming_the_problem(models, tmp_path, tiny_model_factory):
    with pytest.raises(UnsupportedModelError, match="'llama'"):
        Embedder.load(tiny_model_factory("llama"))
    with pytest.raises(ModelFileError, match="not found"):
        Embedder.load(tmp_path / "absent.gguf")
    rerank, _ = write_encoder(tmp_path / "rerank.gguf", "bert", pooling=PoolingType.RANK)
    with pytest.raises(UnsupportedModelError, match="reranker"):
        Embedder.load(rerank)
    broken, _ = write_encoder(tmp_path / "broken.gguf", "bert", drop="blk.1.ffn_down.weight")
    with pytest.raises(ModelFileError, match=r"blk\.1\.ffn_down\.weight"):
        Embedder.load(broken)
    with pytest.raises(ConfigValidationError, match="max_tokens"):
        Embedder.load(models["bert"][0], max_tokens=CTX + 1)


def test_cli_embed_json(models):
    path = models["bert"][0]
    out = subprocess.run(
        [sys.executable, "-m", "engine", "embed", str(path), "hello world", "the cats", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["architecture"] == "bert" and data["dim"] == D and data["pooling"] == "mean"
    assert [e["tokens"] for e in data["embeddings"]] == [4, 5]
    _, weights = models["bert"]
    np.testing.assert_allclose(
        data["embeddings"][0]["embedding"], reference("bert", weights, IDS[0], 1), atol=2e-5
    )


def test_cli_embed_refuses_a_chat_model(tiny_model_factory):
    out = subprocess.run(
        [sys.executable, "-m", "engine", "embed", str(tiny_model_factory("llama")), "hi"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode != 0
    assert "not an embedding model" in out.stderr


def test_loading_an_embedding_model_as_a_chat_model_says_what_it_is(models):
    from engine.loader import load_model

    with pytest.raises(UnsupportedModelError, match="'nomic-bert' is an embedding model"):
        load_model(models["nomic-bert"][0])


def test_one_blas_thread_while_any_pass_runs_then_the_setting_before():
    # two Embedders' passes overlap (indexing and a question): the one whose pass ends first
    # must not hand BLAS its threads back while the other still runs, and the last one restores
    from threadpoolctl import ThreadpoolController, threadpool_limits

    def blas_threads() -> int:
        return ThreadpoolController().select(user_api="blas").info()[0]["num_threads"]

    if not ThreadpoolController().select(user_api="blas").lib_controllers:
        pytest.skip("numpy here has no BLAS thread pool to limit")
    guard = bert_module._OneBlasThread()
    with threadpool_limits(limits=2, user_api="blas"):
        guard.__enter__()  # pass A starts
        guard.__enter__()  # pass B starts
        assert blas_threads() == 1
        guard.__exit__(None, None, None)  # A ends while B runs
        assert blas_threads() == 1
        guard.__exit__(None, None, None)  # B ends
        assert blas_threads() == 2
