"""Receipts: everything needed to produce a reply again, token for token, and to say why a
replay did not.

A receipt is a plain JSON-ready dict (stored with the reply, exported with the chat):

    {"receipt_version": 1,
     "model":   {"file_name", "sha256", "size_bytes", "architecture"},
     "engine":  {"version", "kernels"},
     "chat_template": {"name", "sha256"},          # sha256 of the template source text
     "prompt":  {"messages", "token_ids", "n_tokens", "sha256", "template_options"},
     "preset":  {"values", "sources", "notes", "seed_used"},     # every field, with its source
     "json_mode", "json_schema",
     "output":  {"token_ids", "n_tokens", "finish_reason"},
     "usage":   {...engine.events.Usage...},
     "checks":  {"prompt": sha256, "preset": sha256, "output": sha256},
     "compaction": {...},          # only on a compacted history (with_compaction), checked too
     "sources": {...}}             # only when document passages were in the prompt (with_sources)

`checks` are digests of the sections as recorded, so a receipt edited afterwards (by hand, or
by a tool) is told apart from one whose run cannot be reproduced here.

Why the seed is always recorded: a sampling request whose preset names no seed gets a fresh
random one (engine.generate.plan_request) and the Finished event reports it as `seed_used`;
the receipt keeps it, so every sampled reply can be replayed. A replay passes every recorded
preset value as an override (not only the non-default ones): the defaults of a later engine
must not change what the replay runs with.

How far a replay runs: one token past an original that ended by itself (does the replay end
there too?), exactly as far as one that was cancelled or failed midway, never past the recorded
max_new_tokens nor the context window; a reply with no cap (max_new_tokens None, the default)
is bounded by its own length alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.cancel import CancelToken
from engine.errors import EngineError
from engine.events import FINISH_CANCELLED, Finished, TokenSampled
from engine.generation_config import BEFORE_FIELD_EXISTED
from engine.types import (
    Divergence,
    GenerationRequest,
    JsonMode,
    ReplayReport,
    TokenChoice,
)

RECEIPT_VERSION = 1
REPLAY_TOP_LOGPROBS = 20  # the replay's alternatives: where the original token ranks there
# Log-probabilities this close are the same distribution (float32 logits, printed to ~1e-7).
SAME_LOGPROB_TOLERANCE = 1e-5
_HASH_CHUNK = 8 * 2**20
_DIGEST_CACHE_NAME = "model-sha256.json"


class ReceiptError(EngineError):
    """A receipt that cannot be replayed (missing sections, wrong types); names what is wrong."""


# --- model file digests ---------------------------------------------------------------------
class ModelDigests:
    """sha256 of model files, computed once per file: kept in memory and in a small JSON file
    keyed by path, size and modification time (a changed file is hashed again). Hashing runs on
    a background thread started when a model loads, so the first reply does not wait for a
    multi-gigabyte read unless it finishes before the hash does."""

    def __init__(self, cache_file: Path | None = None):
        self.cache_file = cache_file
        self._lock = threading.Lock()
        self._known: dict[str, str] = {}
        self._running: dict[str, threading.Thread] = {}
        self._loaded = False

    @staticmethod
    def _key(path: Path) -> str:
        st = path.stat()
        return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"

    def _load(self) -> None:
        if self._loaded or self.cache_file is None:
            self._loaded = True
            return
        self._loaded = True
        try:
            data = json.loads(self.cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(data, dict):
            self._known.update({k: v for k, v in data.items() if isinstance(v, str)})

    def _save(self) -> None:
        if self.cache_file is None:
            return
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._known, indent=1), encoding="utf-8")
            os.replace(tmp, self.cache_file)
        except OSError:
            pass  # a cache that cannot be written costs a re-hash next time, nothing more

    def start(self, path: Path | str) -> None:
        """Begin hashing `path` in the background (no-op when known or already running)."""
        path = Path(path)
        key = self._key(path)
        with self._lock:
            self._load()
            if key in self._known or key in self._running:
                return
            thread = threading.Thread(
                target=self._hash_into_cache, args=(path, key), name="model-sha256", daemon=True
            )
            self._running[key] = thread
        thread.start()

    def digest(self, path: Path | str) -> str:
        """The file's sha256 (waits for a background hash of it; computes it if none ran)."""
        path = Path(path)
        key = self._key(path)
        with self._lock:
            self._load()
            if key in self._known:
                return self._known[key]
            thread = self._running.get(key)
        if thread is not None:
            thread.join()
        else:
            self._hash_into_cache(path, key)
        with self._lock:
            return self._known[key]

    def path_for(self, sha256: str) -> Path | None:
        """A file on this machine known to have contents `sha256` (hashed here before and not
        changed since: same size and modification time), or None."""
        with self._lock:
            self._load()
            keys = [k for k, v in self._known.items() if v == sha256]
        for key in keys:
            path = Path(key.rsplit("|", 2)[0])  # the key is "path|size|mtime_ns"
            try:
                if path.is_file() and self._key(path) == key:
                    return path
            except OSError:
                continue
        return None

    def _hash_into_cache(self, path: Path, key: str) -> None:
        value = file_sha256(path)
        with self._lock:
            self._known[key] = value
            self._running.pop(key, None)
            self._save()


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def default_digest_cache() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("LocalChat")) / _DIGEST_CACHE_NAME


