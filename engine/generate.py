"""The generation loop: a request in, a stream of events out (engine/events.py).

    events = generate(lm, GenerationRequest(messages=[...], overrides={"max_new_tokens": 64}), cancel)

`generate` does everything that can refuse a request up front and raises instead of yielding:
resolving and validating the preset (ConfigValidationError, PresetFileError), rendering and
tokenizing the prompt, the context and memory ceilings (ContextOverflowError, MemoryBudgetError:
checked before any KV memory is allocated or any forward pass runs) and building a JSON
constraint (ConstraintError). It then returns an iterator. From there on every outcome,
including an exception, ends with exactly one `Finished` event.

The iterator is a stack of small generators, each adding one thing:

    _prefill            prompt -> KV cache + first logits, in chunks, cancel checked between chunks;
                        a prompt of several chunks yields PrefillProgress (tokens read, time left:
                        engine/prefill_progress.py) before the first chunk and after each
    _decode_steps       logits -> processors -> sampler -> Step(token, logprobs), one forward per
                        token, or a verified speculative draft per forward; cancel checked before
                        every sampled token
    _events             steps -> end-of-generation ids, detokenizer, stop strings, runaway
                        repetition (engine/repetition.py), <think> split, tool calls ->
                        TokenSampled / TextDelta / ReasoningDelta / ToolCall*, then Finished
                        with Usage

Tools (`GenerationRequest.tools`, `tool_choice`; engine/tool_calls): planned with the request
(typed errors name the field), rendered through the model's template as `tools=`, parsed from
the answer text in the model's own format (detected from the template) after the <think> split,
and, for tool_choice "required" or a named function, decoded under a call grammar (the same
seam as the JSON constraint). A reply that ends on calls finishes with "tool_calls".

Seams for decoding features (`GenerationRequest` and these seams are typed in engine/types.py):

- Prefix cache: `GenerationRequest.prefix_cache`, a `SupportsPrefixReuse` (engine/prefix_cache.py):
      lookup(lm, prompt_ids, min_capacity) -> PrefixHit | None
      store(lm, token_ids, cache, next_logits) -> None
  `lookup` returns a KVCache the loop may write to (a copy), holding prompt_ids[:n_tokens], with
  capacity >= min_capacity; with n_tokens == len(prompt_ids) it must also give next_logits (the
  logits after the last prompt token), which makes an exact repeat need no forward pass at all.
  `store` is called after prefill (token_ids == the prompt, next_logits its final logits) and at
  the end of a request that did not fail (token_ids == every token in the cache), always with
  `cache.n_tokens == len(token_ids)`; the loop keeps writing to `cache` afterwards, so store
  must copy what it keeps. Usage.cached_tokens is None when no prefix cache was given.
- JSON constraint: built by `engine.constrained.make_json_constraint(tokenizer, mode, schema)`.
  It is a logits processor run after the penalties, `accept(token_id)` is called for every
  chosen token, and its `is_complete` property ends the request with "grammar_complete".
- Speculative decoding: a drafter, `draft(tokens, max_tokens) -> list[int]` (cheap guesses of
  the next tokens, e.g. prompt lookup). `GenerationRequest.speculative` is None (engine default:
  `engine.speculative.default_drafter(lm, config)`), False (off), True
  (`engine.speculative.default_drafter(lm, config, required=True)`), or a drafter object.
  The loop verifies a draft with one `model.forward([last] + draft, cache, all_logits=True)`
  and picks tokens position by position with the very same processors + constraint + sampler
  as plain decoding, keeping the draft while it agrees and rolling the cache back with
  `cache.truncate` at the first disagreement. Because every token is still chosen from its own
  position's distribution by the same sampler and RNG stream, the output is identical to plain
  decoding for greedy and for seeded sampling; a draft only saves forward passes.

Log-probabilities in TokenSampled are natural-log softmax of the logits after penalties and the
JSON mask, before temperature and truncation: the model's own belief about each alternative.
TokenSampled.text is `tokenizer.piece(id)` (special tokens by name, a partial UTF-8 byte as <0xXX>).

Counting and matching conventions:
- Stop strings are matched on the generated text before it is split into reasoning and answer,
  so a stop string inside a <think> block ends the request too (as in llama.cpp).
- Finished.token_ids are the generated ids without a final end-of-generation id; the tokens that
  spelled a matched stop string are included (they were generated), their text is not.
- A repetition stop (engine/repetition.py) keeps every token of the loop, text included: it was
  generated and shown; the finish reason says why the reply ended there.
- Usage.completion_tokens counts every sampled token, the end-of-generation one included (it
  cost a decode step); context_used = prompt_tokens + completion_tokens.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from engine.cancel import CancelToken, ForwardCancelled
from engine.errors import (
    ConfigValidationError,
    ContextOverflowError,
    EngineError,
    MemoryBudgetError,
    TemplateCancelled,
)
from engine.events import (
    FINISH_CANCELLED,
    FINISH_ERROR,
    FINISH_GRAMMAR_COMPLETE,
    FINISH_LENGTH,
    FINISH_REPETITION,
    FINISH_STOP,
    FINISH_STOP_SEQUENCE,
    FINISH_TOOL_CALLS,
    Finished,
    PrefillProgress,
    ReasoningDelta,
    TextDelta,
    TokenSampled,
    TopAlternative,
    Usage,
)
from engine.generation_config import GenerationConfig
from engine.harmony import HarmonySplitter, is_harmony_vocabulary, prompt_channel
from engine.model_protocol import LanguageModel
from engine.prefill_progress import PREFILL_CHUNK, PrefillEstimate, ratio_for_config
from engine.presets import ResolvedPreset, resolve_preset
from engine.prompt_ids import chat_prompt_ids
from engine.reasoning import REASONING, ReasoningSplitter, prompt_opens_reasoning
from engine.repetition import RepetitionDetector
from engine.sampling import (
    apply_processors,
    log_normalizer,
    make_logits_processors,
    make_sampler,
    top_ids,
)
from engine.speculative import default_drafter
from engine.stopping import StopStringMatcher, decide_finish_reason
from engine.tool_calls.spec import ToolPlan, check_no_control_text, plan_tools
from engine.types import GenerationRequest, JsonMode, PrefixHit, ToolCallFormat

MAX_TOP_LOGPROBS = 20
MAX_DRAFT_TOKENS = 16


class Drafter(Protocol):
    def draft(self, tokens: Sequence[int], max_tokens: int) -> list[int]: ...


class ForwardModel(Protocol):
    """What the loop calls for forward passes: TransformerModel, or the batch scheduler's
    per-request stand-in (engine/batching/scheduler.py)."""

    def new_cache(self, n_ctx: int) -> Any: ...

    def forward(
        self, tokens, cache, *, all_logits: bool = False, logits_at=None, cancel=None
    ) -> np.ndarray: ...


# --- planning: everything that can refuse a request ----------------------------------------------
@dataclass
class _Plan:
    prompt_ids: list[int]
    preset: ResolvedPreset
    config: GenerationConfig
    seed: int | None
    max_new_tokens: int
    capacity: int
    eog_ids: frozenset[int]
    starts_in_reasoning: bool
    top_logprobs: int
    constraint: Any
    drafter: Any
    prefix_cache: Any
    tools: ToolPlan | None = None
    tool_format: ToolCallFormat = ToolCallFormat.GENERIC_JSON
    # gpt-oss's harmony vocabulary: its reply is split by channel (engine/harmony.py), starting
    # in the channel the prompt leaves open (None: the reply starts with a message header)
    harmony: bool = False
    harmony_channel: str | None = None


Plan = _Plan  # what plan_request returns: the batch scheduler admits by prompt_ids and capacity


def default_kv_budget_bytes() -> int:
    """Half the machine's physical memory: the KV cache must leave room for weights and the OS."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def kv_bytes_needed(lm: LanguageModel, n_ctx: int) -> int:
    from engine.kv_cache import KVCache, kv_cache_type

    return KVCache.bytes_needed(lm.config, n_ctx, kv_cache_type(lm.model))


