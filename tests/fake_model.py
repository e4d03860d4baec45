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

from engine.cancel import CancelToken
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


# --- a batched stand-in for the batch scheduler (engine/batching) --------------------------------
class BatchedScriptedModel(ScriptedModel):
    """ScriptedModel with the batched surface engine.batching's scheduler uses: `max_batch`,
    `check_ids` and `forward_segments` (one step: several sequences, each with its own KVCache).

    Checks its input as TransformerModel.forward_segments does (ids in the vocabulary, at most
    max_batch tokens, one segment per cache, room in every cache) before touching any cache, and
    records every step as [(cache, token ids), ...] in `steps`. `on_step(segments)` runs before
    the step is computed: a test may cancel a request there, or raise to fail the step."""

    def __init__(
        self,
        logits_for: Callable[[list[int]], np.ndarray],
        config: FakeConfig | None = None,
        *,
        max_batch: int = 32,
    ):
        super().__init__(logits_for, config)
        self.max_batch = max_batch
        self.steps: list[list[tuple[KVCache, list[int]]]] = []
        self.on_step: Callable[[list], None] | None = None

    def check_ids(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = (ids < 0) | (ids >= self.config.vocab_size)
        if bad.any():
            raise ValueError(
                f"token id {int(ids[bad][0])} is out of range [0, {self.config.vocab_size})"
            )

    def forward_segments(self, segments, cancel=None) -> list[np.ndarray]:
        if not segments:
            raise ValueError("forward_segments() needs at least one segment")
        total = 0
        for seg in segments:
            ids = np.asarray(seg.ids, dtype=np.int64).reshape(-1)
            if ids.size == 0:
                raise ValueError("forward_segments(): a segment has no tokens")
            self.check_ids(ids)
            seg.cache.reserve(ids.size)
            total += ids.size
        if total > self.max_batch:
            raise ValueError(
                f"forward_segments(): {total} tokens exceed max_batch={self.max_batch}"
            )
        if len({id(seg.cache) for seg in segments}) != len(segments):
            raise ValueError("forward_segments(): two segments write the same KV cache")
        self.steps.append([(seg.cache, [int(t) for t in seg.ids]) for seg in segments])
        if self.on_step is not None:
            self.on_step(segments)
        out = []
        for seg in segments:
            tokens = [int(t) for t in seg.ids]
            start = seg.cache.n_tokens
            seg.cache.commit(tokens)
            history = seg.cache.tokens
            rows = np.asarray(seg.logit_rows, dtype=np.int64).reshape(-1)
            logits = np.zeros((rows.size, VOCAB_SIZE), np.float32)
            for i, r in enumerate(rows):
                logits[i] = self.logits_for(history[: start + int(r) + 1])
            out.append(logits)
        return out

    def tokens_fed_to(self, cache: KVCache) -> list[int]:
        """Every token the steps so far fed into `cache`, in order."""
        return [t for step in self.steps for c, ids in step if c is cache for t in ids]


def script_replies(replies: dict[tuple[int, ...], Sequence[int]], after: int = EOS):
    """Several prompts, each with its own reply: after a prefix that starts with one of the
    prompts (the longest that matches), generated position i gets a clear argmax at reply[i],
    and `after` (default end-of-sequence) past the reply. Other prefixes get flat logits."""
    by_length = sorted(replies.items(), key=lambda item: -len(item[0]))

    def logits_for(prefix: list[int]) -> np.ndarray:
        for prompt, reply in by_length:
            n = len(prompt)
            if len(prefix) >= n and tuple(prefix[:n]) == tuple(prompt):
                i = len(prefix) - n
                return one_hot(reply[i] if i < len(reply) else after)
        return np.zeros(VOCAB_SIZE, np.float32)

    return logits_for


def batched_fake_lm(logits_for, *, n_ctx: int = 64, max_batch: int = 32, **kwargs):
    """A FakeLoadedModel over a BatchedScriptedModel (for engine.batching.BatchScheduler)."""
    return FakeLoadedModel(
        BatchedScriptedModel(logits_for, max_batch=max_batch), n_ctx=n_ctx, **kwargs
    )


class CancelAfter(CancelToken):
    """A cancel token that reads as cancelled from its (polls + 1)-th check on: the user pressing
    Stop at a known point (inside a forward pass, mid-reply, mid-replay). cancel() still works."""

    def __init__(self, polls: int):
        super().__init__()
        self.polls = polls

    @property
    def cancelled(self) -> bool:
        self.polls -= 1
        return self.polls < 0 or super().cancelled
