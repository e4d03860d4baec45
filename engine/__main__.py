"""Command line: `python -m engine info|tokenize|generate|score|bench|serve MODEL ...`.

MODEL is a GGUF path, or `default` (the embedded SmolLM2-135M-Instruct) or `gemma3` (Gemma 3
270M from its packages). Every subcommand has `--json` for machine-readable output. Exit codes are
in EXIT_CODES_HELP (printed by `--help`).

Sampling flags follow llama.cpp's convention for the temperature: `--temperature 0` means greedy
and any temperature > 0 turns sampling on, unless `--greedy` is given (`--sample` turns sampling on
explicitly). Flags not given leave the model's own preset in charge (see `info`, which prints
every value with its source).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import (
    ConfigValidationError,
    ConstraintError,
    ContextOverflowError,
    EngineError,
    InputFileError,
)
from engine.input_files import MAX_SCHEMA_BYTES, read_text_file, require_regular_file
from engine.model_protocol import LanguageModel
from engine.types import DEFAULT_KV_CACHE_TYPE, KV_CACHE_TYPES, JsonMode

MODEL_ALIASES = ("default", "gemma3")
SCORE_LOGITS_BUDGET = 2**26  # floats of logits per scoring forward (256 MiB)
SCORE_DEFAULT_TOP = 5

EXIT_OK, EXIT_ENGINE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES_HELP = """exit codes:
  0    success
  1    the model or the engine failed: an unusable model file (corrupt, unsupported), a model
       package that is not installed, or an error while generating
  2    the command line is wrong: an invalid value, an argument that is not valid UTF-8, an input
       file (model, --json-schema) that is missing, not a regular file, too large or invalid
  130  interrupted (Ctrl-C) before the command finished; during `generate`, Ctrl-C instead stops
       the generation and the command exits 0 with finish reason "cancelled"
"""

# Text arguments (attribute -> name in messages); they must be valid UTF-8, as the tokenizer
# cannot encode the lone surrogates Python uses to carry undecodable argv bytes.
TEXT_ARGUMENTS = {
    "prompt": "PROMPT",
    "text": "TEXT",
    "system": "--system",
    "stop": "--stop",
    "question": "QUESTION",
}


# --- model resolution ----------------------------------------------------------------------------
def resolve_model_path(name: str) -> Path:
    """A GGUF path (checked to be a regular file, so a FIFO cannot block the open), or an alias."""
    if name in MODEL_ALIASES and not Path(name).exists():
        from engine import model_files

        if name == "default":
            return model_files.default_model_path()
        return model_files.gemma3_270m_path()
    return require_regular_file(name, "model")


def require_utf8_arguments(args) -> None:
    """Refuse text arguments holding bytes that are not UTF-8, naming the argument."""
    for attr, label in TEXT_ARGUMENTS.items():
        values = getattr(args, attr, None)
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str):
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                byte = value.encode("utf-8", "surrogateescape")[exc.start : exc.start + 1]
                raise ConfigValidationError(
                    label,
                    value,
                    f"valid UTF-8 text (byte 0x{byte.hex()} at character {exc.start} is not)",
                ) from None


def _report_kernel_compile(stage: str, fraction: float) -> None:
    """Only a first launch (or a new CPU / engine version) compiles; say so on stderr, since it
    takes seconds, and keep stdout for the command's output."""
    if stage.startswith("kernels: compiling"):
        print(f"first launch: {stage} ({fraction:.0%})", file=sys.stderr, flush=True)


def _load(args):
    from engine.loader import load_model

    return load_model(
        resolve_model_path(args.model),
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        progress=_report_kernel_compile,
        cache_type=args.cache_type,
    )