def build_prompt_ids(
    lm: LanguageModel,
    request: GenerationRequest,
    cancel: CancelToken | None = None,
    tools: ToolPlan | None = None,
) -> tuple[list[int], str]:
    """-> (token ids, the prompt text). Exactly one of messages / prompt / prompt_ids. `cancel`
    reaches the template render, so Stop also ends a slow template (TemplateCancelled)."""
    given = [x is not None for x in (request.messages, request.prompt, request.prompt_ids)]
    if sum(given) != 1:
        raise ConfigValidationError(
            "prompt", "messages/prompt/prompt_ids", "exactly one of messages, prompt, prompt_ids"
        )
    if request.prompt_ids is not None:
        ids = [int(t) for t in request.prompt_ids]
        text = ""
    else:
        if request.prompt is not None:
            text = request.prompt
            ids = list(lm.tokenizer.encode(text, add_special=True))
        elif request.messages is not None:  # always, here: exactly one of the three is given
            from engine.tool_calls.formats import prepare_messages

            # message text is tokenized with control tokens not parsed (no role spoofing)
            offered = tools.offered if tools is not None else ()
            source = getattr(lm.chat_template, "source", "")
            messages, extra = prepare_messages(request.messages, offered, source)
            ids, text = chat_prompt_ids(
                lm.chat_template,
                lm.tokenizer,
                messages,
                cancel,
                {**extra, **template_kwargs(request)},
            )
        bos = getattr(lm.tokenizer, "bos_id", None)
        # a template that writes the BOS text itself plus the tokenizer adding one -> one BOS
        if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
    if not ids:
        raise ConfigValidationError("prompt", "", "at least one token after tokenization")
    return ids, text


