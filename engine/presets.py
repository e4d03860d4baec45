"""Where each sampling value of a request comes from, and the merged, validated result.

Sources, highest priority first (the names are what `ResolvedPreset.sources` holds):

1. "override"                 the request's per-call values (CLI flags, the app's panel edits)
2. "saved preset"             the user's saved per-model preset
3. "generation_config.json"   the checkpoint's generation config, looked for beside the GGUF:
                              `<gguf stem>.json` (only when it looks like a generation config:
                              a JSON object with at least one generation key and no model-config
                              markers), then `generation_config.json` in the same folder
4. "gguf metadata"            llama.cpp's `general.sampling.*` keys in the GGUF
5. "LocalChat chat defaults"  for a chat request to a model with its own chat template, only
                              when neither the generation config nor the GGUF states any of
                              do_sample/temperature/top_k/top_p/min_p: CHAT_DEFAULTS below
6. "default"                  GenerationConfig's built-in defaults (transformers' defaults)

After merging, one rule links the layers (source "implied by your sampling values"): when you
(override or saved preset) set a sampling field and do_sample comes from a lower source, your
value decides do_sample the way llama.cpp and our CLI read a temperature: temperature 0 means
greedy, any other temperature/top_k/top_p/min_p means sampling. Setting do_sample yourself
always wins. `ResolvedPreset.reasons` says why, for the preset panel.

The absent-field rule, applied the same way to every field and every source: a field takes its
value from the highest-priority source that states it; a source that does not mention a field
says nothing about it (it does not reset it to a default); a field no source states takes the
built-in default. Each source is first translated into our fields by its own conventions:

- generation_config.json uses transformers' names and meanings taken literally: `do_sample`
  absent means the file does not decide it (and with no other source, the default False =
  greedy, exactly transformers' behaviour); `top_k` absent falls through to 50 like transformers.
  `stop_strings` maps to `stop`; `eos_token_id` (int or list) adds end-of-generation ids.
  A file that exists but cannot be read or parsed is an error (PresetFileError), not ignored.
  A `<stem>.json` that is not a generation config is skipped and noted in `notes`.
- GGUF `general.sampling.*` follows llama.cpp, where temperature <= 0 means greedy and any
  temperature > 0 means sampling: `temp` therefore states both `temperature` and `do_sample`
  (= temp > 0). `top_k`, `top_p`, `min_p`, `penalty_repeat` (-> repetition_penalty) and
  `penalty_last_n` (-> repeat_last_n) map one to one. Keys we do not implement (sequence,
  mirostat, xtc) are listed in `notes`.
- override and saved preset use our own field names (GenerationConfig) literally; a value of
  None (JSON null) there means "not set by this source", like an absent key.

The merged values are validated as a whole (GenerationConfig.from_values); a violation raises
ConfigValidationError naming the field, value, allowed range and the source of the bad value.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from engine.errors import ConfigValidationError, PresetFileError
from engine.generation_config import GenerationConfig
from engine.types import ResolvedPreset

SOURCE_OVERRIDE = "override"
SOURCE_SAVED = "saved preset"
SOURCE_GENERATION_CONFIG = "generation_config.json"
SOURCE_GGUF = "gguf metadata"
SOURCE_CHAT_DEFAULTS = "LocalChat chat defaults"
SOURCE_DEFAULT = "default"
SOURCE_IMPLIED = "implied by your sampling values"
SOURCES = (
    SOURCE_OVERRIDE,
    SOURCE_SAVED,
    SOURCE_GENERATION_CONFIG,
    SOURCE_GGUF,
    SOURCE_CHAT_DEFAULTS,
    SOURCE_DEFAULT,
    SOURCE_IMPLIED,
)
_USER_SOURCES = (SOURCE_OVERRIDE, SOURCE_SAVED)

# Used for chat when the checkpoint states no sampling values. transformers' defaults mean greedy
# decoding, which makes small chat models repeat themselves within a few sentences. Close to what
# local runners ship (llama.cpp: temperature 0.8, top_p 0.95, min_p 0.05; Ollama: 0.8, top_p 0.9)
# but a little cooler, because the models people try first here are small: 0.7 keeps answers
# focused and still varied; min_p 0.05 drops the tail of tokens under 5% of the best one's
# probability, which is what keeps a 135M model from wandering off, and top_p 0.9 bounds the
# rest. repetition_penalty stays 1.0 (off): a penalty distorts code and lists, and sampling
# already breaks the loops it is usually meant to stop. top_k stays at the default 50 (min_p and
# top_p are the tighter bounds in practice).
CHAT_DEFAULTS = {
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.9,
    "min_p": 0.05,
    "repetition_penalty": 1.0,
}
# The checkpoint fields that decide greedy vs sampling and how: stating any one of them means
# the checkpoint has an opinion, and the chat defaults stay out of the way.
_DECIDING_FIELDS = frozenset({"do_sample", "temperature", "top_k", "top_p", "min_p"})
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p")

# transformers generation_config.json name -> our field
_HF_FIELDS = {
    "do_sample": "do_sample",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_new_tokens",
    "stop_strings": "stop",
}
# keys that mark a JSON file as a generation config (as opposed to e.g. a model config.json)
_HF_GENERATION_MARKERS = set(_HF_FIELDS) | {
    "eos_token_id",
    "bos_token_id",
    "pad_token_id",
    "max_length",
    "num_beams",
    "transformers_version",
}
_MODEL_CONFIG_MARKERS = {"architectures", "model_type", "hidden_size", "vocab_size"}

# GGUF general.sampling.<key> -> our field (temp handled apart: it also decides do_sample)
_GGUF_FIELDS = {
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "penalty_repeat": "repetition_penalty",
    "penalty_last_n": "repeat_last_n",
}
_GGUF_PREFIX = "general.sampling."


def resolve_preset(
    lm_or_path, saved: dict | None = None, overrides: dict | None = None, *, chat: bool = False
) -> ResolvedPreset:
    """Merge the sources for a loaded model (anything with `.path` and `.gguf.metadata`), its
    ModelInfo (`.path` and `.sampling_metadata`) or a GGUF path, validate, and return values with
    provenance. `chat`: the values are for a chat request (messages rendered with the model's
    template), where the chat defaults layer may apply. Raises ConfigValidationError or
    PresetFileError."""
    path, metadata = _model_path_and_metadata(lm_or_path)
    notes: list[str] = []
    hf_values, extra_eog = _generation_config_values(path, notes)
    gguf_values = gguf_sampling_values(metadata, notes)
    layers = [
        (SOURCE_OVERRIDE, _checked_field_names(overrides or {}, SOURCE_OVERRIDE)),
        (SOURCE_SAVED, _checked_field_names(saved or {}, SOURCE_SAVED)),
        (SOURCE_GENERATION_CONFIG, hf_values),
        (SOURCE_GGUF, gguf_values),
    ]
    checkpoint_states = _DECIDING_FIELDS & (hf_values.keys() | gguf_values.keys())
    if chat and not checkpoint_states and has_own_chat_template(lm_or_path):
        layers.append((SOURCE_CHAT_DEFAULTS, CHAT_DEFAULTS))
    layers.append((SOURCE_DEFAULT, GenerationConfig.defaults()))
    values, sources = {}, {}
    for name in GenerationConfig.field_names():
        for source, layer in layers:
            if name in layer:
                values[name], sources[name] = layer[name], source
                break
    reasons = _imply_do_sample(values, sources)
    notes.extend(reasons.values())
    try:
        config = GenerationConfig.from_values(values)
    except ConfigValidationError as exc:
        source = sources.get(exc.field, SOURCE_OVERRIDE)
        raise ConfigValidationError(
            exc.field, exc.value, f"{exc.allowed} (value from {source})"
        ) from None
    return ResolvedPreset(
        config.to_dict(), sources, tuple(notes), frozenset(extra_eog), reasons=reasons
    )


def _imply_do_sample(values: dict, sources: dict) -> dict[str, str]:
    """The implication rule of the module docstring; returns {"do_sample": why} when it applied."""
    if sources["do_sample"] in _USER_SOURCES:
        return {}  # you chose do_sample yourself (now or in your saved preset)
    mine = [name for name in _SAMPLING_FIELDS if sources[name] in _USER_SOURCES]
    if not mine:
        return {}
    greedy = "temperature" in mine and values["temperature"] == 0
    wanted = not greedy
    if values["do_sample"] == wanted:
        return {}
    was = f"{values['do_sample']} from {sources['do_sample']}"
    if greedy:
        why = f"do_sample is False because you set temperature 0 (greedy) while it was {was}"
    else:
        named = ", ".join(f"{name}={values[name]!r} ({sources[name]})" for name in mine)
        why = f"do_sample is True because you set {named} while it was {was}"
    values["do_sample"], sources["do_sample"] = wanted, SOURCE_IMPLIED
    return {"do_sample": why + "; set do_sample yourself to choose"}


def has_own_chat_template(lm_or_path) -> bool:
    """Whether the model brings its own chat template (a loaded model, its ModelInfo or a GGUF
    path); a fallback template means a base model."""
    template = getattr(lm_or_path, "chat_template", None)
    if template is not None:
        return not getattr(template, "is_fallback", False)
    name = getattr(lm_or_path, "template", None)
    if isinstance(name, str):
        return bool(name) and "fallback" not in name
    if isinstance(lm_or_path, (str, Path)):
        from engine.gguf import open_gguf

        return bool(open_gguf(lm_or_path).metadata.get("tokenizer.chat_template"))
    return False


def _checked_field_names(layer: dict, source: str) -> dict:
    if not isinstance(layer, dict):
        raise ConfigValidationError(source, layer, "a mapping of field -> value")
    known = GenerationConfig.field_names()
    for name, value in layer.items():
        if name not in known:
            raise ConfigValidationError(
                name, value, f"a known field ({', '.join(known)}) in the {source}"
            )
    # None in a saved preset or override means "not set here" for every field, so lower sources
    # still apply (to get a fresh random seed, leave seed out everywhere: the default is None)
    return {name: value for name, value in layer.items() if value is not None}


def _model_path_and_metadata(lm_or_path) -> tuple[Path | None, dict]:
    if isinstance(lm_or_path, (str, Path)):
        from engine.gguf import open_gguf  # only needed when given a bare path

        gguf_file = open_gguf(lm_or_path)
        return Path(lm_or_path), dict(gguf_file.metadata)
    path = getattr(lm_or_path, "path", None)
    if hasattr(lm_or_path, "sampling_metadata"):
        metadata = dict(lm_or_path.sampling_metadata)
    else:
        metadata = dict(getattr(getattr(lm_or_path, "gguf", None), "metadata", None) or {})
    return (Path(path) if path is not None else None), metadata


def sampling_metadata(metadata: dict) -> dict:
    """The GGUF keys resolve_preset reads (general.sampling.*) as plain Python values: small and
    immutable enough to hand to another thread in engine.types.ModelInfo."""
    return {key: _plain(raw) for key, raw in metadata.items() if key.startswith(_GGUF_PREFIX)}


# --- GGUF general.sampling.* ---------------------------------------------------------------------
def gguf_sampling_values(metadata: dict, notes: list[str] | None = None) -> dict:
    """Translate llama.cpp's general.sampling.* keys into our fields (see module docstring)."""
    values: dict[str, Any] = {}
    for key, raw in metadata.items():
        if not key.startswith(_GGUF_PREFIX):
            continue
        name = key[len(_GGUF_PREFIX) :]
        value = _plain(raw)
        if name == "temp":
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value <= 0
            ):
                values["do_sample"], values["temperature"] = False, 0.0
            else:
                values["do_sample"], values["temperature"] = True, value
        elif name in _GGUF_FIELDS:
            values[_GGUF_FIELDS[name]] = value
        elif notes is not None:
            notes.append(f"GGUF key {key} is not used by this engine")
    return values