# --- building -------------------------------------------------------------------------------
def engine_version() -> str:
    try:
        return metadata.version("localchat")
    except metadata.PackageNotFoundError:
        return "unknown"


def template_sha256(lm) -> str:
    return text_sha256(getattr(lm.chat_template, "source", "") or "")


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def ids_sha256(ids: Sequence[int]) -> str:
    return text_sha256(",".join(str(int(i)) for i in ids))


def canonical_sha256(value: Any) -> str:
    return text_sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))


def environment(lm, model_sha256: str | None) -> dict:
    """The receipt sections that describe the model and engine as loaded now (`model_sha256`
    None: the file could not be read to hash it)."""
    from engine.load_summary import kernel_path

    path = Path(str(lm.path)) if getattr(lm, "path", None) is not None else None
    try:
        size = path.stat().st_size if path is not None else None
    except OSError:
        size = None
    return {
        "model": {
            "file_name": path.name if path is not None else "",
            "sha256": model_sha256,
            "size_bytes": size,
            "architecture": str(getattr(getattr(lm, "gguf", None), "arch", "")),
        },
        "engine": {
            "version": engine_version(),
            "kernels": kernel_path(getattr(lm, "backend", None)),
        },
        "chat_template": {
            "name": getattr(lm.chat_template, "name", "") or "chat template",
            "sha256": template_sha256(lm),
        },
    }


def build_receipt(
    lm, request: GenerationRequest, finished: Finished, model_sha256: str | None
) -> dict:
    from engine.generate import template_kwargs

    """The receipt of the request that ended with `finished` (its prompt_ids are the tokens
    exactly as prefilled, after the chat template and any context trimming)."""
    preset = finished.preset or {}
    prompt = {
        "messages": [dict(m) for m in request.messages] if request.messages else None,
        "token_ids": [int(t) for t in finished.prompt_ids],
        "n_tokens": len(finished.prompt_ids),
        "sha256": ids_sha256(finished.prompt_ids),
        "template_options": template_kwargs(request),  # e.g. enable_thinking, as rendered
    }
    preset_section = {
        "values": dict(preset.get("values", {})),
        "sources": dict(preset.get("sources", {})),
        "notes": list(preset.get("notes", [])),
        "seed_used": preset.get("seed_used"),
    }
    output = {
        "token_ids": [int(t) for t in finished.token_ids],
        "n_tokens": len(finished.token_ids),
        "finish_reason": str(finished.finish_reason),
    }
    schema = request.json_schema
    if isinstance(schema, str):
        with contextlib.suppress(ValueError):  # text that is not JSON is kept as the text
            schema = json.loads(schema)
    receipt = {
        "receipt_version": RECEIPT_VERSION,
        **environment(lm, model_sha256),
        "prompt": prompt,
        "preset": preset_section,
        "json_mode": str(request.json_mode),
        "json_schema": schema if request.json_mode == JsonMode.SCHEMA else None,
        "output": output,
        "usage": asdict(finished.usage),
    }
    receipt["checks"] = section_checks(receipt)
    return receipt


def with_compaction(receipt: dict, section: dict) -> dict:
    """The receipt of a reply whose prompt was built on a compacted history (engine/compaction.py
    receipt_section: the summarised message ids, the summary's text and sha256), with a check
    of that section beside the others. The prompt's token ids already hold the summary as it
    was sent, so a replay from them is exact whatever the chat's summary says now."""
    out = {**receipt, "compaction": dict(section)}
    # the other sections' checks stay as recorded: adding this one must not re-bless them
    out["checks"] = {**(receipt.get("checks") or {}), "compaction": canonical_sha256(section)}
    return out