def template_kwargs(request: GenerationRequest) -> dict:
    """Extra chat template variables the request sets (only those it sets: a template that
    tests `is defined` must see the others undefined)."""
    if request.enable_thinking is None:
        return {}
    return {"enable_thinking": bool(request.enable_thinking)}


def check_ceilings(
    lm: LanguageModel, n_prompt: int, max_new_tokens: int | None, budget_bytes: int
) -> tuple[int, int]:
    """-> (max_new_tokens, KV capacity). Refuses before anything is allocated."""
    limit = int(lm.n_ctx)
    if n_prompt >= limit:
        raise ContextOverflowError(
            f"The prompt takes {n_prompt} positions, leaving no room to generate in the context "
            f"window of {limit} positions"
        )
    if max_new_tokens is None:
        max_new_tokens = limit - n_prompt
    elif n_prompt + max_new_tokens > limit:
        raise ContextOverflowError(
            f"prompt ({n_prompt}) + max_new_tokens ({max_new_tokens}) = {n_prompt + max_new_tokens} "
            f"positions exceeds the context window of {limit} positions"
        )
    capacity = n_prompt + max_new_tokens
    needed = kv_bytes_needed(lm, capacity)
    if needed > budget_bytes:
        raise MemoryBudgetError(
            f"The KV cache for {capacity} positions needs {needed} bytes ({needed / 2**20:.1f} MiB), "
            f"more than the memory budget of {budget_bytes} bytes ({budget_bytes / 2**20:.1f} MiB)"
        )
    return max_new_tokens, capacity


def plan_request(
    lm: LanguageModel,
    request: GenerationRequest,
    preset: ResolvedPreset | None = None,
    cancel: CancelToken | None = None,
) -> _Plan:
    if preset is None:
        preset = resolve_preset(
            lm,
            saved=request.saved_preset,
            overrides=request.overrides,
            chat=request.messages is not None,
        )
    config = preset.config
    if (
        not isinstance(request.top_logprobs, int)
        or not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS
    ):
        raise ConfigValidationError(
            "top_logprobs", request.top_logprobs, f"an integer in [0, {MAX_TOP_LOGPROBS}]"
        )
    if request.json_mode not in tuple(JsonMode):
        raise ConfigValidationError("json_mode", request.json_mode, f"one of {', '.join(JsonMode)}")
    budget = (
        default_kv_budget_bytes()
        if request.kv_budget_bytes is None
        else int(request.kv_budget_bytes)
    )
    tools = plan_tools(request.tools, request.tool_choice)
    tool_format = ToolCallFormat.GENERIC_JSON
    if tools is not None:
        from engine.tool_calls.formats import detect_format

        if request.messages is None:
            raise ConfigValidationError("tools", "with a raw prompt", "used with chat messages")
        if (
            tools.constrained or request.constrain_tool_calls
        ) and request.json_mode != JsonMode.OFF:
            raise ConfigValidationError(
                "tool_choice", request.tool_choice, f'"auto" when json_mode is {request.json_mode}'
            )
        tool_format = detect_format(getattr(lm.chat_template, "source", ""))
        check_no_control_text(lm.tokenizer, tools)
    prompt_ids, prompt_text = build_prompt_ids(lm, request, cancel, tools)
    harmony = is_harmony_vocabulary(lm.tokenizer)
    max_new, capacity = check_ceilings(lm, len(prompt_ids), config.max_new_tokens, budget)
    seed = None
    if config.do_sample:
        seed = config.seed if config.seed is not None else secrets.randbits(63)
    constraint: Any = None  # a JsonConstraint, or the lazy tool-call constraint
    if request.json_mode != JsonMode.OFF:
        from engine.constrained import make_json_constraint

        constraint = make_json_constraint(lm.tokenizer, request.json_mode, request.json_schema)
    elif tools is not None and tools.constrained:
        from engine.tool_calls.grammar import make_tool_call_constraint

        constraint = make_tool_call_constraint(lm.tokenizer, tool_format, tools.offered)
    elif tools is not None and request.constrain_tool_calls:
        from engine.tool_calls.grammar import LazyToolCallConstraint

        constraint = LazyToolCallConstraint(lm.tokenizer, tool_format, tools.offered)
    return _Plan(
        prompt_ids=prompt_ids,
        preset=preset,
        config=config,
        seed=seed,
        max_new_tokens=max_new,
        capacity=capacity,
        eog_ids=frozenset(lm.tokenizer.eog_ids) | preset.extra_eog_ids,
        starts_in_reasoning=prompt_opens_reasoning(prompt_text),
        top_logprobs=request.top_logprobs,
        constraint=constraint,
        drafter=_choose_drafter(lm, request, config),
        prefix_cache=request.prefix_cache,
        tools=tools,
        tool_format=tool_format,
        harmony=harmony,
        harmony_channel=prompt_channel(prompt_text) if harmony else None,
    )


