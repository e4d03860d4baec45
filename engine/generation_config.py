"""The sampling and length settings of one generation request, and their validation.

`GenerationConfig` is what the sampler, the stop matcher and the loop read. It is built from a
plain dict of field -> value (the merged result of engine.presets) by `GenerationConfig.from_values`,
which validates every field and raises `ConfigValidationError(field, value, allowed)` naming the
offending value and the allowed range. Nothing is clamped or corrected silently.

Field meanings (defaults are transformers' GenerationConfig defaults where transformers has the
field, llama.cpp's otherwise):

- do_sample (False): sample from the distribution; False means greedy argmax (lowest id wins ties).
- temperature (1.0): logits are divided by it before top-k/top-p/min-p. Must be finite and >= 0;
  sampling with temperature 0 is an error (ask for do_sample=False instead).
- top_k (50): keep the k most likely tokens (0 disables; ties with the k-th logit are kept).
- top_p (1.0): keep the smallest most-likely set whose probability reaches top_p (1 disables).
- min_p (0.0): drop tokens less likely than min_p * p(most likely token) (0 disables).
- repetition_penalty (1.0): for every distinct token among the last repeat_last_n tokens (prompt
  included), a positive logit is divided by it and a negative one multiplied (CTRL / transformers /
  llama.cpp semantics). 1 disables.
- repeat_last_n (64, llama.cpp's default): the window for repetition_penalty; -1 = the whole
  context, 0 = disabled.
- frequency_penalty / presence_penalty (0.0): subtract count * frequency_penalty and
  presence_penalty (if count > 0) from each token's logit, counting generated tokens only.
- seed (None): the sampler's RNG seed; None draws a fresh one per request (the loop reports the
  seed it used so a run can be repeated).
- max_new_tokens (None): None means "until the context window is full"; an explicit value must
  fit the context together with the prompt or the request is refused.
- stop ([]): stop strings; generation ends before the first occurrence of any of them.
- stop_on_repetition (True, LocalChat's own): end the reply with finish reason "repetition" when
  it keeps writing the same span of tokens (engine/repetition.py: a block of at most 128 tokens
  repeated, covering at least 256 tokens and 4 copies). False lets a loop run to the length
  limit, for a reply that is meant to repeat itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from engine.errors import ConfigValidationError

# Far above any context window this engine can hold, far below anything that overflows fixed-width
# arithmetic in the kernels: an absurd max_new_tokens is rejected here instead of reaching a size
# computation.
MAX_NEW_TOKENS_LIMIT = 2**31 - 1
SEED_LIMIT = 2**64 - 1
MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 1000


# Fields added after receipts were first recorded, with the behaviour the engine had before each
# existed: a receipt without the field replays as it ran then (engine/receipt.py), not with
# today's default.
BEFORE_FIELD_EXISTED: dict[str, object] = {"stop_on_repetition": False}


@dataclass(frozen=True)
class GenerationConfig:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    max_new_tokens: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_on_repetition: bool = True

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def defaults(cls) -> dict:
        return cls().to_dict()

    @classmethod
    def from_values(cls, values: dict) -> GenerationConfig:
        """Validate and convert a field -> value dict; unknown fields are an error too."""
        known = set(cls.field_names())
        for name in values:
            if name not in known:
                raise ConfigValidationError(
                    name, values[name], f"a known field ({', '.join(sorted(known))})"
                )
        merged = {**cls.defaults(), **values}
        checked = {name: _VALIDATORS[name](name, merged[name]) for name in cls.field_names()}
        if checked["do_sample"] and checked["temperature"] == 0.0:
            raise ConfigValidationError(
                "temperature",
                merged["temperature"],
                "> 0 when do_sample is true (use do_sample=false for greedy)",
            )
        return cls(**checked)

    def to_dict(self) -> dict:
        """JSON-serializable values (stop as a list)."""
        out = asdict(self)
        out["stop"] = list(self.stop)
        return out


# --- per-field validators: return the normalized value or raise ----------------------------------
def _bool(name, value):
    if isinstance(value, bool):
        return value
    raise ConfigValidationError(name, value, "true or false")


def _integer(name, value, allowed):
    """Accept ints (not bools) and integral floats such as 40.0 from JSON files."""
    if isinstance(value, bool):
        raise ConfigValidationError(name, value, allowed)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    raise ConfigValidationError(name, value, allowed)


def _number(name, value, allowed):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigValidationError(name, value, allowed)
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise ConfigValidationError(name, value, allowed) from None
    if not math.isfinite(number):
        raise ConfigValidationError(name, value, allowed)
    return number


def _temperature(name, value):
    allowed = "a finite number >= 0"
    number = _number(name, value, allowed)
    if number < 0:
        raise ConfigValidationError(name, value, allowed)
    return number


def _top_k(name, value):
    allowed = "an integer >= 0 (0 disables top-k)"
    k = _integer(name, value, allowed)
    if k < 0:
        raise ConfigValidationError(name, value, allowed)
    return k


def _unit_interval(name, value):
    allowed = "a number in [0, 1]"
    number = _number(name, value, allowed)
    if not 0.0 <= number <= 1.0:
        raise ConfigValidationError(name, value, allowed)
    return number


def _repetition_penalty(name, value):
    allowed = "a finite number > 0 (1 disables)"
    number = _number(name, value, allowed)
    if number <= 0:
        raise ConfigValidationError(name, value, allowed)
    return number


def _repeat_last_n(name, value):
    allowed = "an integer >= -1 (-1 = whole context, 0 disables)"
    n = _integer(name, value, allowed)
    if n < -1:
        raise ConfigValidationError(name, value, allowed)
    return n


def _finite(name, value):
    return _number(name, value, "a finite number")


def _seed(name, value):
    allowed = f"null or an integer in [0, {SEED_LIMIT}]"
    if value is None:
        return None
    seed = _integer(name, value, allowed)
    if not 0 <= seed <= SEED_LIMIT:
        raise ConfigValidationError(name, value, allowed)
    return seed


def _max_new_tokens(name, value):
    allowed = f"null (until the context is full) or an integer in [1, {MAX_NEW_TOKENS_LIMIT}]"
    if value is None:
        return None
    n = _integer(name, value, allowed)
    if not 1 <= n <= MAX_NEW_TOKENS_LIMIT:
        raise ConfigValidationError(name, value, allowed)
    return n


def _stop(name, value):
    allowed = f"a list of at most {MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_STRING_CHARS} characters"
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or len(value) > MAX_STOP_STRINGS:
        raise ConfigValidationError(name, value, allowed)
    for s in value:
        if not isinstance(s, str) or not s or len(s) > MAX_STOP_STRING_CHARS:
            raise ConfigValidationError(name, value, allowed)
    return tuple(dict.fromkeys(value))  # drop duplicates, keep order


_VALIDATORS = {
    "do_sample": _bool,
    "temperature": _temperature,
    "top_k": _top_k,
    "top_p": _unit_interval,
    "min_p": _unit_interval,
    "repetition_penalty": _repetition_penalty,
    "repeat_last_n": _repeat_last_n,
    "frequency_penalty": _finite,
    "presence_penalty": _finite,
    "seed": _seed,
    "max_new_tokens": _max_new_tokens,
    "stop": _stop,
    "stop_on_repetition": _bool,
}