def with_sources(receipt: dict, section: dict) -> dict:
    """The receipt of a reply whose prompt carried document passages (engine/documents/record.py
    sources_record: the collection, the query, the retrieval settings, each passage's chunk id
    and text sha256 in prompt order, what was left out), with a check of that section. The
    prompt's token ids hold the passages as sent, so a replay from them is exact whatever the
    collection holds now; the app says whether those passages have changed since."""
    out = {**receipt, "sources": dict(section)}
    out["checks"] = {**(receipt.get("checks") or {}), "sources": canonical_sha256(section)}
    return out


def section_checks(receipt: dict) -> dict:
    checks = _core_checks(receipt)
    for optional in ("compaction", "sources"):  # sections only some receipts have
        if optional in receipt:
            checks[optional] = canonical_sha256(receipt[optional])
    return checks


def _core_checks(receipt: dict) -> dict:
    return {
        "prompt": canonical_sha256(receipt.get("prompt", {}).get("token_ids")),
        "preset": canonical_sha256(
            {
                "values": receipt.get("preset", {}).get("values"),
                "seed_used": receipt.get("preset", {}).get("seed_used"),
                "json_mode": receipt.get("json_mode"),
                "json_schema": receipt.get("json_schema"),
            }
        ),
        "output": canonical_sha256(receipt.get("output", {}).get("token_ids")),
    }


# --- replay ---------------------------------------------------------------------------------
def replay_request(
    receipt: dict, n_tokens: int | None = None, n_ctx: int | None = None
) -> GenerationRequest:
    """The request that runs the receipt again: its prompt ids as given, every preset value and
    the seed it used as overrides, the same JSON mode. `n_tokens` caps the replay (one past
    the original is enough to see whether it also ends there). `n_ctx`, the context window of the
    model replaying it, caps it too: an unbounded reply that ended at the context limit leaves
    no room for a token past it, and asking for one would be refused."""
    try:
        ids = [int(t) for t in receipt["prompt"]["token_ids"]]
        values = dict(receipt["preset"]["values"])
        seed = receipt["preset"].get("seed_used")
        seed = None if seed is None else int(seed)
        recorded = values.get("max_new_tokens")
        recorded = None if recorded is None else int(recorded)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReceiptError(f"the receipt has no usable prompt or preset ({exc})") from None
    values.pop("seed", None)
    if seed is not None:
        values["seed"] = seed
    # A receipt recorded before a field existed ran without it (a reply that looped for 1,000
    # tokens before the repetition stop must loop for 1,000 tokens in its replay too).
    for name, before in BEFORE_FIELD_EXISTED.items():
        values.setdefault(name, before)
    if n_tokens is not None:
        # None is an unbounded reply (the default preset has no max_new_tokens): the original's
        # length alone caps the replay then.
        cap = n_tokens if recorded is None else min(recorded, n_tokens)
        room = None if n_ctx is None else int(n_ctx) - len(ids)
        if room is not None and room >= 1:  # no room at all: generate names the overflow
            cap = min(cap, room)
        values["max_new_tokens"] = max(1, cap)
    return GenerationRequest(
        prompt_ids=ids,
        overrides=values,
        json_mode=receipt.get("json_mode") or JsonMode.OFF,
        json_schema=receipt.get("json_schema"),
        top_logprobs=REPLAY_TOP_LOGPROBS,
    )


def first_divergence(original: Sequence[int], replayed: Sequence[int]) -> int | None:
    """The first index where the two token streams differ (a stream that ended counts as
    differing from one that goes on); None when they are identical."""
    for i, (a, b) in enumerate(zip(original, replayed, strict=False)):
        if a != b:
            return i
    return None if len(original) == len(replayed) else min(len(original), len(replayed))


