"""Write tests/fixtures/tokenizer_*.json: token ids, detokenized text and end-of-generation ids
from llama.cpp's own tokenizer, the oracle engine/tokenizer.py must agree with.

Needs llama-cpp-python (built from source: `CMAKE_ARGS="-DGGML_NATIVE=ON" pip install
llama-cpp-python`); it is a tool dependency only, never a runtime or test one: the tests read
the committed JSON.

Vocabularies covered:
- the two packaged models as they are (SmolLM2: gpt2 BPE with pre "smollm"; Gemma 3: SPM);
- variants of them that exercise the other code paths, written as tiny GGUFs whose tokenizer
  metadata is the real one with a few keys overridden (`VARIANTS`): pre-tokenizers gpt-2,
  llama-bpe, qwen2 and default on SmolLM2's vocabulary, and add_space_prefix / add_eos on Gemma's.
  The tests rebuild each variant from the same overrides.

Run: .venv/bin/python tools/make_tokenizer_fixtures.py   (about half a minute)
     .venv/bin/python tools/make_tokenizer_fixtures.py --check 2000 [SEED]
        compares engine/tokenizer.py with llama.cpp on 2000 random multilingual texts per
        vocabulary and writes nothing (exit status 1 on any mismatch).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402
from gguf import GGUFValueType  # noqa: E402

from engine.model_files import default_model_path, gemma3_270m_path  # noqa: E402
from tests.tiny_models import tokenizer_metadata, write_tiny_model  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
STR, BOOL = GGUFValueType.STRING, GGUFValueType.BOOL

# Tokens turned into special tokens (text -> GGUF token type: 3 control, 4 user-defined) so that
# special texts overlap: in "hello", llama.cpp takes the longer "ello" first (longest-first), where
# a leftmost-longest matcher (HF's added tokens) would take "he". Stored in the fixture as
# "token_type_patch"; the test applies it to the real token_type array.
OVERLAP_PATCH = {"he": 4, "ello": 3, "ll": 4, "start": 4}
OVERLAP_TEXTS = [
    "hello",
    "Hello hello",
    "shell",
    "hellohe",
    "<|im_start|>user\nhello<|im_end|>",
    "he ello ll",
]

# name -> (base model, metadata overrides {key: (value, type)})
VARIANTS: dict[str, tuple[str, dict[str, tuple[object, GGUFValueType]]]] = {
    "smollm2_pre_gpt2": ("smollm2", {"tokenizer.ggml.pre": ("gpt-2", STR)}),
    "smollm2_pre_llama_bpe": ("smollm2", {"tokenizer.ggml.pre": ("llama-bpe", STR)}),
    "smollm2_pre_qwen2": ("smollm2", {"tokenizer.ggml.pre": ("qwen2", STR)}),
    "smollm2_pre_default": ("smollm2", {"tokenizer.ggml.pre": ("default", STR),
                                        "tokenizer.ggml.add_bos_token": (True, BOOL)}),
    "gemma3_space_prefix_eos": ("gemma3", {"tokenizer.ggml.add_space_prefix": (True, BOOL),
                                           "tokenizer.ggml.add_eos_token": (True, BOOL)}),
}  # fmt: skip

# Hand-picked texts: what the issue lists, plus the corners where tokenizers usually differ.
TEXTS: list[str] = [
    "",
    "Hello world",
    "Hello, world! How are you doing today? I'm fine, thanks.",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t",
    "a\tb\t\tc\t\t\td",
    "many     spaces      between          words",
    "x" + " " * 40 + "y",
    "line one\nline two\r\nline three\n\n\nend",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'class Foo {\n\tpublic static void main(String[] args) {\n\t\tSystem.out.println("hi");\n\t}\n}\n',
    "for (int i = 0; i < 10; ++i) { x[i] = i * 2; }  // comment",
    "    indented\n        more\n\t\ttabs\n",
    "日本語のテキストです。東京は大きい都市です。",
    "中文文本测试，你好世界！",
    "한국어 텍스트 안녕하세요",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Ελληνικά κείμενα",
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🤷🏾‍♀️",
    "emoji in text 🎉🎉🎉 and more 😀😃😄",
    "café naïve résumé façade Ångström Zürich",
    "e\u0301 combining acute, n\u0303 tilde",
    "Ǆ ǅ ǆ ﬁ ﬂ ẞ ß İ ı",
    "0 1 12 123 1234 12345 123456 1234567 3.14159 -42 1e10 1,000,000",
    "Phone: +1 (555) 123-4567, total $1,234.56 (≈ €1.100)",
    "I'm you're he's we've they'll she'd don't CAN'T I'M",
    # llama_detokenize's clean_spaces rules (gpt-2 / llama3 vocabularies): " ," " ' " " 's" " 're"...
    "Hello , world . Is it ? Yes ! it 's he 'm we 're they 've I 'll you 'd don 't ' quoted ' end '",
    " ' ' '' ' , . ? ! 's 'm 're 've 'x ' s",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|im_start|>",
    "text<|endoftext|>more text",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad>",
    "<|im_start",
    "<start_of_turn",
    "< |im_start|>",
    "literal byte piece <0x0A> and <0xFF>",
    "▁already▁escaped ▁ spaces",
    "non-breaking\u00a0space and ideographic\u3000space and thin\u2009space",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "\x00\x01\x07 control chars \x7f",
    "a" * 100,
    "ab" * 50,
    "Mixed: Hello 世界 🌍 مرحبا 123 <|im_end|> done",
    "https://example.com/path?query=1&x=y#frag",
    "user@example.com, @handle, #hashtag",
    "```python\nprint('hi')\n```",
    '{"key": [1, 2, {"nested": null}], "b": true}',
    "  \n  \n\t \t",
    "end with newline\n",
    "Ünïcödé ÀÉÎÕÜ àéîõü 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 ①②③ ½ ¾ Ⅻ",
]

# Building blocks for seeded random texts (fuzz cases).
_FUZZ_PIECES = [
    "a", "the", " ", "  ", "\n", "\t", "\r\n", "'s", "'ll", "I", "don't", "123", "4", "56789", ".", ",", "!",
    "?", "...", "é", "ñ", "ü", "日本", "語", "中", "한", "Я", "ж", "ع", "न", "👍", "🏽", "‍", "👩", "❤️", "🎉",
    "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<", ">", "|", "_", "▁", "(", ")",
    "{", "}", "=", "+", "-", "*", "/", "\\", "\"", "#", "$", "%", "&", "~", "`", "^", "\u00a0", "\u3000",
    "ﬁ", "İ", "ß", "ǅ", "0x", "<0x41>", "    ", "\t\t", "\n\n",
]  # fmt: skip


def fuzz_texts(n: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        parts = rng.choices(_FUZZ_PIECES, k=rng.randint(1, 30))
        texts.append("".join(parts))
    return texts


class Oracle:
    """llama.cpp's vocabulary for one GGUF, through the C API (vocab_only: no weights loaded)."""

    def __init__(self, path: Path):
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, True)
        if n < 0:
            raise RuntimeError(f"tokenize needed {-n} tokens")
        return list(buf[:n])

    def detokenize(self, ids: list[int], special: bool = False) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        capacity = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(capacity)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, capacity, False, special)
        if n < 0:
            raise RuntimeError(f"detokenize needed {-n} bytes")
        return buf.raw[:n]

    def piece(self, token_id: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token_id, buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token_id, buf, -n, 0, special)
        return buf.raw[:n]

    def specials(self) -> dict:
        v = self.vocab
        return {
            "bos_id": llama_cpp.llama_vocab_bos(v),
            "eos_id": llama_cpp.llama_vocab_eos(v),
            "eot_id": llama_cpp.llama_vocab_eot(v),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
            "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)),
            "eog_ids": [i for i in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(v, i)],
            "control_ids_count": sum(
                1 for i in range(self.n_vocab) if llama_cpp.llama_vocab_is_control(v, i)
            ),
        }


