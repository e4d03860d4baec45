"""JSON mode: a logits processor that only lets through tokens keeping the output valid JSON.

Modes (GenerationRequest.json_mode): "off"; "object" (any JSON object); "schema" (a value matching
the request's JSON schema). The grammar engine is llguidance:
- it builds its token trie from each token's bytes (our Tokenizer.piece_bytes) or from an HF
  `tokenizers` JSON, so both vocabularies we ship (GPT-2 byte-level BPE, 49k; Gemma's
  SentencePiece with byte fallback, 262k) work without torch or transformers;
- it writes the allowed-token bitmask into a numpy buffer we own (no per-token Python work over
  the vocabulary): measured 0.035 ms per token on SmolLM2's 49k vocabulary and 0.18 ms on
  gemma3's 262k, under 0.3% of a decode step (bench/bench_decoding.py);
- it validates schemas and names the problem ("Invalid type: foo", "Unimplemented keys: [...]").
xgrammar and outlines-core were the alternatives: xgrammar 0.2.9 hard-requires torch,
transformers and triton (its package metadata), far too heavy for a desktop bundle; outlines-core
has no dependencies but its design builds an Index over the whole vocabulary for each schema
before the first token, while llguidance computes each mask lazily from a token trie (no per-schema
precomputation) and was already a pinned dependency.

Output shape: whitespace between tokens is bounded, as in llama.cpp's JSON grammar: nothing, one
space, or a newline plus up to 20 spaces of indentation. Models write pretty-printed JSON
naturally ("{\n    \"name\": ...") and forcing a compact form pushes them off their preferred
tokens, while unbounded whitespace lets a small model emit newlines until the budget runs out.

Lifecycle in the generation loop (engine/generate.py):
    constraint = make_json_constraint(lm.tokenizer, mode, schema)   # None when mode == "off"
    each step:  logits = constraint(tokens, logits)   # advances over tokens it has not seen, masks
                token = sample(logits); constraint.accept(token)
                constraint.is_complete -> finish "grammar_complete"
A step whose mask allows no token raises ConstraintError instead of emitting an arbitrary token.

llguidance is native (Rust) code: a panic surfaces as `pyo3_runtime.PanicException`, which derives
from BaseException, so `except Exception` does not see it and a request would die without its
finish event. Two defences: what llguidance is given is validated first (it asserts on a token of
more than 1,024 bytes, e.g. a junk 5,000-character token in a downloaded vocabulary; such tokens
are withheld from the grammar), and every call into it goes through `_native_guard`, which turns
any error or panic into a ConstraintError. Schemas are checked before llguidance sees them
(`validate_schema`): nesting depth, and `$ref` cycles that can never produce a finite value.
"""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np

from engine.errors import ConfigValidationError, ConstraintError
from engine.schema_structure import MAX_SCHEMA_DEPTH, check_ref_cycles, check_schema_depth
from engine.types import JsonMode

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict that exists only in the stub

# Bounded whitespace (see the module docstring); no whitespace before the value itself.
_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": True,
    "whitespace_pattern": r"(?:\x20|\x0A\x20{0,20})",
}
_ANY_OBJECT_SCHEMA = {"type": "object"}

# llguidance's token trie asserts (a Rust panic) on a token longer than this many bytes
# (toktrie PARENT_BITS = 10; measured: 1,024 bytes build, 1,025 panic).
MAX_TOKEN_BYTES = 1024


def _is_native_panic(exc: BaseException) -> bool:
    # pyo3_runtime.PanicException cannot be imported by name; it is recognised by its type.
    return type(exc).__name__ == "PanicException"


@contextlib.contextmanager
def _native_guard(what: str) -> Iterator[None]:
    """Turn anything llguidance raises, including a Rust panic, into a ConstraintError. A
    KeyboardInterrupt, SystemExit or any other BaseException still propagates unchanged."""
    try:
        yield
    except ConstraintError:
        raise
    except Exception as exc:
        raise ConstraintError(f"JSON mode failed while {what}: {_first_line(str(exc))}") from exc
    except BaseException as exc:
        if not _is_native_panic(exc):
            raise
        raise ConstraintError(
            f"JSON mode failed while {what}: the grammar library crashed ({_first_line(str(exc))})"
        ) from exc


# Building the llguidance token trie takes ~0.4 s (49k vocab) to 1.2-4 s (262k vocab, depending on
# machine load): once per tokenizer.
_llg_tokenizers: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = (
    weakref.WeakKeyDictionary()
)
_llg_tokenizers_lock = threading.Lock()