def _choose_drafter(lm: LanguageModel, request: GenerationRequest, config: GenerationConfig):
    choice = request.speculative
    if choice is False:
        return None
    if choice is None or choice is True:
        return default_drafter(lm, config, required=choice is True)
    if not callable(getattr(choice, "draft", None)):
        raise ConfigValidationError(
            "speculative", choice, "None, True, False or an object with draft(tokens, max_tokens)"
        )
    return choice


def generate(
    lm: LanguageModel,
    request: GenerationRequest,
    cancel: CancelToken | None = None,
    *,
    preset: ResolvedPreset | None = None,
) -> Iterator[object]:
    """Validate and plan the request (raising typed errors), then return the event iterator.

    `preset`: the request's preset when the caller already resolved it (from the same
    saved_preset and overrides), so a send resolves it once; None resolves it here."""
    started = time.perf_counter()
    cancel = cancel or CancelToken()
    try:
        plan = plan_request(lm, request, preset, cancel)
    except TemplateCancelled:
        # Stop while the chat template rendered ends the request like any other cancel, with a
        # Finished event (nothing was tokenized or run), so every caller sees the same thing.
        return iter([cancelled_before_the_prompt(lm)])
    return _events(lm, plan, cancel, started, lm.model)


def cancelled_before_the_prompt(lm: LanguageModel) -> Finished:
    nothing = Usage.nothing_read(lm.n_ctx)
    return Finished(finish_reason=FINISH_CANCELLED, usage=nothing, text="")


# --- the running request -------------------------------------------------------------------------
@dataclass
class _Step:
    token_id: int
    logits: np.ndarray  # after penalties and the JSON mask
    log_z: float  # log-normalizer of `logits`: logprob(t) = logits[t] - log_z


@dataclass
class _Progress:
    """What the lower generators report upward (timings, cache state, why they stopped)."""

    prompt_started: float = 0.0
    prefill_done: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    cached_tokens: int | None = None
    cache: Any = None
    fed_tokens: list[int] = field(default_factory=list)  # tokens whose KV rows are in `cache`
    last_logits: np.ndarray | None = None  # logits after fed_tokens
    cancelled: bool = False
    grammar_complete: bool = False
    draft_proposed: int = 0
    draft_accepted: int = 0