def piece_table_digest(oracle: Oracle, special: bool) -> str:
    """sha256 over every token's piece (length-prefixed), so the whole table is checked compactly."""
    h = hashlib.sha256()
    for i in range(oracle.n_vocab):
        p = oracle.piece(i, special)
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    return h.hexdigest()


def fixture_for(oracle: Oracle, texts: list[str], seed: int) -> dict:
    rng = random.Random(seed)
    cases = []
    for text in texts:
        with_special = oracle.tokenize(text, add_special=True)
        cases.append({
            "text": text,
            "ids": with_special,
            "ids_no_special": oracle.tokenize(text, add_special=False),
            "decoded_hex": oracle.detokenize(with_special).hex(),
        })  # fmt: skip
    # Random id sequences (any token, including control, byte and unused ones) for decode.
    eog = oracle.specials()["eog_ids"]
    sequences = []
    for _ in range(60):
        ids = [rng.randrange(oracle.n_vocab) for _ in range(rng.randint(1, 24))]
        if rng.random() < 0.5:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(eog))
        sequences.append({
            "ids": ids,
            "decoded_hex": oracle.detokenize(ids).hex(),
            "decoded_special_hex": oracle.detokenize(ids, special=True).hex(),
        })  # fmt: skip
    sample_ids = sorted(set(rng.randrange(oracle.n_vocab) for _ in range(300)) | set(range(0, 300)))
    return {
        **oracle.specials(),
        "n_vocab": oracle.n_vocab,
        "cases": cases,
        "decode_sequences": sequences,
        "pieces": {
            str(i): [oracle.piece(i, False).hex(), oracle.piece(i, True).hex()] for i in sample_ids
        },
        "piece_digest": piece_table_digest(oracle, False),
        "piece_digest_special": piece_table_digest(oracle, True),
    }