def llg_tokenizer_for(tokenizer) -> llguidance.LLTokenizer:
    """The llguidance view of an engine Tokenizer, built once per tokenizer and cached.

    With `piece_bytes` (engine.tokenizer.Tokenizer) llguidance gets each token's exact bytes, as
    llama.cpp renders them, and our own `encode`; otherwise it reads the HF tokenizer JSON
    (`.hf`). Every end-of-generation id counts as "end" for the grammar, so a finished value may
    be closed by whichever of them the model prefers (Gemma: <eos>, <end_of_turn>, </s>).
    """
    with _llg_tokenizers_lock:
        cached = _llg_tokenizers.get(tokenizer)
        if cached is not None:
            return cached
        eog = sorted(int(t) for t in tokenizer.eog_ids)
        if not eog:
            raise ConstraintError(
                "JSON mode needs an end-of-generation token, and this tokenizer has none"
            )
        # llguidance raises plain ValueError/RuntimeError on odd vocabularies, or panics.
        with _native_guard("reading this model's tokenizer"):
            if hasattr(tokenizer, "piece_bytes"):
                source = llguidance.TokenizerWrapper(_TokenBytes(tokenizer))
                n_vocab = int(tokenizer.vocab_size)
            else:
                _check_hf_token_lengths(tokenizer.hf)
                source = tokenizer.hf.to_str()
                n_vocab = max(
                    int(tokenizer.vocab_size),
                    int(tokenizer.hf.get_vocab_size(with_added_tokens=True)),
                )
            built = llguidance.LLTokenizer(source, n_vocab=n_vocab, eos_token=eog)
        _llg_tokenizers[tokenizer] = built
        return built


class _TokenBytes:
    """What llguidance.TokenizerWrapper reads: token bytes, special ids, and a str -> ids call.

    Control tokens and tokens that render as nothing are marked special (llguidance never uses
    special tokens to spell grammar text); an empty one gets a unique placeholder text, because an
    empty token would match anywhere. A token longer than MAX_TOKEN_BYTES (which would crash
    llguidance) is withheld the same way: JSON mode never emits it, every other token still works.
    """

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = (
            tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids)
        )
        self.bos_token_id = tokenizer.bos_id
        tokens: list[bytes] = []
        special: list[int] = []
        self.withheld: list[int] = []  # ids longer than MAX_TOKEN_BYTES
        for token_id in range(int(tokenizer.vocab_size)):
            raw = tokenizer.piece_bytes(token_id, special=True)
            if len(raw) > MAX_TOKEN_BYTES:
                self.withheld.append(token_id)
                raw = b""
            if not raw or tokenizer.is_special(token_id):
                special.append(token_id)
                raw = raw or f"<unused:{token_id}>".encode()
            tokens.append(raw)
        self.tokens = tokens
        self.special_token_ids = special

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special=False)


def _check_hf_token_lengths(hf) -> None:
    """Without our own token bytes, an over-long token cannot be withheld: refuse it by name."""
    for text, token_id in hf.get_vocab(with_added_tokens=True).items():
        if len(text.encode()) > MAX_TOKEN_BYTES:
            raise ConstraintError(
                f"JSON mode cannot use this model's tokenizer: token {token_id} is "
                f"{len(text.encode())} bytes long (the grammar library handles at most "
                f"{MAX_TOKEN_BYTES})"
            )


def json_grammar(
    mode: str, schema: Any = None, llg_tokenizer: llguidance.LLTokenizer | None = None
) -> str:
    """The llguidance grammar for a JSON mode, validated. `schema` is a dict or JSON text.

    Raises ConfigValidationError for an unknown mode and ConstraintError naming what is wrong with
    the schema (not JSON, not an object, unsatisfiable, unsupported keyword, bad regex, ...).
    Passing the tokenizer also checks the grammar against its vocabulary.
    """
    if mode not in (JsonMode.OBJECT, JsonMode.SCHEMA):
        raise ConfigValidationError(
            "json_mode", mode, "one of " + ", ".join(repr(str(m)) for m in JsonMode)
        )
    if mode == JsonMode.OBJECT:
        schema = _ANY_OBJECT_SCHEMA
    elif schema is None:
        raise ConstraintError('json_mode "schema" needs a JSON schema, and none was given')
    if isinstance(schema, (bytes, str)):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ConstraintError(f"The JSON schema is not valid JSON: {exc}") from exc
        except RecursionError:
            raise ConstraintError(
                f"The JSON schema is nested too deeply to read (the schema depth limit is "
                f"{MAX_SCHEMA_DEPTH})"
            ) from None
    if not isinstance(schema, dict):
        raise ConstraintError(
            f"The JSON schema must be a JSON object (got {type(schema).__name__}: {str(schema)[:60]!r})"
        )
    if mode == "schema":
        check_schema_depth(schema)
        check_ref_cycles(schema)
    try:
        with _native_guard("building the grammar for the JSON schema"):
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    except ConstraintError as exc:
        cause = exc.__cause__
        if isinstance(cause, (ValueError, TypeError)):
            raise ConstraintError(f"The JSON schema cannot be used: {cause}") from cause
        raise
    with _native_guard("validating the JSON schema"):
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, llg_tokenizer
        )
    if is_error:
        raise ConstraintError(
            "The JSON schema is invalid: " + "; ".join(m.strip() for m in messages)
        )
    return grammar