def _prefill(
    lm: LanguageModel, plan: _Plan, cancel: CancelToken, progress: _Progress, model: ForwardModel
) -> Generator[PrefillProgress, None, np.ndarray | None]:
    """Fill the KV cache with the prompt; -> logits after it, or None when cancelled. Yields
    PrefillProgress when more than one chunk is to be read (see engine/events.py)."""
    prompt = plan.prompt_ids
    hit = None
    if plan.prefix_cache is not None:
        hit = plan.prefix_cache.lookup(lm, prompt, plan.capacity)
        if hit is not None and (hit.n_tokens == len(prompt) and hit.next_logits is None):
            hit.cache.truncate(len(prompt) - 1)  # a full hit without logits: recompute the last one
            hit = PrefixHit(hit.cache, len(prompt) - 1)
        progress.cached_tokens = hit.n_tokens if hit is not None else 0
    if hit is not None and hit.n_tokens > 0:
        cache, done, logits = hit.cache, hit.n_tokens, hit.next_logits
    else:
        cache, done, logits = model.new_cache(plan.capacity), 0, None
    progress.cache = cache
    progress.fed_tokens = list(prompt[:done])
    estimate, cached = None, done
    if len(prompt) - done > PREFILL_CHUNK:
        estimate = PrefillEstimate(done, len(prompt), ratio_for_config(lm.config))
        yield _progress_event(estimate, cached)
    while done < len(prompt):
        if cancel.cancelled:
            return None
        chunk = prompt[done : done + PREFILL_CHUNK]
        chunk_started = time.perf_counter()
        try:
            logits = model.forward(chunk, cache, cancel=cancel)
        except ForwardCancelled:
            return None  # the chunk was not committed: cache holds progress.fed_tokens
        if estimate is not None:
            estimate.record(done, done + len(chunk), time.perf_counter() - chunk_started)
        done += len(chunk)
        progress.fed_tokens.extend(chunk)
        if estimate is not None:
            yield _progress_event(estimate, cached)
    logits = np.asarray(logits, dtype=np.float32)
    progress.last_logits = logits
    if plan.prefix_cache is not None:
        plan.prefix_cache.store(lm, list(prompt), cache, logits.copy())
    return logits


def _progress_event(estimate: PrefillEstimate, cached: int) -> PrefillProgress:
    return PrefillProgress(
        done=estimate.done,
        total=estimate.total,
        cached=cached,
        elapsed_s=estimate.elapsed,
        tok_s=estimate.tokens_per_second(),
        eta_s=estimate.seconds_left(),
    )


def _decode_steps(
    lm: LanguageModel, plan: _Plan, cancel: CancelToken, progress: _Progress, model: ForwardModel
) -> Generator[_Step | PrefillProgress, None, None]:
    """Prefill, then choose tokens one by one until the caller stops asking, the budget is spent
    or the cancel token is set. Yields the prefill's PrefillProgress events, then each chosen
    token; the caller decides whether it ends the request. The cache always holds
    progress.fed_tokens, except transiently during a draft."""
    progress.prompt_started = time.perf_counter()
    logits = yield from _prefill(lm, plan, cancel, progress, model)
    progress.prefill_done = time.perf_counter()
    if logits is None:
        progress.cancelled = True
        return
    cfg = plan.config
    processors = make_logits_processors(cfg, n_prompt=len(plan.prompt_ids))
    if plan.constraint is not None:
        processors.append(plan.constraint)
    sample = make_sampler(cfg, seed=plan.seed)
    tokens = list(plan.prompt_ids)
    cache = progress.cache

    def choose(row: np.ndarray) -> _Step:
        # processors work in place: give them a copy, the model may hand out its own buffer
        processed = apply_processors(processors, tokens, row.copy()) if processors else row
        token = sample(processed)
        if plan.constraint is not None:
            plan.constraint.accept(token)
        return _Step(token, processed, log_normalizer(processed))

    pending = [logits]  # logits rows not yet used, in order
    draft: list[int] = []  # the drafted tokens those rows (after the first) were verified against
    generated = 0
    while generated < plan.max_new_tokens:
        if cancel.cancelled:
            progress.cancelled = True
            return
        row = pending.pop(0)
        step = choose(row)
        now = time.perf_counter()
        progress.first_token = progress.first_token or now
        progress.last_token = now
        generated += 1
        tokens.append(step.token_id)
        progress.last_logits = row
        expected = draft.pop(0) if draft else None
        if expected is not None and expected == step.token_id:
            progress.draft_accepted += 1
            progress.fed_tokens.append(step.token_id)  # its KV row is already in the cache
        elif expected is not None:
            # the draft diverged here: drop the rest of it and the rows it produced
            cache.truncate(len(progress.fed_tokens))
            draft, pending = [], []
        if plan.constraint is not None and plan.constraint.is_complete:
            progress.grammar_complete = True
        yield step
        if progress.grammar_complete or generated >= plan.max_new_tokens:
            return
        if pending:
            continue
        # the chosen token is not in the cache yet: feed it, with a draft when there is one
        remaining = plan.max_new_tokens - generated
        draft = _draft(
            plan.drafter, tokens, min(remaining - 1, MAX_DRAFT_TOKENS), plan.capacity - len(tokens)
        )
        progress.draft_proposed += len(draft)
        try:
            if draft:
                rows = model.forward([step.token_id, *draft], cache, all_logits=True, cancel=cancel)
                pending = list(np.asarray(rows, dtype=np.float32))
            else:
                row = model.forward([step.token_id], cache, cancel=cancel)
                pending = [np.asarray(row, dtype=np.float32)]
        except ForwardCancelled:  # e.g. while another request's prefill chunk held the model
            progress.cancelled = True
            return
        progress.fed_tokens.append(step.token_id)