def receipt_differences(receipt: dict, now: dict, replay_preset: dict | None = None) -> list[str]:
    """What differs between the receipt and the conditions of the replay: another model file,
    template or engine; a receipt edited after it was recorded; preset values the engine
    resolved differently this time."""
    out: list[str] = []
    model, model_now = receipt.get("model", {}), now["model"]
    if model.get("sha256") != model_now["sha256"]:
        out.append(
            f"model file: {model.get('file_name')} (sha256 {str(model.get('sha256'))[:12]}…) in the "
            f"receipt, {model_now['file_name']} (sha256 {str(model_now['sha256'])[:12]}…) now"
        )
    elif model.get("file_name") != model_now["file_name"]:
        out.append(
            f"model file name: {model.get('file_name')} in the receipt, {model_now['file_name']} "
            "now (same contents)"
        )
    template, template_now = receipt.get("chat_template", {}), now["chat_template"]
    if template.get("sha256") != template_now["sha256"]:
        out.append(
            f"chat template: {template.get('name')} ({str(template.get('sha256'))[:12]}…) in the "
            f"receipt, {template_now['name']} ({template_now['sha256'][:12]}…) now"
        )
    engine, engine_now = receipt.get("engine", {}), now["engine"]
    for key, label in (("version", "engine version"), ("kernels", "kernels")):
        if engine.get(key) != engine_now[key]:
            out.append(f"{label}: {engine.get(key)} in the receipt, {engine_now[key]} now")
    recorded = receipt.get("checks") or {}
    for section, digest in section_checks(receipt).items():
        if section in recorded and recorded[section] != digest:
            out.append(f"the receipt's {section} was changed after it was recorded")
    if replay_preset is not None:
        values = receipt.get("preset", {}).get("values", {})
        resolved = replay_preset.get("values", {})
        for name in sorted(set(values) | set(resolved)):
            if name in ("seed", "max_new_tokens"):
                continue  # set from seed_used and capped to the original's length on purpose
            if values.get(name) != resolved.get(name):
                out.append(
                    f"preset {name}: {values.get(name)!r} in the receipt, "
                    f"{resolved.get(name)!r} in the replay"
                )
    return out


def model_file_note(receipt: dict, known_path: Path | None) -> str:
    """What to tell the user when the loaded model is not the receipt's file (another sha256):
    that the replay ran on that file where this machine has it, or that it is not here (a reply
    made elsewhere) and the loaded model answered instead."""
    model = receipt.get("model") or {}
    named = f"{model.get('file_name')} (sha256 {model.get('sha256')})"
    if known_path is not None:
        # RealEngine.replay loads that file for the replay: say which file answered
        return (
            f"replayed on {known_path}: the receipt's model file {named}, found on this machine "
            "by its sha256 (the loaded model is another file)"
        )
    return (
        f"the receipt's model file {named} is not on this machine (no file with that sha256 "
        "has been opened here); this replay ran on the loaded model instead"
    )