def _plain(value):
    """numpy scalars from the GGUF reader -> Python numbers."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, str)):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


# --- generation_config.json ----------------------------------------------------------------------
def generation_config_paths(gguf_path: Path) -> list[tuple[Path, bool]]:
    """Candidate files, most specific first, with whether they must be a generation config."""
    return [
        (gguf_path.with_suffix(".json"), False),
        (gguf_path.parent / "generation_config.json", True),
    ]


def _generation_config_values(gguf_path: Path | None, notes: list[str]) -> tuple[dict, set[int]]:
    if gguf_path is None:
        return {}, set()
    for candidate, is_named_generation_config in generation_config_paths(gguf_path):
        if not candidate.is_file():
            continue
        data = _read_json(candidate, strict=is_named_generation_config, notes=notes)
        if data is None:
            continue
        if not is_named_generation_config and not _looks_like_generation_config(data):
            notes.append(f"{candidate.name} beside the model is not a generation config; skipped")
            continue
        return _translate_hf(data, candidate)
    return {}, set()


def _read_json(path: Path, *, strict: bool, notes: list[str]):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if strict:
            raise PresetFileError(f"{path} cannot be read as JSON: {exc}") from exc
        notes.append(f"{path.name} beside the model is not readable JSON; skipped ({exc})")
        return None
    if not isinstance(data, dict):
        if strict:
            raise PresetFileError(f"{path} must hold a JSON object, found {type(data).__name__}")
        notes.append(f"{path.name} beside the model is not a JSON object; skipped")
        return None
    return data


def _looks_like_generation_config(data: dict) -> bool:
    return bool(_HF_GENERATION_MARKERS & data.keys()) and not (_MODEL_CONFIG_MARKERS & data.keys())


def _translate_hf(data: dict, path: Path) -> tuple[dict, set[int]]:
    values = {}
    for hf_name, ours in _HF_FIELDS.items():
        if data.get(hf_name) is not None:  # transformers writes null for "not set"
            values[ours] = data[hf_name]
    eos = data.get("eos_token_id")
    if eos is None:
        extra = set()
    elif isinstance(eos, int) and not isinstance(eos, bool) and eos >= 0:
        extra = {eos}
    elif isinstance(eos, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in eos
    ):
        extra = set(eos)
    else:
        raise PresetFileError(
            f"{path}: eos_token_id={eos!r} must be a token id or a list of token ids"
        )
    return values, extra