def _draft(drafter, tokens: list[int], max_tokens: int, room: int) -> list[int]:
    if drafter is None or max_tokens <= 0:
        return []
    limit = min(max_tokens, room)
    if limit <= 0:
        return []
    return [int(t) for t in drafter.draft(tokens, limit)][:limit]


def planned_events(
    lm: LanguageModel,
    plan: Plan,
    cancel: CancelToken,
    started: float,
    *,
    model: ForwardModel | None = None,
) -> Iterator[object]:
    """The event stream of a planned request (what `generate` returns after planning).

    `started`: the perf_counter() time the request arrived (TTFT counts from it). `model`: where
    the forward passes go, `lm.model` by default; the batch scheduler (engine/batching) passes
    a stand-in that runs them batched with other requests' (a ForwardModel: new_cache and
    forward with TransformerModel's signature and results)."""
    return _events(lm, plan, cancel, started, lm.model if model is None else model)


def _events(
    lm: LanguageModel, plan: _Plan, cancel: CancelToken, started: float, model: ForwardModel
) -> Iterator[object]:
    tokenizer = lm.tokenizer
    detokenizer = new_detokenizer(tokenizer)
    stops = StopStringMatcher(plan.config.stop)
    splitter: ReasoningSplitter | HarmonySplitter = (
        HarmonySplitter(plan.harmony_channel)
        if plan.harmony
        else ReasoningSplitter(starts_inside=plan.starts_in_reasoning)
    )
    progress = _Progress()
    answer: list[str] = []
    reasoning: list[str] = []
    token_ids: list[int] = []
    n_sampled = 0
    reason = None
    error = None
    calls, markers = _tool_call_stream(lm, plan)
    loops = RepetitionDetector() if plan.config.stop_on_repetition else None

    def answer_events(part: str) -> Iterator[object]:
        if calls is None:
            answer.append(part)
            yield TextDelta(part)
            return
        for event in calls.push(part):
            if isinstance(event, TextDelta):
                answer.append(event.text)
            yield event

    def release(text: str) -> Iterator[object]:
        for kind, part in splitter.push(text):
            if kind == REASONING:
                reasoning.append(part)
                yield ReasoningDelta(part)
            else:
                yield from answer_events(part)

    steps = _decode_steps(lm, plan, cancel, progress, model)
    try:
        for step in steps:
            if isinstance(step, PrefillProgress):
                yield step
                continue
            n_sampled += 1
            if step.token_id in plan.eog_ids:
                reason = FINISH_STOP
                break
            token_ids.append(step.token_id)
            yield _token_event(tokenizer, step, len(token_ids) - 1, plan.top_logprobs)
            piece = detokenizer.add(step.token_id) + markers.get(step.token_id, "")
            text, matched = stops.push(piece)
            yield from release(text)
            if matched:
                reason = FINISH_STOP_SEQUENCE
                break
            if loops is not None and loops.push(step.token_id) is not None:
                # a JSON value completed by this very token ended on its own: that comes first
                reason = FINISH_GRAMMAR_COMPLETE if progress.grammar_complete else FINISH_REPETITION
                break
        else:
            reasons = set()
            if progress.grammar_complete:
                reasons.add(FINISH_GRAMMAR_COMPLETE)
            if progress.cancelled:
                reasons.add(FINISH_CANCELLED)
            reason = decide_finish_reason(reasons) or FINISH_LENGTH
        if reason != FINISH_STOP_SEQUENCE:
            # the end came from elsewhere: release what the detokenizer and the matcher held
            tail, matched = stops.push(detokenizer.flush())
            if matched:
                reason = (
                    decide_finish_reason({reason, FINISH_STOP_SEQUENCE}) or FINISH_STOP_SEQUENCE
                )
            else:
                tail += stops.flush()
            yield from release(tail)
        for kind, part in splitter.flush():
            if kind == REASONING:
                reasoning.append(part)
                yield ReasoningDelta(part)
            else:
                yield from answer_events(part)
        if calls is not None:
            for event in calls.flush():
                if isinstance(event, TextDelta):
                    answer.append(event.text)
                yield event
            if calls.ended_on_call and reason in (FINISH_STOP, FINISH_GRAMMAR_COMPLETE):
                reason = decide_finish_reason({reason, FINISH_TOOL_CALLS}) or reason
    except Exception as exc:  # after acceptance, every failure is reported as a Finished event
        reason = FINISH_ERROR
        error = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
    finally:
        steps.close()
    if error is None:
        _store_final_state(lm, plan, progress)
    yield Finished(
        finish_reason=reason,
        usage=_usage(lm, plan, progress, started, n_sampled),
        text="".join(answer),
        reasoning="".join(reasoning),
        token_ids=tuple(token_ids),
        error=error,
        preset={**plan.preset.to_dict(), "seed_used": plan.seed},
        prompt_ids=tuple(plan.prompt_ids),
        tool_calls=tuple(calls.calls) if calls is not None else (),
    )