# --- info ----------------------------------------------------------------------------------------
def model_info(path: Path) -> dict:
    """Everything `info` reports, without compiling kernels or touching the weights. A file the
    engine cannot run (architecture, tensor type, RoPE scaling, ...) is still described, with
    `supported` false and the refusal the loader would give in `unsupported_reason`."""
    from types import SimpleNamespace

    from engine.chat_template import ChatTemplate
    from engine.config import ModelConfig
    from engine.errors import EngineError, UnsupportedModelError
    from engine.gguf import open_gguf
    from engine.loader import DEFAULT_MAX_CONTEXT
    from engine.presets import resolve_preset
    from engine.tokenizer import Tokenizer

    reason: str | None = None
    try:
        gguf_file = open_gguf(path)
    except UnsupportedModelError as exc:
        reason = _without_path(exc, path)
        gguf_file = open_gguf(path, skip_unsupported_types=True)
    config = None
    if reason is None:
        try:
            config = ModelConfig.from_gguf(gguf_file)
        except UnsupportedModelError as exc:
            reason = _without_path(exc, path)
    tokenizer = template = preset = chat_preset = None
    try:
        tokenizer = Tokenizer.from_gguf(gguf_file)
        template = ChatTemplate.from_gguf(gguf_file, tokenizer)
        preset = resolve_preset(SimpleNamespace(path=path, gguf=gguf_file))
        # What `generate --chat` (and the app) uses: the chat defaults layer may apply there.
        chat_preset = resolve_preset(
            SimpleNamespace(path=path, gguf=gguf_file, chat_template=template), chat=True
        )
    except EngineError:
        if reason is None:  # a supported model with a broken vocabulary: the load would fail
            raise
    metadata = gguf_file.metadata
    quant_mix = {name: {"tensors": n, "bytes": b} for name, (n, b) in gguf_file.quant_mix().items()}
    return {
        "path": str(path),
        "name": metadata.get("general.name"),
        "supported": reason is None,
        "unsupported_reason": reason,
        "file_size": gguf_file.file_size,
        "gguf_version": gguf_file.version,
        "architecture": gguf_file.arch,
        "parameters": gguf_file.parameter_count(),
        "quant_mix": quant_mix,
        "unsupported_tensors": dict(gguf_file.unsupported_tensors),
        "file_type": metadata.get("general.file_type"),
        "context_length": config.context_length if config else None,
        "default_n_ctx": min(config.context_length, DEFAULT_MAX_CONTEXT) if config else None,
        "layers": config.n_layers if config else None,
        "d_model": config.d_model if config else None,
        "n_ff": config.n_ff if config else None,
        "heads": config.n_head if config else None,
        "kv_heads": config.n_kv_head if config else None,
        "head_dim": config.head_dim if config else None,
        "sliding_window": config.sliding_window if config else None,
        "kv_cache_mib": _kv_cache_mib(config) if config else None,
        "rope_scaling": config.rope_scaling if config else None,
        "experts": (
            f"{config.n_expert} ({config.n_expert_used} per token)"
            if config and config.n_expert
            else None
        ),
        "vocab_size": tokenizer.vocab_size if tokenizer else None,
        "tokenizer": None
        if tokenizer is None
        else {
            "model": tokenizer.model,
            "pre": tokenizer.pre,
            "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id,
            "eog_ids": sorted(tokenizer.eog_ids),
            "eog_pieces": [tokenizer.piece(i) for i in sorted(tokenizer.eog_ids)],
            "add_bos": tokenizer.add_bos,
            "add_eos": tokenizer.add_eos,
        },
        "chat_template": None
        if template is None
        else {"name": template.name, "is_fallback": template.is_fallback},
        "preset": preset.to_dict() if preset else None,
        "chat_preset": chat_preset.to_dict() if chat_preset else None,
    }


def _kv_cache_mib(config) -> dict[str, float]:
    """MiB the KV cache takes at the default window, per cache type the model can use."""
    from engine.errors import ConfigValidationError
    from engine.kv_cache import KVCache, check_cache_type
    from engine.loader import DEFAULT_MAX_CONTEXT

    n_ctx = min(config.context_length, DEFAULT_MAX_CONTEXT)
    sizes = {}
    for cache_type in KV_CACHE_TYPES:
        with contextlib.suppress(ConfigValidationError):
            check_cache_type(cache_type, config.head_dim)
            sizes[cache_type] = round(KVCache.bytes_needed(config, n_ctx, cache_type) / 2**20, 1)
    return sizes


def _without_path(exc: Exception, path: Path) -> str:
    """An error message without the file's path in front (info prints the path itself)."""
    text = str(exc)
    for prefix in (f"{path}: ", f"{Path(path).expanduser()}: "):
        text = text.removeprefix(prefix)
    return text


def run_prediction(info: dict, args):
    """Memory and speed on this machine (engine/run_prediction.py), for a runnable file."""
    from engine.run_prediction import predict_file, this_machine

    if not info["supported"]:
        return None
    return predict_file(
        info["path"],
        n_ctx=args.n_ctx,
        cache_type=args.cache_type,
        machine=this_machine(args.threads),
    )