def replay(
    lm,
    receipt: dict,
    original_tokens: Sequence[dict],
    model_sha256: str | None,
    cancel: CancelToken | None = None,
    run: Callable[[GenerationRequest, CancelToken], Iterable[object]] | None = None,
) -> ReplayReport:
    """Run the receipt again on `lm` and compare with the original reply.

    `original_tokens` are the reply's stored token records (engine TokenSampled as dicts:
    index, token_id, text, logprob, top) for the probabilities at a divergence; the token ids
    compared are the receipt's own `output.token_ids`. Stops at the first divergence.
    `run(request, cancel)` gives the replay's events: engine.generate.generate on `lm` unless
    another path owns the model (a batch scheduler serving it runs every forward pass)."""
    if run is None:
        from engine.generate import generate

        def run(request: GenerationRequest, cancel: CancelToken) -> Iterable[object]:
            return generate(lm, request, cancel)

    cancel = cancel or CancelToken()
    try:
        original_ids = [int(t) for t in receipt["output"]["token_ids"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ReceiptError(f"the receipt has no recorded output tokens ({exc})") from None
    ended = receipt["output"].get("finish_reason") not in ("cancelled", "error")
    request = replay_request(
        receipt, len(original_ids) + (1 if ended else 0), getattr(lm, "n_ctx", None)
    )
    now = environment(lm, model_sha256)
    replayed: list[TokenSampled] = []
    finished: Finished | None = None
    divergence_at: int | None = None
    for event in run(request, cancel):
        if isinstance(event, TokenSampled):
            replayed.append(event)
            i = len(replayed) - 1
            # past a stopped original's end nothing is known (a reply stopped before its first
            # token still asks the replay for one); past an ended one the replay went on
            differs = replayed[i].token_id != original_ids[i] if i < len(original_ids) else ended
            if differs:
                divergence_at = i
                cancel.cancel()  # the rest of the replay says nothing more
        elif isinstance(event, Finished):
            finished = event
    if finished is None:  # every stream ends with one; without it nothing can be concluded
        raise ReceiptError("the replay failed: its stream ended without a Finished event")
    if finished.error:
        raise ReceiptError(f"the replay failed: {finished.error}")
    replay_ids = [t.token_id for t in replayed]
    # Stopped by the user (a divergence cancels too, and is a verdict) before the replay could
    # tell: short of the original's tokens, or all of them but not whether it ends there too.
    undecided = len(replay_ids) < len(original_ids) or (
        ended and finished.finish_reason == FINISH_CANCELLED
    )
    if divergence_at is None and cancel.cancelled and undecided:
        return ReplayReport(
            identical=False,
            original_tokens=len(original_ids),
            replayed_tokens=len(replay_ids),
            divergence=None,
            differences=tuple(receipt_differences(receipt, now)),
            replay_text=finished.text,
            stopped=True,
        )
    if divergence_at is None:
        if not ended:
            # the original was stopped early: a replay that matches it so far reproduces it
            replay_ids = replay_ids[: len(original_ids)]
        divergence_at = first_divergence(original_ids, replay_ids)
    differences = receipt_differences(receipt, now, finished.preset)
    n_ctx, n_prompt = getattr(lm, "n_ctx", None), len(request.prompt_ids or ())
    if n_ctx is not None and int(n_ctx) - n_prompt < len(original_ids):
        differences.append(
            f"context window: {int(n_ctx)} positions here leave room for "
            f"{int(n_ctx) - n_prompt} reply tokens after the {n_prompt}-token prompt; the "
            f"original reply has {len(original_ids)}"
        )
    divergence = None
    if divergence_at is not None:
        divergence = _describe(divergence_at, original_ids, original_tokens, replayed, lm)
    return ReplayReport(
        identical=divergence is None,
        original_tokens=len(original_ids),
        replayed_tokens=len(replay_ids),
        divergence=divergence,
        differences=tuple(differences),
        replay_text=finished.text,
    )


def _describe(
    index: int,
    original_ids: Sequence[int],
    original_tokens: Sequence[dict],
    replayed: Sequence[TokenSampled],
    lm,
) -> Divergence:
    record = next(
        (r for r in original_tokens if isinstance(r, dict) and r.get("index") == index), None
    )
    original: TokenChoice | None = None
    if index < len(original_ids):
        token_id = original_ids[index]
        original = TokenChoice(
            token_id,
            _piece(lm, token_id, record),
            record.get("logprob") if record and record.get("token_id") == token_id else None,
        )
    replay_choice: TokenChoice | None = None
    original_in_replay: float | None = None
    replayed_in_original: float | None = None
    if index < len(replayed):
        event = replayed[index]
        replay_choice = TokenChoice(event.token_id, event.text, event.logprob)
        if original is not None:
            original_in_replay = next(
                (a.logprob for a in event.top if a.token_id == original.token_id), None
            )
        if record is not None and record.get("token_id") == event.token_id:
            # the original's own token there (the receipt's ids were edited): its probability
            # is known even when a sampled token was not among the recorded alternatives
            replayed_in_original = record.get("logprob")
        elif record is not None:
            replayed_in_original = next(
                (
                    a.get("logprob")
                    for a in record.get("top", [])
                    if isinstance(a, dict) and a.get("token_id") == event.token_id
                ),
                None,
            )
    pairs = [
        (original.logprob if original else None, original_in_replay),
        (replayed_in_original, replay_choice.logprob if replay_choice else None),
    ]
    known = [(a, b) for a, b in pairs if a is not None and b is not None]
    same = None
    if len(known) == len(pairs):
        same = all(abs(a - b) <= SAME_LOGPROB_TOLERANCE for a, b in known)
    return Divergence(
        index=index,
        original=original,
        replayed=replay_choice,
        original_logprob_in_replay=original_in_replay,
        replayed_logprob_in_original=replayed_in_original,
        same_distribution=same,
    )


def _piece(lm, token_id: int, record: dict | None) -> str:
    if record is not None and record.get("token_id") == token_id:
        return str(record.get("text", ""))
    try:
        return lm.tokenizer.piece(token_id)
    except Exception:  # a piece for display only; the id is what is compared
        return f"<{token_id}>"
