"""llama.cpp's tables for GGUF vocabularies (src/llama-vocab.cpp): token types and the attribute
bits derived from them, the pre-tokenizer regexes per `tokenizer.ggml.pre` name, and the token
texts it recognises as end-of-generation, fill-in-the-middle and always-rendered tokens."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_MODELS = ("gpt2", "llama")

# GGUF token types (gguf.TokenType) and llama.cpp's token attribute bits derived from them.
(
    TYPE_UNDEFINED,
    TYPE_NORMAL,
    TYPE_UNKNOWN,
    TYPE_CONTROL,
    TYPE_USER_DEFINED,
    TYPE_UNUSED,
    TYPE_BYTE,
) = range(7)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
TYPE_TO_ATTR = {
    TYPE_UNDEFINED: ATTR_UNDEFINED,
    TYPE_NORMAL: ATTR_NORMAL,
    TYPE_UNKNOWN: ATTR_UNKNOWN,
    TYPE_CONTROL: ATTR_CONTROL,
    TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TYPE_UNUSED: ATTR_UNUSED,
    TYPE_BYTE: ATTR_BYTE,
}
# Tokens cut out of the text before the model sees it (llama.cpp's cache_special_tokens).
PARTITIONED = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
# Tokens that decode to nothing in user-visible text.
HIDDEN = ATTR_CONTROL | ATTR_UNKNOWN

# --- pre-tokenizer regexes, verbatim from llama.cpp's llm_tokenizer_bpe ----------------------------
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's hand-written GPT-2 splitter also ends with the original pattern's final `|\s+`.
_GPT2_FULL = _GPT2 + r"|\s+"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# o200k (gpt-4o, gpt-oss, llama4): llama.cpp's form of tokenizer.json's pattern, whose \p{Lu}.. and
# (?i:..) classes its own regex engine lacks: "upper" is a letter outside a-z, "lower" a letter
# outside A-Z.
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text into words for one family of `tokenizer.ggml.pre` names."""

    regexes: tuple[str, ...]  # applied in sequence; matches and the text between both kept
    ignore_merges: bool = False  # a word that is itself in the vocab is one token (llama3)
    add_bos_default: bool = False  # BOS when the file has no add_bos_token key
    clean_spaces: bool = (
        False  # detokenize with llama.cpp's " ," -> "," clean-up (see clean_spaces())
    )


_DEFAULT_RULES = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_FULL, r"\p{N}+", r"[0-9][0-9][0-9]")
_PRE_FAMILIES: dict[tuple[str, ...], PreTokenizer] = {
    ("default",): PreTokenizer(_DEFAULT_RULES, clean_spaces=True),
    ("gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "jina-es", "jina-de", "jina-v2-es",
     "jina-v2-de", "gigachat", "a.x-4.0", "mellum", "modern-bert"): PreTokenizer((_GPT2_FULL,), clean_spaces=True),
    ("trillion", "granite-docling"): PreTokenizer((_GPT2_FULL,)),
    ("smollm", "command-r"): PreTokenizer((r"\p{N}", _GPT2_FULL)),
    ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
        PreTokenizer((r"\p{N}", _GPT2_FULL), clean_spaces=True),
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
        PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos_default=True, clean_spaces=True),
    ("dbrx", "smaug-bpe"): PreTokenizer((_LLAMA3,), clean_spaces=True),
    ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"): PreTokenizer((_QWEN2,)),
    ("megrez", "stablelm2"): PreTokenizer((_QWEN2,), clean_spaces=True),
    ("gpt-4o", "llama4"): PreTokenizer((_GPT4O,)),
}  # fmt: skip
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    name: pre for names, pre in _PRE_FAMILIES.items() for name in names
}

# Token texts llama.cpp treats as end-of-generation (llama-vocab.cpp, "special_eog_ids").
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})  # fmt: skip
# Texts llama.cpp recognises as EOT / EOM / fill-in-the-middle tokens when the file names none.
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")  # fmt: skip
EOM_TEXTS = ("<|eom_id|>",)
FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
FIM_SEP_TEXTS = ("<|file_sep|>",)
FIM_OTHER_TEXTS = (
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>",
)  # fmt: skip
# gpt-oss: llama.cpp always renders these (forces them to user-defined).
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

SPACE_ESCAPE = "\u2581"  # "▁", SentencePiece's visible space