def prediction_line(p) -> str:
    """e.g. "needs ~1.3 GB of 9.8 GB free (weights 1001 MB, KV 117 MB at 4096 f16, engine
    227 MB); prefill ~125 tok/s, decode ~18 tok/s on 2 threads (read bandwidth 35.0 GB/s)"."""
    fit = "" if p.fits is not False else " - DOES NOT FIT in free memory"
    borrowed = f"; no calibration for {', '.join(p.uncalibrated)}" if p.uncalibrated else ""
    return (
        f"{p.summary().split(' · ')[0]}{fit} (weights {p.weights_bytes / 1e6:.0f} MB, "
        f"KV {p.kv_bytes / 1e6:.0f} MB at {p.n_ctx} {p.cache_type}, engine "
        f"{p.overhead_bytes / 1e6:.0f} MB); prefill ~{p.prefill_tok_s:.0f} tok/s, decode "
        f"~{p.decode_tok_s:.1f} tok/s on {p.threads} threads, {p.kernel_path} kernels (read "
        f"bandwidth {p.bandwidth_bytes_per_s / 1e9:.1f} GB/s){borrowed}"
    )


def template_label(name: str, is_fallback: bool) -> str:
    """The template's name, marked "(fallback)" once (fallback names already carry the mark)."""
    return f"{name} (fallback)" if is_fallback and "fallback" not in name else name


def cmd_info(args) -> int:
    from engine.load_summary import planned_kernel_path

    info = model_info(resolve_model_path(args.model))
    info["kernels"] = planned_kernel_path(quant_mix=info["quant_mix"], head_dim=info["head_dim"])
    prediction = run_prediction(info, args)
    info["predicted"] = prediction.to_json() if prediction else None
    if args.json:
        print(json.dumps(info, indent=2, ensure_ascii=False))
        return 0
    hidden = {"quant_mix", "tokenizer", "chat_template", "preset", "chat_preset", "supported"}
    hidden |= {"unsupported_reason", "unsupported_tensors", "predicted"}
    supported = "yes" if info["supported"] else f"no ({info['unsupported_reason']})"
    print(f"{'supported':16} {supported}")
    for key, value in info.items():
        if key in hidden or value is None:
            continue
        print(f"{key:16} {value}")
    print(
        "quant mix       ",
        ", ".join(
            f"{k}: {v['tensors']} tensors, {v['bytes'] / 2**20:.1f} MiB"
            for k, v in info["quant_mix"].items()
        ),
    )
    if info["unsupported_tensors"]:
        names = list(info["unsupported_tensors"])
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        print(f"{'not runnable':16} {len(names)} tensors: {shown}")
    tok = info["tokenizer"]
    if tok is not None:
        print(
            f"tokenizer        {tok['model']} (pre {tok['pre']}), bos {tok['bos_id']}, "
            f"eos {tok['eos_id']}, "
            f"end-of-generation {list(zip(tok['eog_ids'], tok['eog_pieces'], strict=True))}"
        )
    template = info["chat_template"]
    if template is not None:
        print(f"chat template    {template_label(template['name'], template['is_fallback'])}")
    if prediction is not None:
        print(f"{'predicted':16} {prediction_line(prediction)}")
    for title, key in (("preset (raw prompt):", "preset"), ("preset (--chat):", "chat_preset")):
        preset = info[key]
        if preset is None:
            continue
        print(title)
        for name, value in preset["values"].items():
            print(f"  {name:20} {value!r:14} ({preset['sources'][name]})")
        for note in preset["notes"]:
            print(f"  note: {note}")
    return 0


# --- tokenize ------------------------------------------------------------------------------------
def cmd_tokenize(args) -> int:
    from engine.gguf import open_gguf
    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(open_gguf(resolve_model_path(args.model)))
    ids = tokenizer.encode(args.text, add_special=not args.no_special)
    pieces = [tokenizer.piece(i) for i in ids]
    if args.json:
        print(json.dumps({"ids": ids, "pieces": pieces}, ensure_ascii=False))
    else:
        for i, piece in zip(ids, pieces, strict=True):
            print(f"{i:>8}  {piece!r}")
    return 0


# --- generate ------------------------------------------------------------------------------------
def sampling_overrides(args) -> dict:
    """The flags the user gave, as GenerationConfig fields (flags not given are left out)."""
    mapping = {
        "temperature": "temperature",
        "top_k": "top_k",
        "top_p": "top_p",
        "min_p": "min_p",
        "repeat_penalty": "repetition_penalty",
        "repeat_last_n": "repeat_last_n",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
        "seed": "seed",
        "max_tokens": "max_new_tokens",
    }
    overrides = {
        field: getattr(args, flag)
        for flag, field in mapping.items()
        if getattr(args, flag) is not None
    }
    if args.stop:
        overrides["stop"] = list(args.stop)
    if args.temperature is not None:
        overrides["do_sample"] = args.temperature > 0
    if args.sample:
        overrides["do_sample"] = True
    if args.greedy:
        overrides["do_sample"] = False
    return overrides


