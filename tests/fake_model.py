"""A scripted-logits stand-in for a loaded model, for exact tests of the generation loop.

The fake has the LoadedModel surface the loop uses (`.model.forward/new_cache`, `.tokenizer`,
`.chat_template`, `.config`, `.n_ctx`, `.path`, `.gguf.metadata`) and a real engine.kv_cache.KVCache
(tiny dimensions), so truncation and cloning behave as in production.

Logits are a pure function of the token prefix: `logits_for(prefix) -> (vocab,)`. Scripts:
- `script_steps(n_prompt, [logits0, logits1, ...])`: the i-th generated position gets logits i,
  whatever the tokens (the classic "scripted logits" fake);
- `script_tokens(n_prompt, [t0, t1, ...])`: a one-hot-ish script that makes t_i the clear argmax
  at generated position i (the rest of the vocabulary gets low logits).
Because logits depend on the prefix only, batched speculative verification sees exactly what
token-by-token decoding sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.kv_cache import KVCache

# A small vocabulary of text pieces; ids are list positions.
SPECIALS = ["<s>", "</s>", "<|im_end|>", "<|im_start|>"]
BOS, EOS, IM_END, IM_START = 0, 1, 2, 3
PIECES = SPECIALS + [
    "Hello",
    " world",
    "!",
    " How",
    " are",
    " you",
    "?",
    "\n",
    " END",
    "E",
    "N",
    "D",
    " ",
    "<think>",
    "</think>",
    "thinking",
    " a",
    "a",
    "b",
    "c",
    "ab",
    "abc",
    "x",
    "y",
    "z",
    "é",
    "\xa0",
    "user",
    "assistant",
    "system",
]
VOCAB_SIZE = len(PIECES) + 4  # a few ids with empty text, like unused tokens in real vocabularies


def token_id(piece: str) -> int:
    return PIECES.index(piece)


class FakeTokenizer:
    """Pieces joined verbatim; specials are single ids; greedy longest-match encoding."""

    def __init__(self, eog_ids=(EOS, IM_END), add_bos: bool = True):
        self.bos_id = BOS
        self.eos_id = EOS
        self.eog_ids = frozenset(eog_ids)
        self.vocab_size = VOCAB_SIZE
        self.add_bos = add_bos

    def piece(self, token: int) -> str:
        return PIECES[token] if token < len(PIECES) else ""

    def token_id(self, text: str) -> int | None:
        return PIECES.index(text) if text in PIECES else None

    def encode(self, text: str, add_special: bool = True, *, literal_spans=()) -> list[int]:
        ids = [BOS] if (add_special and self.add_bos) else []
        by_length = sorted(range(len(PIECES)), key=lambda i: -len(PIECES[i]))
        literal = {p for start, stop in literal_spans for p in range(start, stop)}
        at = 0
        while at < len(text):
            for i in by_length:
                if i < len(SPECIALS) and at in literal:
                    continue  # special text inside a message is not a special token
                if PIECES[i] and text.startswith(PIECES[i], at):
                    ids.append(i)
                    at += len(PIECES[i])
                    break
            else:
                raise ValueError(f"fake tokenizer cannot encode {text[at:]!r}")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.piece(i) for i in ids if i not in (BOS,) and i not in self.eog_ids)


class FakeDetokenizer:
    """Streams each token's piece (the fake vocabulary has no partial characters)."""

    def __init__(self, tokenizer: FakeTokenizer):
        self.tokenizer = tokenizer

    def add(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def flush(self) -> str:
        return ""


class FakeChatTemplate:
    name = "chatml"
    is_fallback = False

    def render(self, messages, add_generation_prompt: bool = True, cancel=None) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


@dataclass
class FakeConfig:
    n_layers: int = 1
    n_kv_head: int = 1
    head_dim: int = 2
    vocab_size: int = VOCAB_SIZE


@dataclass
class ForwardCall:
    tokens: list[int]
    start: int
    all_logits: bool


class ScriptedModel:
    def __init__(
        self, logits_for: Callable[[list[int]], np.ndarray], config: FakeConfig | None = None
    ):
        self.logits_for = logits_for
        self.config = config or FakeConfig()
        self.calls: list[ForwardCall] = []
        self.on_forward: Callable[[ForwardCall], None] | None = None  # e.g. cancel mid-prefill
        self.caches_created: list[int] = []

    def new_cache(self, n_ctx: int) -> KVCache:
        self.caches_created.append(n_ctx)
        return KVCache.for_config(self.config, n_ctx)

    def forward(
        self, tokens, cache: KVCache, *, all_logits: bool = False, cancel=None
    ) -> np.ndarray:
        tokens = [int(t) for t in tokens]
        call = ForwardCall(tokens, cache.n_tokens, all_logits)
        self.calls.append(call)
        if self.on_forward is not None:
            self.on_forward(call)
        cache.reserve(len(tokens))
        cache.commit(tokens)
        history = cache.tokens
        start = len(history) - len(tokens)
        rows = np.stack(
            [self.logits_for(history[: start + i + 1]) for i in range(len(tokens))]
        ).astype(np.float32)
        return rows if all_logits else rows[-1].copy()


@dataclass
class FakeGGUF:
    metadata: dict = field(default_factory=dict)


@dataclass
class FakeLoadedModel:
    model: ScriptedModel
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    chat_template: FakeChatTemplate = field(default_factory=FakeChatTemplate)
    n_ctx: int = 64
    path: Path | None = None
    gguf: FakeGGUF = field(default_factory=FakeGGUF)

    @property
    def config(self) -> FakeConfig:
        return self.model.config


# --- scripts -------------------------------------------------------------------------------------
def script_steps(n_prompt: int, steps: Sequence[np.ndarray], after: np.ndarray | None = None):
    """Generated position i (prefix length n_prompt + i) gets steps[i]; later ones `after`
    (default: end-of-sequence)."""
    tail = after if after is not None else one_hot(EOS)

    def logits_for(prefix: list[int]) -> np.ndarray:
        i = len(prefix) - n_prompt
        if i < 0:
            return np.zeros(VOCAB_SIZE, np.float32)  # prompt positions: never sampled from
        return np.asarray(steps[i] if i < len(steps) else tail, dtype=np.float32)

    return logits_for


def script_tokens(n_prompt: int, tokens: Sequence[int], after: int = EOS):
    return script_steps(n_prompt, [one_hot(t) for t in tokens], one_hot(after))


def one_hot(token: int, high: float = 10.0, low: float = 0.0) -> np.ndarray:
    logits = np.full(VOCAB_SIZE, low, dtype=np.float32)
    logits[token] = high
    return logits


def ids(*pieces: str) -> list[int]:
    return [token_id(p) for p in pieces]


def fake_lm(
    logits_for, *, n_ctx: int = 64, tokenizer: FakeTokenizer | None = None, **kwargs
) -> FakeLoadedModel:
    return FakeLoadedModel(
        ScriptedModel(logits_for), tokenizer or FakeTokenizer(), n_ctx=n_ctx, **kwargs
    )


def use_fake_detokenizer(monkeypatch) -> None:
    """The loop builds engine.detokenizer.StreamingDetokenizer; the fake vocabulary needs its own."""
    import engine.generate

    monkeypatch.setattr(engine.generate, "new_detokenizer", FakeDetokenizer)


# --- a real model behind token ids as text ------------------------------------------------------
class IdTokenizer:
    """Enough tokenizer for prompt_ids requests on a real model: every id reads as "<id>"; id 0
    ends generation. Lets loop-level tests (prefix reuse, speculation) compare token streams of a
    real forward pass without depending on a vocabulary."""

    bos_id = None
    eos_id = 0
    eog_ids = frozenset({0})
    vocab_size = 49152

    def decode(self, ids) -> str:
        return "".join(f"<{int(i)}>" for i in ids if int(i) not in self.eog_ids)

    def piece(self, token: int) -> str:
        return f"<{int(token)}>"

    def token_id(self, text: str) -> None:
        return None  # no text is a single special token here


class IdDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def add(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def flush(self) -> str:
        return ""


def id_token_lm(model, n_ctx: int, monkeypatch):
    """The LoadedModel surface over `model` (a real or wrapped forward pass) with IdTokenizer."""
    from types import SimpleNamespace

    import engine.generate

    monkeypatch.setattr(engine.generate, "new_detokenizer", IdDetokenizer)
    return SimpleNamespace(
        model=model,
        config=model.config,
        tokenizer=IdTokenizer(),
        chat_template=None,
        n_ctx=n_ctx,
        path=None,
        gguf=SimpleNamespace(metadata={}),
    )
