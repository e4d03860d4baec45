"""The engine's shared vocabulary: the values and records that cross from one module to another and
from the engine to the app. One definition each, and no numpy, no Qt: the app imports this module
on the GUI thread before numpy and the kernels are loaded (the window opens first).

The enums are `StrEnum`s, so a member equals its string ("stop" == FinishReason.STOP): values
read back from the database, JSON or the command line compare and serialise as plain strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from engine.generation_config import GenerationConfig
from engine.model_protocol import LanguageModel

if TYPE_CHECKING:
    import numpy as np


class JsonMode(StrEnum):
    """How the reply is constrained (engine/constrained.py builds the grammar)."""

    OFF = "off"  # free text
    OBJECT = "object"  # any JSON object
    SCHEMA = "schema"  # a JSON value matching the request's schema


class KvCacheType(StrEnum):
    """How the KV cache stores each key/value row (engine/kv_cache.py, engine/kv_quant.py)."""

    F16 = "f16"  # float16, the default
    Q8_0 = "q8_0"  # ggml block_q8_0: 34 bytes per 32 values, 0.53x the memory of f16


# The one list of cache types the CLI, the app's settings and the server offer.
KV_CACHE_TYPES: tuple[str, ...] = tuple(t.value for t in KvCacheType)
DEFAULT_KV_CACHE_TYPE = KvCacheType.F16


class FinishReason(StrEnum):
    """Why a request ended (`Finished.finish_reason`); engine/stopping.py orders them."""

    STOP = "stop"  # an end-of-generation token id was sampled (not included in the output)
    STOP_SEQUENCE = "stop_sequence"  # a user stop string matched (not included in the output)
    LENGTH = "length"  # max_new_tokens or the context limit was reached
    CANCELLED = "cancelled"  # the CancelToken was set; everything emitted so far is kept
    GRAMMAR_COMPLETE = "grammar_complete"  # JSON mode: the value is complete and valid
    TOOL_CALLS = "tool_calls"  # the reply ended on one or more tool calls (Finished.tool_calls)
    ERROR = "error"  # an exception ended the request; `Finished.error` says what
    # the reply kept writing the same span of tokens (engine/repetition.py); what it wrote is kept
    REPETITION = "repetition"


class MessageStatus(StrEnum):
    """The state of a stored chat message (the app's store, views and export read it); a reply's
    final status follows from its finish reason (app/reply_recorder.py)."""

    COMPLETE = "complete"
    STREAMING = "streaming"  # a reply being generated right now (partial text saved)
    CANCELLED = "cancelled"  # the user stopped it; the partial text is kept
    ERROR = "error"
    INTERRUPTED = "interrupted"  # was streaming when the app died; found on the next open


class ToolApproval(StrEnum):
    """How a tool call in the app was let run (stored on its role "tool" message)."""

    AUTOMATIC = "automatic"  # a built-in tool: safe, runs without asking
    PENDING = "pending"  # waiting for the user's answer
    ONCE = "once"  # the user allowed this call
    ALWAYS = "always"  # allowed for this tool in this chat, now and from then on
    DENIED = "denied"  # the user refused; the model is told so
    CANCELLED = "cancelled"  # Stop arrived before or while it ran


class Role(StrEnum):
    """Chat message roles, as chat templates and the store spell them."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  # a tool's result, answering an assistant message's tool_calls


class ToolChoice(StrEnum):
    """`GenerationRequest.tool_choice` as a word; a named function is the OpenAI dict
    {"type": "function", "function": {"name": ...}} instead."""

    AUTO = "auto"  # the model decides; calls are parsed from its own format
    NONE = "none"  # tools are not offered to the model (nor parsed)
    REQUIRED = "required"  # the reply is one constrained call to one of the offered tools


class ToolCallFormat(StrEnum):
    """How a model writes tool calls, detected from its chat template (engine/tool_calls)."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Qwen3)
    LLAMA3_JSON = "llama3_json"  # {"name": ..., "parameters": {...}} as the reply (Llama 3.1+)
    MISTRAL = "mistral"  # [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
    GENERIC_JSON = "generic_json"  # a {"name", "arguments"} object on its own line (fallback)


@dataclass(frozen=True)
class ToolSpec:
    """One offered function, validated (engine.tool_calls.spec.parse_tools)."""

    name: str
    description: str
    parameters: dict  # a JSON schema for the arguments object

    def to_openai(self) -> dict:
        """The OpenAI function-tool dict, as chat templates receive it (`tools=`)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class ToolCall:
    """A complete tool call the model made, with arguments that validate against its tool's
    schema (only such calls are executable; others arrive as ToolCallMalformed)."""

    id: str
    name: str
    arguments: dict

    def to_openai(self) -> dict:
        """The OpenAI `tool_calls` entry, for an assistant message in the history."""
        import json

        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass
class GenerationRequest:
    """One request to `engine.generate.generate` (the module docstring there explains each seam)."""

    messages: Sequence[dict] | None = None  # chat messages, rendered with the model's template
    prompt: str | None = None  # raw text, tokenized with BOS as the model's metadata says
    prompt_ids: Sequence[int] | None = None  # already-tokenized prompt (exactly as given)
    overrides: dict = field(default_factory=dict)  # per-request values (GenerationConfig fields)
    saved_preset: dict | None = None  # the user's saved values for this model
    json_mode: str = JsonMode.OFF
    json_schema: Any = None  # dict or JSON text, for JsonMode.SCHEMA
    speculative: Any = None  # None (engine default) | False | True | a drafter object
    top_logprobs: int = 0  # alternatives per TokenSampled (0..generate.MAX_TOP_LOGPROBS)
    # The chat template's thinking switch (Qwen3 and others): None leaves it to the template.
    enable_thinking: bool | None = None
    kv_budget_bytes: int | None = None  # None: generate.default_kv_budget_bytes()
    prefix_cache: SupportsPrefixReuse | None = None
    # OpenAI function tools: [{"type": "function", "function": {"name", "description",
    # "parameters"}}, ...] (the bare {"name", ...} function dict is accepted too)
    tools: Sequence[dict] | None = None
    # a ToolChoice word, or {"type": "function", "function": {"name": ...}} for one function
    tool_choice: Any = ToolChoice.AUTO
    # with "auto" too, decode each call under the call grammar once the model opens it (models
    # whose calls open with one token: Hermes <tool_call>, Mistral [TOOL_CALLS])
    constrain_tool_calls: bool = False


@dataclass
class PrefixHit:
    """A prefix cache's answer to `lookup`: a KVCache holding the first n_tokens of the prompt,
    which the request owns from now on, and the logits after them when the prompt is exactly a
    stored prefix (then the request needs no forward pass before sampling)."""

    cache: Any  # engine.kv_cache.KVCache
    n_tokens: int
    next_logits: np.ndarray | None = None


class SupportsPrefixReuse(Protocol):
    """The generation loop's prefix-cache seam (engine.prefix_cache.PrefixCache implements it)."""

    def lookup(
        self, lm: LanguageModel, prompt_ids: Sequence[int], min_capacity: int
    ) -> PrefixHit | None: ...

    def store(
        self, lm: LanguageModel, token_ids: Sequence[int], cache, next_logits: np.ndarray | None
    ) -> None: ...


@dataclass(frozen=True)
class ResolvedPreset:
    """A request's sampling values and where each came from (engine.presets.resolve_preset); the
    app's preset panel shows it as is."""

    values: dict  # field -> value, every GenerationConfig field present, JSON-serializable
    sources: dict  # field -> one of engine.presets.SOURCES
    notes: tuple[str, ...] = ()  # things the user may want to know (skipped files, ignored keys)
    extra_eog_ids: frozenset[int] = field(default_factory=frozenset)  # from generation_config.json
    reasons: dict = field(default_factory=dict)  # field -> why a value was implied (presets.py)

    @property
    def config(self) -> GenerationConfig:
        return GenerationConfig.from_values(self.values)

    def to_dict(self) -> dict:
        """{"values": {...}, "sources": {...}, "notes": [...]}: what the CLI and the app show."""
        return {
            "values": dict(self.values),
            "sources": dict(self.sources),
            "notes": list(self.notes),
        }

    def records(self) -> dict:
        """field -> {"value": v, "source": s}, for a table of values with provenance."""
        return {
            name: {"value": self.values[name], "source": self.sources[name]} for name in self.values
        }


@dataclass(frozen=True)
class ModelInfo:
    """Plain facts about a loaded model, safe to hand to another thread: the app's GUI shows them
    and resolves presets from them (engine.presets.resolve_preset) without touching the model."""

    path: str
    name: str
    architecture: str
    n_ctx: int
    template: str  # chat template name, "(fallback)" appended when the model has none
    sampling_metadata: dict = field(default_factory=dict)  # engine.presets.sampling_metadata
    summary: str = ""  # one line: name, architecture, quant, kernel path (printed on stderr)
    thinking_switch: bool = False  # the chat template reads enable_thinking (reasoning on/off)
    kv_cache_type: str = DEFAULT_KV_CACHE_TYPE.value  # a KV_CACHE_TYPES member
    # no chat template of its own and no instruct marker in its name: a base model, which
    # continues text rather than answering (engine.model_summary.is_base_model)
    base_model: bool = False


@dataclass(frozen=True)
class TokenChoice:
    """One token of a reply as a replay report shows it."""

    token_id: int
    text: str
    logprob: float | None  # None where it was not recorded (beyond the stored token records)


@dataclass(frozen=True)
class Divergence:
    """Where a replay first chose another token than the original reply (engine/receipt.py)."""

    index: int  # 0-based among generated tokens
    original: TokenChoice | None  # None: the original had ended here
    replayed: TokenChoice | None  # None: the replay ended here
    # Each run's token under the other run's distribution, when it was among the alternatives
    # recorded there (the original stores its top 5; the replay asks for its top 20).
    original_logprob_in_replay: float | None = None
    replayed_logprob_in_original: float | None = None
    # True when both runs gave both tokens the same probabilities here: the model saw the same
    # thing and the sampler chose differently (preset or seed), not the model or the prompt.
    same_distribution: bool | None = None


@dataclass(frozen=True)
class ReplayReport:
    """The answer to "does this reply reproduce from its receipt?" (engine.receipt.replay)."""

    identical: bool
    original_tokens: int
    replayed_tokens: int
    divergence: Divergence | None
    differences: tuple[str, ...]  # what differs in the receipt: model file, template, engine...
    replay_text: str = ""
    stopped: bool = False  # the user stopped the replay before it could tell (no verdict)


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot of the batch scheduler (engine/batching): what a server's status line and
    /health show. Idle means running == queued == kv_bytes_reserved == 0."""

    running: int  # admitted requests not finished yet
    queued: int  # waiting for KV memory or a concurrency slot, in FIFO order
    kv_bytes_reserved: int  # worst-case KV bytes of the running requests
    kv_budget_bytes: int
    steps: int  # batched forward passes run so far
    max_concurrency: int
    max_queue: int


@dataclass(frozen=True)
class ModelFileSummary:
    """One GGUF file as the model library lists it, read from the header alone (no weights, no
    tokenizer): engine.model_summary.summarize_model_file builds it. A file that cannot be read
    has `error` set and the other facts left empty; it is listed, not dropped."""

    path: str
    size: int  # bytes on disk
    source: str = ""  # where it was found: "Hugging Face cache", "LM Studio", a chosen folder...
    display_name: str = ""  # repo/file, Ollama model:tag or the file name
    name: str | None = None  # general.name
    architecture: str | None = None
    parameters: int | None = None
    quant: str | None = None  # general.file_type as llama.cpp names it (Q4_K_M) or the main type
    quant_mix: tuple[tuple[str, int, int], ...] = ()  # (type, tensors, bytes), largest first
    context_length: int | None = None
    has_chat_template: bool = False
    base_model: bool = False  # engine.model_summary.is_base_model
    supported: bool = False
    unsupported_reason: str | None = None
    error: str | None = None  # the file is not a readable GGUF: why