def json_mode_arguments(args) -> tuple[str, str | None]:
    """--json-mode / --json-schema FILE -> (json_mode, schema text); a schema file implies "schema"."""
    mode = args.json_mode
    if args.json_schema is None:
        if mode == "schema":
            raise ConfigValidationError(
                "--json-mode", mode, "used together with --json-schema FILE"
            )
        return mode or "off", None
    if mode not in (None, "schema"):
        raise ConfigValidationError(
            "--json-mode", mode, "'schema' (or left out) when --json-schema is given"
        )
    return "schema", read_text_file(args.json_schema, "--json-schema", MAX_SCHEMA_BYTES)


def tools_arguments(args) -> tuple[list | None, Any]:
    """--tools FILE (a JSON list of OpenAI function tools) / --tool-choice -> (tools, tool_choice).
    The file goes through the same input-file checks as --json-schema."""
    if args.tools is None:
        if args.tool_choice is not None:
            raise ConfigValidationError("--tool-choice", args.tool_choice, "used with --tools FILE")
        return None, "auto"
    if not args.chat:
        raise ConfigValidationError("--tools", args.tools, "used together with --chat")
    text = read_text_file(args.tools, "--tools", MAX_SCHEMA_BYTES)
    try:
        tools = json.loads(text)
    except ValueError as exc:
        raise InputFileError("--tools", args.tools, f"not valid JSON ({exc})") from None
    if isinstance(tools, dict):
        tools = [tools]  # one function alone
    if not isinstance(tools, list):
        raise InputFileError("--tools", args.tools, "must hold a JSON list of function tools")
    choice = args.tool_choice or "auto"
    if choice not in ("auto", "none", "required"):
        choice = {"type": "function", "function": {"name": choice}}
    return tools, choice


def print_tool_event(event, as_json: bool) -> None:
    """A finished call on stdout (the call the CLI would make), a malformed one on stderr."""
    from engine.events import ToolCallFinished, ToolCallMalformed

    if as_json:
        return
    if isinstance(event, ToolCallFinished):
        arguments = json.dumps(event.arguments, ensure_ascii=False)
        sys.stdout.write(f"\n[tool call {event.id}] {event.name}({arguments})\n")
        sys.stdout.flush()
    elif isinstance(event, ToolCallMalformed):
        name = event.name or "(no name)"
        print(f"\n[malformed tool call, not executable] {name}: {event.problem}", file=sys.stderr)


def warn_if_base_model(lm: LanguageModel) -> None:
    """A model without a chat template is usually a base (pretrained-only) model: wrapped in a
    borrowed template it tends to answer with nonsense, so --chat says so."""
    template = lm.chat_template
    if getattr(template, "is_fallback", False):
        print(
            f"warning: this model has no chat template (usually a base model, not trained to chat); "
            f"--chat uses the {template.name} format and the reply may be gibberish. "
            "Leave out --chat to continue PROMPT as plain text.",
            file=sys.stderr,
        )


