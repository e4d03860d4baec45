"""What the generation loop yields. Plain frozen dataclasses: the app forwards them over Qt signals,
the CLI prints them, tests compare them.

Order for one request: zero or more TokenSampled / TextDelta / ReasoningDelta and, when the
request offered tools, ToolCallStarted -> ToolCallArgumentsDelta* -> ToolCallFinished or
ToolCallMalformed per call (in stream order with the text around it), then exactly one
Finished (also on cancel and on error; an error after the request was accepted is a Finished with
finish_reason="error" and `error` set). A prompt longer than one prefill chunk first yields
PrefillProgress events: one before the first chunk, then one after each chunk read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.types import FinishReason, ToolCall

# The finish reasons under their long-standing names (the same members as FinishReason).
FINISH_STOP = FinishReason.STOP
FINISH_STOP_SEQUENCE = FinishReason.STOP_SEQUENCE
FINISH_LENGTH = FinishReason.LENGTH
FINISH_CANCELLED = FinishReason.CANCELLED
FINISH_GRAMMAR_COMPLETE = FinishReason.GRAMMAR_COMPLETE
FINISH_TOOL_CALLS = FinishReason.TOOL_CALLS
FINISH_ERROR = FinishReason.ERROR
FINISH_REPETITION = FinishReason.REPETITION
FINISH_REASONS = tuple(FinishReason)


@dataclass(frozen=True)
class TextDelta:
    """Answer text, safe to append (complete UTF-8 characters, never part of a stop string)."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Text inside <think>...</think> for models that emit it; shown apart from the answer."""

    text: str


@dataclass(frozen=True)
class ToolCallStarted:
    """The model began a call of tool `name` (the name is known before its arguments)."""

    id: str  # unique within the request; answer it with a {"role": "tool", "tool_call_id": id}
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    """More of the call's arguments as JSON text, as the model writes it (the deltas of one call
    concatenate to its arguments' JSON text). Show it; do not act on it before ToolCallFinished."""

    id: str
    text: str


@dataclass(frozen=True)
class ToolCallFinished:
    """A complete call whose arguments validate against the tool's schema: safe to execute."""

    id: str
    name: str
    arguments: dict

    @property
    def call(self) -> ToolCall:
        return ToolCall(self.id, self.name, self.arguments)


@dataclass(frozen=True)
class ToolCallMalformed:
    """A call that must not be executed: not JSON, cut off, an unknown tool, or arguments that
    do not validate against the tool's schema. `problem` says which, for a person."""

    id: str
    name: str  # "" when the model never wrote a readable name
    text: str  # what the model wrote for the call
    problem: str


@dataclass(frozen=True)
class PrefillProgress:
    """The prompt is being read: where, how fast, how long is left (engine/prefill_progress.py).

    Yielded before the first prefill chunk (eta_s None: nothing is measured yet) and after each
    chunk, only when more than one chunk is to be read. Positions count the whole prompt, the
    tokens a prefix cache already held (`cached`) included, so done runs cached..total."""

    done: int  # prompt tokens in the KV cache now
    total: int  # prompt tokens in all
    cached: int  # of those, held by the prefix cache (not read)
    elapsed_s: float  # since this prefill's first chunk started
    tok_s: float | None  # tokens read per second so far; None before the first chunk
    eta_s: float | None  # seconds left; None before the first chunk, 0.0 when done


@dataclass(frozen=True)
class TopAlternative:
    token_id: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenSampled:
    """One sampled token with its log-probability and the top alternatives (token inspector).

    Emitted for every generated token, before the text it contributes is released (text may be
    held back by the detokenizer or the stop matcher, so map tokens to text by `index`).
    """

    index: int  # 0-based position among generated tokens
    token_id: int
    text: str  # the token's own piece, decoded alone (may be partial UTF-8 -> replacement chars)
    logprob: float
    top: tuple[TopAlternative, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int  # after BOS and chat template
    completion_tokens: int
    cached_tokens: int | None  # None: no prefix cache consulted; 0: consulted, missed
    prefill_ms: float
    decode_ms: float
    ttft_ms: float  # request start -> first sampled token (>= prefill_ms)
    prompt_tok_s: float
    decode_tok_s: float
    context_used: int
    context_limit: int
    draft_tokens_proposed: int = 0  # speculative decoding
    draft_tokens_accepted: int = 0
    # True for a remote server's reply: the times are the app's, taken from the stream over the
    # network (time to first delta includes the round trip), not the engine's own clock.
    measured_over_network: bool = False
    # A remote server's own finish_reason as it sent it ("" when it named none), kept beside the
    # app's FinishReason because several of a server's words map to one of ours and the user must
    # see which (a server's "cancelled" is an error here, not the user's Stop). None: local reply.
    server_finish_reason: str | None = None

    @classmethod
    def nothing_read(cls, context_limit: int) -> Usage:
        """A request that ended before its prompt was read (a Stop before it started)."""
        return cls(
            prompt_tokens=0,
            completion_tokens=0,
            cached_tokens=None,
            prefill_ms=0.0,
            decode_ms=0.0,
            ttft_ms=0.0,
            prompt_tok_s=0.0,
            decode_tok_s=0.0,
            context_used=0,
            context_limit=context_limit,
        )

    @property
    def acceptance_rate(self) -> float | None:
        if not self.draft_tokens_proposed:
            return None
        return self.draft_tokens_accepted / self.draft_tokens_proposed


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason
    usage: Usage
    text: str  # the whole answer as emitted (concatenation of TextDelta)
    reasoning: str = ""  # concatenation of ReasoningDelta
    token_ids: tuple[int, ...] = ()  # generated ids, stop/end-of-generation tokens excluded
    error: str | None = None
    preset: dict = field(default_factory=dict)  # resolved sampling values with provenance
    prompt_ids: tuple[int, ...] = ()  # the prompt exactly as prefilled (template, trimming done)
    receipt: dict | None = None  # engine.receipt.build_receipt, when the caller asked for one
    tool_calls: tuple[ToolCall, ...] = ()  # the executable calls (ToolCallFinished), in order