def validate_schema(schema: Any) -> None:
    """Check a JSON schema (dict or JSON text) before a request is sent; the app's schema editor
    calls this on every edit. Raises ConstraintError naming the problem: not JSON, not an object,
    nested past MAX_SCHEMA_DEPTH, a `$ref` cycle no finite value can satisfy, or anything the
    grammar library rejects. Never raises anything else (a native panic becomes ConstraintError)."""
    json_grammar("schema", schema)


class JsonConstraint:
    """Logits processor `(tokens, logits) -> logits` for one request in JSON mode.

    The matcher follows the sequence by itself: the first call records len(tokens) as the start of
    the answer, later calls consume whatever tokens were appended since (so it works whether the
    loop also calls `accept` or not, and never consumes a token twice).
    """

    def __init__(self, llg_tokenizer: llguidance.LLTokenizer, grammar: str):
        with _native_guard("building the JSON grammar"):
            self._matcher = llguidance.LLMatcher(llg_tokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            raise ConstraintError(
                f"The JSON grammar could not be built: {_first_line(self._matcher.get_error())}"
            )
        self.vocab_size = int(llg_tokenizer.vocab_size)
        n_words = (self.vocab_size + 31) // 32
        self._bitmask = np.full((1, n_words), -1, dtype=np.int32)  # llguidance writes here
        self._mask_ptr = (
            self._bitmask.ctypes.data
        )  # cached: reading .ctypes.data costs microseconds
        self._mask_bytes = self._bitmask.nbytes
        self._start: int | None = None  # len(tokens) at the first call = where the answer starts
        self.n_consumed = 0  # answer tokens the matcher has accepted

    # --- the processor ---------------------------------------------------------------------------
    def __call__(self, tokens: Sequence[int], logits: np.ndarray) -> np.ndarray:
        self._sync(tokens)
        allowed = self.allowed_mask()
        n = min(allowed.shape[0], logits.shape[-1])
        if not allowed[:n].any():
            raise ConstraintError(
                f"JSON mode: the grammar allows none of the model's {logits.shape[-1]} tokens after "
                f"{self.n_consumed} generated tokens"
            )
        # Ids beyond the tokenizer's vocabulary (padded embedding rows) are never valid JSON text.
        logits[n:] = -np.inf
        np.copyto(logits[:n], -np.inf, where=~allowed[:n])
        return logits

    def allowed_mask(self) -> np.ndarray:
        """Boolean (vocab_size,) array of the tokens the grammar allows next."""
        with _native_guard(f"computing the allowed tokens after {self.n_consumed} tokens"):
            self._matcher.unsafe_compute_mask_ptr(self._mask_ptr, self._mask_bytes)
        if self._matcher.is_error():
            raise ConstraintError(
                "JSON mode cannot continue: no token of this model's vocabulary can extend the value "
                f"after {self.n_consumed} generated tokens ({_first_line(self._matcher.get_error())})"
            )
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
        return bits[: self.vocab_size].view(bool)

    # --- following the sequence ------------------------------------------------------------------
    def accept(self, token_id: int) -> None:
        """Advance over one generated token; a token the grammar forbids raises ConstraintError."""
        if self._start is None:
            raise ConstraintError(
                "JSON mode: a token was accepted before the first mask was computed"
            )
        with _native_guard(f"accepting token {int(token_id)}"):
            accepted = self._matcher.consume_token(int(token_id))
        if not accepted:
            raise ConstraintError(
                f"JSON mode: token {int(token_id)} is not allowed here: {_first_line(self._matcher.get_error())}"
            )
        self.n_consumed += 1

    def _sync(self, tokens: Sequence[int]) -> None:
        if self._start is None:
            self._start = len(tokens)
            return
        for token_id in tokens[self._start + self.n_consumed :]:
            self.accept(token_id)

    def rollback(self, n_tokens: int) -> None:
        """Forget the last n accepted tokens (speculative decoding rejected them)."""
        if not 0 <= n_tokens <= self.n_consumed:
            raise ValueError(f"rollback({n_tokens}): must be between 0 and {self.n_consumed}")
        with _native_guard(f"rolling back {n_tokens} tokens"):
            rolled_back = not n_tokens or self._matcher.rollback(n_tokens)
        if not rolled_back:
            raise ConstraintError(
                f"JSON mode: rollback failed: {_first_line(self._matcher.get_error())}"
            )
        self.n_consumed -= n_tokens

    @property
    def is_complete(self) -> bool:
        """The value is closed and nothing but end-of-generation may follow (-> grammar_complete)."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    @property
    def is_accepting(self) -> bool:
        """What was generated so far is a complete value (more may still be allowed, e.g. digits)."""
        return self._matcher.is_accepting()


def _first_line(message: str) -> str:
    """llguidance appends a multi-line parser state dump to its errors; users need the first line."""
    return message.strip().split("\n", 1)[0]


def make_json_constraint(tokenizer, mode: str = "off", schema: Any = None) -> JsonConstraint | None:
    """The JSON-mode processor for a request, or None when mode is "off"."""
    if mode == JsonMode.OFF:
        return None
    llg_tok = llg_tokenizer_for(tokenizer)
    return JsonConstraint(llg_tok, json_grammar(mode, schema, llg_tok))