def main() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    texts = TEXTS + fuzz_texts(150)
    bases = {"smollm2": default_model_path(), "gemma3": gemma3_270m_path()}
    source = f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (llama_tokenize add_special, parse_special=True; llama_detokenize remove_special=False)"
    for name, path in bases.items():
        data = {
            "source": source,
            "model": name,
            "overrides": {},
            **fixture_for(Oracle(path), texts, seed=7),
        }
        write(name, data)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (base, overrides) in VARIANTS.items():
            arch = "llama" if base == "smollm2" else "gemma3"
            path = write_tiny_model(Path(tmp) / f"{name}.gguf", arch, tokenizer=base, extra_metadata=overrides,
                                    d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128)  # fmt: skip
            plain = {k: v for k, (v, _) in overrides.items()}
            data = {
                "source": source,
                "model": base,
                "overrides": plain,
                **fixture_for(Oracle(path), texts, seed=11),
            }
            write(name, data)
        # Overlapping special texts, on SmolLM2's vocabulary.
        token_types = list(tokenizer_metadata_value("smollm2", "tokenizer.ggml.token_type"))
        tokens = tokenizer_metadata_value("smollm2", "tokenizer.ggml.tokens")
        for text, token_type in OVERLAP_PATCH.items():
            token_types[tokens.index(text)] = token_type
        path = write_tiny_model(
            Path(tmp) / "overlap.gguf",
            "llama",
            tokenizer="smollm2",
            extra_metadata={"tokenizer.ggml.token_type": (token_types, GGUFValueType.ARRAY)},
        )
        data = {"source": source, "model": "smollm2", "overrides": {}, "token_type_patch": OVERLAP_PATCH,
                **fixture_for(Oracle(path), OVERLAP_TEXTS + texts, seed=13)}  # fmt: skip
        write("smollm2_overlapping_specials", data)


def tokenizer_metadata_value(model: str, key: str):
    return next(value for k, value, _, _ in tokenizer_metadata(model) if k == key)


def write(name: str, data: dict) -> None:
    out = FIXTURES / f"tokenizer_{name}.json"
    out.write_text(
        json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8"
    )
    print(
        f"wrote {out.relative_to(ROOT)} ({out.stat().st_size // 1024} KiB, {len(data['cases'])} texts)"
    )


# --- --check N: compare engine/tokenizer.py with llama.cpp on N random texts, write nothing ---
_CHECK_RANGES = [
    (0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F),
    (0x2100, 0x214F), (0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x4E00, 0x4EFF), (0xAC00, 0xAD00),
    (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF), (0x1D400, 0x1D7FF),
    (0xE0000, 0xE007F), (0x10000, 0x1007F),
]  # fmt: skip


def check_texts(n: int, seed: int) -> list[str]:
    """Random texts mixing code points from many scripts/categories with the fuzz pieces."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        out = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.35:
                out.append(rng.choice(_FUZZ_PIECES))
            else:
                lo, hi = rng.choice(_CHECK_RANGES)
                out.append(chr(rng.randint(lo, hi)))
        texts.append("".join(out))
    return texts


def check(n: int, seed: int) -> int:
    from engine.gguf import open_gguf
    from engine.tokenizer import Tokenizer

    texts = check_texts(n, seed)
    bases = {"smollm2": default_model_path(), "gemma3": gemma3_270m_path()}
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        configs = [(name, name, {}) for name in bases] + [
            (n_, b, o) for n_, (b, o) in VARIANTS.items()
        ]
        for name, base, overrides in configs:
            metadata = open_gguf(bases[base]).metadata
            if overrides:
                arch = "llama" if base == "smollm2" else "gemma3"
                path = write_tiny_model(
                    Path(tmp) / f"{name}.gguf", arch, tokenizer=base, extra_metadata=overrides
                )
                tok = Tokenizer.from_metadata(
                    {**metadata, **{k: v for k, (v, _) in overrides.items()}}
                )
            else:
                path, tok = bases[base], Tokenizer.from_metadata(metadata)
            oracle = Oracle(path)
            bad = [t for t in texts if tok.encode(t) != oracle.tokenize(t, True)]
            bad_decode = [
                t
                for t in texts
                if tok.decode_bytes(ids := oracle.tokenize(t, True)) != oracle.detokenize(ids)
            ]
            failures += len(bad) + len(bad_decode)
            print(f"{name}: {len(bad)} encode and {len(bad_decode)} decode mismatches in {len(texts)} texts"
                  + (f", e.g. {bad[:2] or bad_decode[:2]!r}" if bad or bad_decode else ""))  # fmt: skip
    return failures


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--check":
        sys.exit(
            1 if check(int(sys.argv[2]), seed=int(sys.argv[3]) if len(sys.argv) > 3 else 0) else 0
        )
    main()