class ProgressLine:
    """The prompt-reading line of `generate` on stderr: rewritten in place with \r while the
    prompt is read, erased before the first output. Only on a terminal: a redirected stderr (a
    log, a pipe) gets nothing, not a stream of carriage returns."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._enabled = bool(getattr(stream, "isatty", lambda: False)())
        self._width = 0  # characters of the line now shown

    def show(self, progress) -> None:
        from engine.prefill_progress import describe_progress

        if not self._enabled:
            return
        text = describe_progress(progress)
        self._stream.write("\r" + text + " " * max(0, self._width - len(text)))
        self._stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        if self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0


def cmd_generate(args) -> int:
    from engine.cancel import CancelToken
    from engine.events import (
        Finished,
        PrefillProgress,
        ReasoningDelta,
        TextDelta,
        TokenSampled,
        ToolCallFinished,
        ToolCallMalformed,
    )
    from engine.generate import GenerationRequest, generate

    lm = _load(args)
    if args.chat:
        warn_if_base_model(lm)
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.prompt})
        request = GenerationRequest(messages=messages)
    else:
        if args.system:
            raise ConfigValidationError("--system", args.system, "used together with --chat")
        request = GenerationRequest(prompt=args.prompt)
    request.overrides = sampling_overrides(args)
    request.top_logprobs = args.top_logprobs
    request.json_mode, request.json_schema = json_mode_arguments(args)
    request.speculative = args.speculative  # None: engine default (on for greedy requests)
    request.tools, request.tool_choice = tools_arguments(args)
    cancel = CancelToken()
    done = None
    # Ctrl-C cancels the generation (finish reason "cancelled", usage still printed) instead of
    # killing the process mid-token
    try:
        events = generate(lm, request, cancel)
    except ConstraintError as exc:
        if request.json_schema is None:
            raise
        # the schema the user gave is not usable: that is the command line's fault (exit 2)
        raise InputFileError("--json-schema", args.json_schema, str(exc)) from None
    except ConfigValidationError as exc:
        if request.tools is None or not str(exc.field).startswith(("tools", "tool_choice")):
            raise
        raise InputFileError("--tools", args.tools, str(exc)) from None
    except ContextOverflowError as exc:  # the engine's field name -> the flag the user typed
        raise ContextOverflowError(str(exc).replace("max_new_tokens", "--max-tokens")) from None
    sampled = []
    malformed = []
    line = ProgressLine(sys.stderr)
    previous_handler = signal.signal(signal.SIGINT, lambda signum, frame: cancel.cancel())
    try:
        for event in events:
            if isinstance(event, PrefillProgress):
                line.show(event)
                continue
            line.clear()  # before any answer, reasoning or the final line
            if isinstance(event, TokenSampled):
                sampled.append(event)
            elif isinstance(event, TextDelta) and not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, ReasoningDelta) and not args.json:
                sys.stderr.write(event.text)
                sys.stderr.flush()
            elif isinstance(event, (ToolCallFinished, ToolCallMalformed)):
                if isinstance(event, ToolCallMalformed):
                    malformed.append(event)
                print_tool_event(event, args.json)
            elif isinstance(event, Finished):
                done = event
    finally:
        line.clear()
        signal.signal(signal.SIGINT, previous_handler)
    assert done is not None  # generate() ends every request it accepted with one Finished event
    if args.json:
        record = finished_record(done)
        if request.tools is not None:
            record["tool_calls"] = [call.to_openai() for call in done.tool_calls]
            record["malformed_tool_calls"] = [
                {"id": m.id, "name": m.name, "text": m.text, "problem": m.problem}
                for m in malformed
            ]
        if args.top_logprobs:
            record["tokens"] = [token_record(t) for t in sampled]
        print(json.dumps(record, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        if args.top_logprobs:
            print_token_alternatives(sampled)
        usage = done.usage
        print(
            f"[{done.finish_reason}] {usage.prompt_tokens} prompt tokens ({usage.prompt_tok_s:.1f} tok/s), "
            f"{usage.completion_tokens} generated ({usage.decode_tok_s:.1f} tok/s), "
            f"ttft {usage.ttft_ms:.0f} ms",
            file=sys.stderr,
        )
    if done.finish_reason == "error":
        print(f"error: {done.error}", file=sys.stderr)
        return 1
    return 0


def finished_record(done) -> dict:
    usage = asdict(done.usage)
    usage["acceptance_rate"] = done.usage.acceptance_rate
    return {
        "ids": list(done.token_ids),
        "text": done.text,
        "reasoning": done.reasoning,
        "finish_reason": done.finish_reason,
        "error": done.error,
        "usage": usage,
        "preset": done.preset,
    }


def token_record(event) -> dict:
    return {
        "index": event.index,
        "id": event.token_id,
        "text": event.text,
        "logprob": event.logprob,
        "top": [{"id": a.token_id, "text": a.text, "logprob": a.logprob} for a in event.top],
    }


def print_token_alternatives(sampled) -> None:
    """--top-logprobs in text mode: after the reply, each generated token and its alternatives."""
    print("\ntoken alternatives (natural-log probabilities):")
    for t in sampled:
        alternatives = "  ".join(f"{a.text!r} {a.logprob:.3f}" for a in t.top)
        print(f"{t.index:>5}  {t.text!r:16} {t.logprob:8.3f}   {alternatives}")


# --- score ---------------------------------------------------------------------------------------
def score_positions(lm: LanguageModel, ids: list[int], top: int) -> dict:
    """Teacher-forced scoring: for each position i > 0, the log-probability the model gave the
    text's own token ids[i] after ids[:i], and the top-K candidates it considered there
    (natural logs); the first token has no context, so no score. Also the total over the scored
    tokens, the perplexity exp(-total / n) and the top-K predictions after the whole text."""
    import math

    from engine.errors import ContextOverflowError
    from engine.sampling import log_normalizer, top_ids

    if not ids:
        raise ConfigValidationError("TEXT", "", "text that tokenizes to at least one token")
    if len(ids) > lm.n_ctx:
        raise ContextOverflowError(
            f"The text is {len(ids)} tokens, more than the context window of {lm.n_ctx}"
        )
    cache = lm.model.new_cache(len(ids))
    chunk = max(1, min(256, SCORE_LOGITS_BUDGET // max(1, int(lm.config.n_vocab))))
    positions: list[dict[str, Any]] = [
        {"token_id": int(i), "logprob": None, "top": []} for i in ids
    ]
    next_top: list[dict] = []
    for start in range(0, len(ids), chunk):
        rows = lm.model.forward(ids[start : start + chunk], cache, all_logits=True)
        for offset, row in enumerate(np.atleast_2d(rows)):
            log_z = log_normalizer(row)
            candidates = [
                {"id": int(i), "logprob": float(row[i]) - log_z} for i in top_ids(row, top)
            ]
            following = start + offset + 1  # the output at position j predicts token j + 1
            if following < len(ids):
                positions[following]["logprob"] = float(row[ids[following]]) - log_z
                positions[following]["top"] = candidates
            else:
                next_top = candidates
    scored = [p["logprob"] for p in positions[1:]]
    total = float(sum(scored))
    return {
        "positions": positions,
        "total_logprob": total,
        "scored_tokens": len(scored),
        "perplexity": math.exp(-total / len(scored)) if scored else None,
        "next_top": next_top,
    }


def cmd_score(args) -> int:
    if args.top < 1:
        raise ConfigValidationError("--top", args.top, "an integer >= 1")
    lm = _load(args)
    ids = lm.tokenizer.encode(args.text, add_special=True)
    result = score_positions(lm, ids, args.top)
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return 0
    piece = lm.tokenizer.piece
    print(f"{'id':>8}  {'token':16} {'logprob':>8}   top {args.top} candidates at this position")
    for pos in result["positions"]:
        own = "-" if pos["logprob"] is None else f"{pos['logprob']:.3f}"
        alternatives = "  ".join(f"{piece(a['id'])!r} {a['logprob']:.3f}" for a in pos["top"])
        print(f"{pos['token_id']:>8}  {piece(pos['token_id'])!r:16} {own:>8}   {alternatives}")
    if result["scored_tokens"]:
        print(
            f"total logprob {result['total_logprob']:.3f} over {result['scored_tokens']} tokens "
            f"(the first has no context), perplexity {result['perplexity']:.2f}"
        )
    else:
        print("one token only: nothing to score (the first token has no context)")
    return 0


# --- serve ---------------------------------------------------------------------------------------
SERVE_DEFAULT_PORT = 8080
SERVE_MAX_CONCURRENCY = 64
SERVE_MAX_QUEUE = 4096
DEFAULT_REQUEST_TIMEOUT_S = 10.0  # engine.server.app's defaults (not imported: it loads Starlette)
DEFAULT_MAX_CONNECTIONS = 100


def serve_options(args) -> dict:
    """Check the serve flags before the model is loaded (a refused --host fails at once)."""
    from engine.server.serve import check_bind, check_limits

    check_bind(args.host, args.api_key)
    check_limits(args.max_connections, args.request_timeout)
    if not 1 <= args.max_concurrency <= SERVE_MAX_CONCURRENCY:
        raise ConfigValidationError(
            "--max-concurrency", args.max_concurrency, f"an integer in [1, {SERVE_MAX_CONCURRENCY}]"
        )
    if not 0 <= args.max_queue <= SERVE_MAX_QUEUE:
        raise ConfigValidationError(
            "--max-queue", args.max_queue, f"an integer in [0, {SERVE_MAX_QUEUE}]"
        )
    if args.kv_budget_mb is not None and args.kv_budget_mb <= 0:
        raise ConfigValidationError("--kv-budget-mb", args.kv_budget_mb, "a number of MiB > 0")
    if not 0 <= args.port <= 65535:
        raise ConfigValidationError("--port", args.port, "an integer in [0, 65535] (0: any free)")
    kv_budget = None if args.kv_budget_mb is None else int(args.kv_budget_mb * 2**20)
    return {
        "max_concurrency": args.max_concurrency,
        "max_queue": args.max_queue,
        "kv_budget_bytes": kv_budget,
    }


def cmd_serve(args) -> int:
    from engine.batching.scheduler import BatchScheduler
    from engine.prefix_cache import PrefixCache
    from engine.server.app import LocalChatServer, ServerOptions
    from engine.server.serve import RunningServer

    scheduler_options = serve_options(args)
    lm = _load(args)
    if getattr(lm.chat_template, "is_fallback", False):
        print(
            "warning: this model has no chat template (usually a base model): "
            f"/v1/chat/completions wraps messages in the {lm.chat_template.name} format and "
            "replies may be gibberish; /v1/completions continues plain text",
            file=sys.stderr,
        )
    scheduler = BatchScheduler(lm, prefix_cache=PrefixCache(), **scheduler_options)
    options = ServerOptions(
        model_id=lm.path.stem,
        aliases=[args.model] if args.model != lm.path.stem else [],
        api_key=args.api_key,
        cors_origin=args.cors,
        allowed_hosts=args.allowed_host,
        allowed_origins=args.allowed_origin,
        request_timeout_s=args.request_timeout,
        max_connections=args.max_connections,
    )

    def ready(url: str) -> None:
        if args.json:
            print(json.dumps({"url": url, "model": options.model_id}), flush=True)
        else:
            print(
                f"LocalChat is serving {options.model_id} at {url} (OpenAI-compatible API; "
                "Ctrl-C stops)",
                flush=True,
            )

    try:
        server = LocalChatServer(lm, scheduler, options)
        try:
            running = RunningServer(server, args.host, args.port, on_ready=ready)
        except OSError as exc:
            print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return EXIT_ENGINE
        # uvicorn re-raises the Ctrl-C it shut down for: here that is a clean stop
        with contextlib.suppress(KeyboardInterrupt):
            running.run()
        print("stopped", file=sys.stderr)
        return EXIT_OK
    finally:
        scheduler.close()


# --- argument parsing ----------------------------------------------------------------------------
def add_cache_type_argument(p: argparse.ArgumentParser) -> None:
    """--cache-type, checked by load_model (an unknown type is a ConfigValidationError naming it)."""
    p.add_argument(
        "--cache-type",
        default=DEFAULT_KV_CACHE_TYPE.value,
        metavar="{" + ",".join(KV_CACHE_TYPES) + "}",
        help=f"how the KV cache stores keys/values (default {DEFAULT_KV_CACHE_TYPE.value}); "
        "q8_0 takes 0.53x the memory",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine",
        description="LocalChat inference engine",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def model_command(name, help_text, loads_model=False):
        p = sub.add_parser(
            name,
            help=help_text,
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("model", help="GGUF path, or 'default' (SmolLM2-135M-Instruct) or 'gemma3'")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if loads_model:
            p.add_argument(
                "--n-ctx",
                type=int,
                default=None,
                help="context window (default: min(model's, 4096))",
            )
            p.add_argument(
                "--threads",
                type=int,
                default=None,
                help="worker threads for the kernels, 1 to 256 (default: physical cores)",
            )
            add_cache_type_argument(p)
        return p

    p = model_command(
        "info",
        "architecture, sizes, quant mix, tokenizer, template, preset with sources, and the "
        "memory and speed predicted on this machine",
    )
    p.add_argument("--n-ctx", type=int, default=None, help="context window to predict memory for")
    p.add_argument("--threads", type=int, default=None, help="threads to predict speed for")
    add_cache_type_argument(p)

    p = model_command("tokenize", "token ids and pieces of TEXT")
    p.add_argument("text")
    p.add_argument(
        "--no-special", action="store_true", help="add no BOS/EOS (special-token text still parses)"
    )

    p = model_command("generate", "stream a completion of PROMPT", loads_model=True)
    p.add_argument("prompt")
    p.add_argument(
        "--chat", action="store_true", help="wrap PROMPT as a user message in the chat template"
    )
    p.add_argument("--system", help="system prompt (with --chat)")
    p.add_argument(
        "--max-tokens", type=int, help="max_new_tokens (default: until the context is full)"
    )
    p.add_argument("--temperature", type=float, help="0 = greedy; > 0 samples unless --greedy")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sample", action="store_true", help="sample (do_sample=true)")
    mode.add_argument("--greedy", action="store_true", help="greedy argmax (do_sample=false)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repeat-penalty", type=float, help="repetition_penalty")
    p.add_argument("--repeat-last-n", type=int, help="window of the repetition penalty (-1 = all)")
    p.add_argument("--presence-penalty", type=float)
    p.add_argument("--frequency-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument(
        "--top-logprobs",
        type=int,
        default=0,
        help="show the N most likely alternatives of every generated token (after the text, "
        "or as 'tokens' in --json)",
    )
    p.add_argument(
        "--json-mode",
        choices=list(JsonMode),
        help="constrain the output to any JSON object, or to --json-schema",
    )
    p.add_argument(
        "--json-schema",
        metavar="FILE",
        help="JSON schema file the output must match (implies --json-mode schema)",
    )
    p.add_argument(
        "--tools",
        metavar="FILE",
        help="JSON list of OpenAI function tools the model may call (with --chat); the calls it "
        "makes are printed, not run",
    )
    p.add_argument(
        "--tool-choice",
        metavar="CHOICE",
        help="auto (default), none, required, or a tool's name (a forced call)",
    )
    spec = p.add_mutually_exclusive_group()
    spec.add_argument(
        "--speculative",
        dest="speculative",
        action="store_true",
        default=None,
        help="prompt-lookup speculative decoding (default: on for greedy requests)",
    )
    spec.add_argument(
        "--no-speculative",
        dest="speculative",
        action="store_false",
        help="plain decoding, one forward pass per token",
    )

    p = model_command(
        "score",
        "log-probability of each token of TEXT, the total and the perplexity, with the top-K "
        "candidates at each position",
        loads_model=True,
    )
    p.add_argument("text")
    p.add_argument(
        "--top",
        type=int,
        default=SCORE_DEFAULT_TOP,
        help=f"candidates per position (default {SCORE_DEFAULT_TOP})",
    )

    p = model_command("bench", "prefill/decode tok/s like llama-bench, memory, JIT start-up times")
    from engine.bench import add_arguments as add_bench_arguments

    add_bench_arguments(p)
    add_cache_type_argument(p)

    p = model_command(
        "serve",
        "serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, "
        "/v1/completions, /v1/models, /health)",
        loads_model=True,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=int,
        default=SERVE_DEFAULT_PORT,
        help=f"port (default {SERVE_DEFAULT_PORT}; 0 picks a free one)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help="require 'Authorization: Bearer KEY'; needed for a --host beyond this machine",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=4,
        help="requests decoded together (default 4); more wait in a bounded queue",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait for a slot (default 16); beyond that: 429",
    )
    p.add_argument(
        "--kv-budget-mb",
        type=float,
        metavar="M",
        help="KV cache memory for running requests, in MiB (default: the engine's budget)",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from ORIGIN (e.g. http://localhost:3000) call the API, with CORS "
        "headers; repeatable; '*' allows every page. Default: requests from web pages are refused",
    )
    p.add_argument("--cors", metavar="ORIGIN", help="the same as --allowed-origin ORIGIN")
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also accept requests whose Host header is NAME (e.g. a name for this computer on "
        "your network); repeatable; '*' accepts any. Default: the --host address, localhost, "
        "127.0.0.1, [::1] (and any IP address when --host is 0.0.0.0 or ::)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="a request's headers and body must arrive within this (default "
        f"{DEFAULT_REQUEST_TIMEOUT_S:g}); later: 408, connection closed",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"open connections at once (default {DEFAULT_MAX_CONNECTIONS}); more: 503, closed",
    )
    from engine.documents import cli as documents_cli

    documents_cli.add_index_arguments(
        sub.add_parser(
            "index",
            help="build or update a document collection (PDF, DOCX, HTML, Markdown, text, code)",
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    documents_cli.add_ask_arguments(
        model_command("ask", "answer a question from a collection, with citations", True)
    )
    from engine.embedding_cli import add_embed_arguments

    add_embed_arguments(
        sub.add_parser(
            "embed",
            help="embedding vectors of TEXTs from a GGUF embedding model (bert, nomic-bert)",
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    return parser


def cmd_bench(args) -> int:
    from engine.bench import cmd_bench as run_bench_command

    return run_bench_command(args, resolve_model_path(args.model))


def cmd_index(args) -> int:
    from engine.documents.cli import cmd_index as run_index

    return run_index(args)


def cmd_ask(args) -> int:
    from engine.documents.cli import cmd_ask as run_ask

    return run_ask(args, _load)


def cmd_embed(args) -> int:
    from engine.embedding_cli import cmd_embed as run_embed

    return run_embed(args)


COMMANDS = {
    "info": cmd_info,
    "tokenize": cmd_tokenize,
    "generate": cmd_generate,
    "score": cmd_score,
    "bench": cmd_bench,
    "serve": cmd_serve,
    "index": cmd_index,
    "ask": cmd_ask,
    "embed": cmd_embed,
}


def print_safely_on_any_terminal() -> None:
    """Paths may hold bytes that are not UTF-8 (carried as surrogates) and stdout may be strict
    (PYTHONIOENCODING=utf-8:strict, an ASCII locale): escape what cannot be encoded instead of
    crashing halfway through the output."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def show_warning_as_one_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (e.g. the JIT -> numpy fallback) as one line for a person, not a source path."""
    print(f"warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    print_safely_on_any_terminal()
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():  # restores the previous display when main() returns
            warnings.showwarning = show_warning_as_one_line
            require_utf8_arguments(args)
            return COMMANDS[args.command](args)
    except (ConfigValidationError, InputFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (EngineError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ENGINE
    except KeyboardInterrupt:  # Ctrl-C while compiling kernels, loading or benchmarking
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `python -m engine info MODEL | head`: the reader left early
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