def _tool_call_stream(lm: LanguageModel, plan: _Plan):
    """-> (the request's ToolCallStream or None, control-token texts the parser must see)."""
    if plan.tools is None:
        return None, {}
    from engine.tool_calls.stream import ToolCallStream, marker_token_texts

    stream = ToolCallStream(plan.tool_format, plan.tools.offered)
    return stream, marker_token_texts(lm.tokenizer, plan.tool_format)


def new_detokenizer(tokenizer):
    from engine.detokenizer import StreamingDetokenizer

    return StreamingDetokenizer(tokenizer)


def _token_event(tokenizer, step: _Step, index: int, top_n: int) -> TokenSampled:
    logprob = float(step.logits[step.token_id]) - step.log_z
    top: tuple[TopAlternative, ...] = ()
    if top_n:
        top = tuple(
            TopAlternative(int(i), tokenizer.piece(int(i)), float(step.logits[i]) - step.log_z)
            for i in top_ids(step.logits, top_n)
        )
    # piece(): the token as a person reads it in a token list (partial UTF-8 shown as <0xXX>)
    return TokenSampled(
        index=index,
        token_id=step.token_id,
        text=tokenizer.piece(step.token_id),
        logprob=logprob,
        top=top,
    )


def _store_final_state(lm: LanguageModel, plan: _Plan, progress: _Progress) -> None:
    """Hand the final consistent KV state to the prefix cache (never after an error)."""
    if plan.prefix_cache is None or progress.cache is None or progress.prefill_done is None:
        return
    if progress.last_logits is None:
        return
    cache = progress.cache
    fed = progress.fed_tokens
    if cache.n_tokens > len(fed):  # an unverified draft tail left behind by an early stop
        cache.truncate(len(fed))
    plan.prefix_cache.store(lm, list(fed), cache, None)


def _usage(
    lm: LanguageModel, plan: _Plan, progress: _Progress, started: float, n_sampled: int
) -> Usage:
    prefill_end = progress.prefill_done or time.perf_counter()
    prefill_ms = (prefill_end - (progress.prompt_started or started)) * 1000.0
    n_prompt = len(plan.prompt_ids)
    prefilled = n_prompt - (progress.cached_tokens or 0)
    if progress.first_token is not None and progress.last_token is not None:  # set together
        ttft_ms = (progress.first_token - started) * 1000.0
        decode_ms = (progress.last_token - progress.first_token) * 1000.0
    else:
        ttft_ms, decode_ms = 0.0, 0.0
    return Usage(
        prompt_tokens=n_prompt,
        completion_tokens=n_sampled,
        cached_tokens=progress.cached_tokens,
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        ttft_ms=ttft_ms,
        prompt_tok_s=prefilled / (prefill_ms / 1000.0) if prefill_ms > 0 and prefilled > 0 else 0.0,
        decode_tok_s=(n_sampled - 1) / (decode_ms / 1000.0)
        if decode_ms > 0 and n_sampled > 1
        else 0.0,
        context_used=min(n_prompt + n_sampled, int(lm.n_ctx)),
        context_limit=int(lm.n_ctx),
        draft_tokens_proposed=progress.draft_proposed,
        draft_tokens_accepted=progress.draft_accepted,
    )
