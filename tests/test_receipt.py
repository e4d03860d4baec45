"""engine/receipt.py without a model: model-file digests computed once and cached, the digests a
receipt carries (checked against hashlib over hand-written canonical text, never against the
module's own functions), what a receipt records, the request a replay runs, locating the first
divergence of two token streams, what differs in a receipt, and how a divergence is described.

The replay itself, end to end on a scripted model, is in test_receipt_replay.py."""

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine import receipt as receipt_mod
from engine.events import Finished, TokenSampled, TopAlternative, Usage
from engine.receipt import (
    ModelDigests,
    ReceiptError,
    _describe,
    build_receipt,
    environment,
    first_divergence,
    model_file_note,
    receipt_differences,
    replay_request,
    section_checks,
)
from engine.types import GenerationRequest, JsonMode


def sha(text: str) -> str:
    """The independent computation every expected digest here comes from."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- model file digests -----------------------------------------------------------------------
def test_a_model_file_is_hashed_once_and_again_only_when_it_changes(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    calls = []
    real = receipt_mod.file_sha256
    monkeypatch.setattr(receipt_mod, "file_sha256", lambda p: calls.append(p) or real(p))
    cache = tmp_path / "cache" / "digests.json"
    digests = ModelDigests(cache)
    digests.start(model)
    assert digests.digest(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert digests.digest(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert ModelDigests(cache).digest(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert len(calls) == 1  # the second instance read the cache file
    model.write_bytes(b"GGUF changed")
    os.utime(model, ns=(1, 1))
    assert ModelDigests(cache).digest(model) == hashlib.sha256(b"GGUF changed").hexdigest()
    assert len(calls) == 2


def test_a_file_larger_than_one_read_is_hashed_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(receipt_mod, "_HASH_CHUNK", 7)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"0123456789" * 5 + b"tail")
    assert receipt_mod.file_sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert receipt_mod.file_sha256(str(model)) == hashlib.sha256(model.read_bytes()).hexdigest()


def test_a_model_file_is_read_in_bounded_chunks_never_whole(tmp_path, monkeypatch):
    # model files are gigabytes: hashing one must not hold it in memory
    monkeypatch.setattr(receipt_mod, "_HASH_CHUNK", 16)
    model = tmp_path / "m.gguf"
    model.write_bytes(bytes(range(100)))
    sizes = []

    class Recording:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, size=-1):
            sizes.append(size)
            return self.f.read(size)

    def recording_open(path, mode):
        return Recording(open(path, mode))  # closed by Recording.__exit__

    monkeypatch.setattr(receipt_mod, "open", recording_open, raising=False)
    assert receipt_mod.file_sha256(model) == hashlib.sha256(bytes(range(100))).hexdigest()
    assert sizes == [16] * 8  # 6 full reads, the 4-byte tail, the empty read that ends it


def test_the_digest_cache_file_holds_path_size_mtime_keys(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF one")
    os.utime(model, ns=(5, 123_456_789))
    cache = tmp_path / "deep" / "er" / "digests.json"
    ModelDigests(cache).digest(model)
    saved = json.loads(cache.read_text(encoding="utf-8"))
    assert saved == {f"{model.resolve()}|8|123456789": hashlib.sha256(b"GGUF one").hexdigest()}
    assert not cache.with_suffix(".tmp").exists()  # written whole, then moved into place


def test_the_digest_is_taken_from_the_cache_file_without_reading_the_model(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    key = f"{model.resolve()}|4|{model.stat().st_mtime_ns}"
    cache = tmp_path / "digests.json"
    cache.write_text(json.dumps({key: "recorded", "other|1|1": 7}), encoding="utf-8")
    monkeypatch.setattr(receipt_mod, "file_sha256", lambda p: pytest.fail("the model was read"))
    digests = ModelDigests(cache)
    digests.start(model)  # known: no thread, no read
    assert digests.digest(model) == "recorded"
    assert digests.path_for("recorded") == model.resolve()
    assert digests.path_for(7) is None  # a value that is not a digest was not loaded


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '"text"'])
def test_a_damaged_digest_cache_costs_a_rehash_only(tmp_path, content):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    cache = tmp_path / "digests.json"
    cache.write_text(content, encoding="utf-8")
    digests = ModelDigests(cache)
    assert digests.digest(model) == hashlib.sha256(b"GGUF").hexdigest()
    assert json.loads(cache.read_text(encoding="utf-8")) == {
        f"{model.resolve()}|4|{model.stat().st_mtime_ns}": hashlib.sha256(b"GGUF").hexdigest()
    }


def test_a_cache_that_cannot_be_written_or_read_still_gives_the_digest(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    digests = ModelDigests(blocker / "digests.json")  # its parent is a file: unreadable, unwritable
    assert digests.digest(model) == hashlib.sha256(b"GGUF").hexdigest()
    assert ModelDigests(None).digest(model) == hashlib.sha256(b"GGUF").hexdigest()


def test_a_hash_in_the_background_is_waited_for_not_repeated(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF big")
    release, calls = threading.Event(), []
    real = receipt_mod.file_sha256

    def slow(path):
        thread = threading.current_thread()
        calls.append((thread.name, thread.daemon))  # a daemon: never keeps the app from exiting
        release.wait(30)
        return real(path)

    monkeypatch.setattr(receipt_mod, "file_sha256", slow)
    digests = ModelDigests(None)
    digests.start(model)
    digests.start(model)  # already running: not a second thread

    class Running(dict):
        """digest() looks the running hash up here: let it finish only then."""

        def get(self, key, default=None):
            looked_up.append(key)
            release.set()
            return super().get(key, default)

    looked_up = []
    digests._running = Running(digests._running)
    assert digests.digest(model) == hashlib.sha256(b"GGUF big").hexdigest()
    assert calls == [("model-sha256", True)]  # waited for, not hashed a second time
    assert looked_up == [f"{model.resolve()}|8|{model.stat().st_mtime_ns}"]
    digests.start(model)  # known now
    assert digests.digest(model) == hashlib.sha256(b"GGUF big").hexdigest()
    assert len(calls) == 1


def test_the_cache_file_is_read_once_per_instance(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    cache = tmp_path / "digests.json"
    digests = ModelDigests(cache)
    digests.digest(model)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"other")
    key = f"{other.resolve()}|5|{other.stat().st_mtime_ns}"
    cache.write_text(json.dumps({key: "written-by-another-process"}), encoding="utf-8")
    for _ in range(3):  # not read again, however often asked
        assert digests.path_for("written-by-another-process") is None
    assert ModelDigests(cache).path_for("written-by-another-process") == other.resolve()


def test_a_path_with_the_key_separator_in_it_is_found(tmp_path):
    model = tmp_path / "odd|name|here.gguf"
    model.write_bytes(b"GGUF")
    digests = ModelDigests(tmp_path / "digests.json")
    digest = digests.digest(model)
    assert digests.path_for(digest) == model.resolve()


def test_an_unusable_path_in_the_cache_does_not_hide_a_good_one(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    digest = hashlib.sha256(b"GGUF").hexdigest()
    too_long = f"{tmp_path / ('x' * 300)}|4|1"  # stat fails: the name is too long
    good = f"{model.resolve()}|4|{model.stat().st_mtime_ns}"
    cache = tmp_path / "digests.json"
    cache.write_text(json.dumps({too_long: digest, good: digest}), encoding="utf-8")
    assert ModelDigests(cache).path_for(digest) == model.resolve()


def test_a_file_is_found_by_its_digest_only_while_unchanged(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    digests = ModelDigests(tmp_path / "digests.json")
    digest = digests.digest(model)
    assert digests.path_for(digest) == model.resolve()
    assert ModelDigests(tmp_path / "digests.json").path_for(digest) == model.resolve()
    assert digests.path_for("ff" * 32) is None
    os.utime(model, ns=(1, 1))  # touched: its contents are not known any more
    assert digests.path_for(digest) is None
    model.unlink()
    assert digests.path_for(digest) is None


def test_the_digest_cache_lives_in_the_user_cache_directory():
    import platformdirs

    expected = Path(platformdirs.user_cache_dir("LocalChat")) / "model-sha256.json"
    assert receipt_mod.default_digest_cache() == expected
    assert receipt_mod.default_digest_cache().parent.name == "LocalChat"


# --- digests of receipt sections ----------------------------------------------------------------
def test_text_ids_and_canonical_digests_are_sha256_of_fixed_text():
    assert receipt_mod.text_sha256("héllo") == hashlib.sha256("héllo".encode()).hexdigest()
    assert receipt_mod.ids_sha256([1, 22, 333]) == sha("1,22,333")
    assert receipt_mod.ids_sha256([]) == sha("")
    assert receipt_mod.canonical_sha256({"b": [1, None], "a": "x"}) == sha('{"a":"x","b":[1,null]}')
    assert receipt_mod.canonical_sha256({"p": Path("/m")}) == sha('{"p":"/m"}')


# hand-written canonical JSON (sorted keys, no spaces) of the sections make_receipt() holds
PROMPT_CHECK = sha("[1,2,3]")
PRESET_CHECK = sha(
    '{"json_mode":"off","json_schema":null,"seed_used":42,'
    '"values":{"max_new_tokens":64,"seed":null,"temperature":0.7,"top_p":0.9}}'
)
OUTPUT_CHECK = sha("[7,8]")


def make_receipt():
    return {
        "model": {"file_name": "a.gguf", "sha256": "aa" * 32},
        "engine": {"version": "0.1.0", "kernels": "JIT avx2, 2 threads"},
        "chat_template": {"name": "chatml", "sha256": "cc" * 32},
        "prompt": {"token_ids": [1, 2, 3]},
        "preset": {
            "values": {"temperature": 0.7, "seed": None, "max_new_tokens": 64, "top_p": 0.9},
            "seed_used": 42,
        },
        "json_mode": "off",
        "json_schema": None,
        "output": {"token_ids": [7, 8], "finish_reason": "stop"},
        "checks": {"prompt": PROMPT_CHECK, "preset": PRESET_CHECK, "output": OUTPUT_CHECK},
    }


def test_section_checks_are_digests_of_the_sections_as_recorded():
    assert section_checks(make_receipt()) == {
        "prompt": PROMPT_CHECK,
        "preset": PRESET_CHECK,
        "output": OUTPUT_CHECK,
    }
    assert section_checks({}) == {
        "prompt": sha("null"),
        "preset": sha('{"json_mode":null,"json_schema":null,"seed_used":null,"values":null}'),
        "output": sha("null"),
    }


@pytest.mark.parametrize(
    ("edit", "section"),
    [
        (lambda r: r["prompt"]["token_ids"].append(4), "prompt"),
        (lambda r: r["preset"]["values"].update(top_p=0.5), "preset"),
        (lambda r: r["preset"].update(seed_used=43), "preset"),
        (lambda r: r.update(json_mode="object"), "preset"),
        (lambda r: r.update(json_schema={"type": "object"}), "preset"),
        (lambda r: r["output"]["token_ids"].reverse(), "output"),
    ],
)
def test_each_edited_section_changes_its_own_check_only(edit, section):
    r = make_receipt()
    edit(r)
    changed = {k for k, v in section_checks(r).items() if v != make_receipt()["checks"][k]}
    assert changed == {section}


# --- building a receipt ---------------------------------------------------------------------
@dataclass
class Template:
    name: str = "chatml"
    source: str | None = "{{ messages }}"


@dataclass
class FakeLM:
    path: Path | None
    chat_template: Template = field(default_factory=Template)
    gguf: object = field(default_factory=lambda: SimpleNamespace(arch="llama"))
    backend: object = None


USAGE = Usage(
    prompt_tokens=3,
    completion_tokens=2,
    cached_tokens=None,
    prefill_ms=1.5,
    decode_ms=2.5,
    ttft_ms=1.75,
    prompt_tok_s=2000.0,
    decode_tok_s=800.0,
    context_used=5,
    context_limit=64,
)


def finished_with(**kwargs):
    base = dict(
        finish_reason="stop",
        usage=USAGE,
        text="Hi!",
        token_ids=(7, 8),
        preset={
            "values": {"temperature": 0.7, "max_new_tokens": None, "seed": None},
            "sources": {"temperature": "override", "max_new_tokens": "default"},
            "notes": ("a note",),
            "seed_used": 42,
        },
        prompt_ids=(1, 2, 3),
    )
    base.update(kwargs)
    return Finished(**base)


def test_a_receipt_records_model_engine_template_prompt_preset_output_and_usage(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 96)
    lm = FakeLM(model, backend=SimpleNamespace(name="numpy", fallback_reason="asked for"))
    messages = ({"role": "user", "content": "Hi"},)
    request = GenerationRequest(messages=messages, enable_thinking=False)
    r = build_receipt(lm, request, finished_with(), "dd" * 32)
    assert r["receipt_version"] == 1
    assert r["model"] == {
        "file_name": "model.gguf",
        "sha256": "dd" * 32,
        "size_bytes": 100,
        "architecture": "llama",
    }
    assert r["engine"] == {
        "version": receipt_mod.engine_version(),
        "kernels": "numpy (asked for)",
    }
    assert r["chat_template"] == {"name": "chatml", "sha256": sha("{{ messages }}")}
    assert r["prompt"] == {
        "messages": [{"role": "user", "content": "Hi"}],
        "token_ids": [1, 2, 3],
        "n_tokens": 3,
        "sha256": sha("1,2,3"),
        "template_options": {"enable_thinking": False},
    }
    assert r["preset"] == {
        "values": {"temperature": 0.7, "max_new_tokens": None, "seed": None},
        "sources": {"temperature": "override", "max_new_tokens": "default"},
        "notes": ["a note"],
        "seed_used": 42,
    }
    assert (r["json_mode"], r["json_schema"]) == ("off", None)
    assert r["output"] == {"token_ids": [7, 8], "n_tokens": 2, "finish_reason": "stop"}
    assert r["usage"]["ttft_ms"] == 1.75 and r["usage"]["context_limit"] == 64
    assert r["checks"] == {
        "prompt": sha("[1,2,3]"),
        "preset": sha(
            '{"json_mode":"off","json_schema":null,"seed_used":42,'
            '"values":{"max_new_tokens":null,"seed":null,"temperature":0.7}}'
        ),
        "output": sha("[7,8]"),
    }
    json.dumps(r)  # stored and exported as JSON as it is


def test_a_receipt_of_a_raw_prompt_with_no_preset_and_no_model_file():
    lm = FakeLM(None, chat_template=Template(name="", source=None), gguf=None)
    r = build_receipt(
        lm, GenerationRequest(prompt_ids=[1]), finished_with(preset={}), model_sha256=None
    )
    assert r["model"] == {"file_name": "", "sha256": None, "size_bytes": None, "architecture": ""}
    assert r["chat_template"] == {"name": "chat template", "sha256": sha("")}
    assert r["engine"]["kernels"] == "numpy"
    assert r["prompt"]["messages"] is None and r["prompt"]["template_options"] == {}
    assert r["preset"] == {"values": {}, "sources": {}, "notes": [], "seed_used": None}


def test_a_model_object_without_path_format_or_template_names_still_describes():
    # a model as some engines hand it over: no path, no GGUF handle, a template object that
    # carries neither a name nor a source
    r = environment(SimpleNamespace(chat_template=SimpleNamespace()), "ee" * 32)
    assert r["model"] == {
        "file_name": "",
        "sha256": "ee" * 32,
        "size_bytes": None,
        "architecture": "",
    }
    assert r["chat_template"] == {"name": "chat template", "sha256": sha("")}
    assert r["engine"]["kernels"] == "numpy"


def test_a_model_file_gone_since_the_load_has_no_size(tmp_path):
    r = environment(FakeLM(tmp_path / "gone.gguf"), None)
    assert r["model"]["file_name"] == "gone.gguf" and r["model"]["size_bytes"] is None


@pytest.mark.parametrize(
    ("mode", "schema", "recorded"),
    [
        (JsonMode.SCHEMA, '{"type": "object"}', {"type": "object"}),  # JSON text: parsed
        (JsonMode.SCHEMA, {"type": "array"}, {"type": "array"}),
        (JsonMode.SCHEMA, "not json {", "not json {"),  # kept as the text
        (JsonMode.OBJECT, {"type": "object"}, None),  # only schema mode uses a schema
        (JsonMode.OFF, {"type": "object"}, None),
    ],
)
def test_json_mode_and_its_schema_are_recorded(tmp_path, mode, schema, recorded):
    request = GenerationRequest(prompt_ids=[1], json_mode=mode, json_schema=schema)
    r = build_receipt(FakeLM(None), request, finished_with(finish_reason="grammar_complete"), None)
    assert (r["json_mode"], r["json_schema"]) == (str(mode), recorded)
    assert r["output"]["finish_reason"] == "grammar_complete"


def test_the_engine_version_is_unknown_when_not_installed(monkeypatch):
    def missing(name):
        assert name == "localchat"
        raise receipt_mod.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(receipt_mod.metadata, "version", missing)
    assert receipt_mod.engine_version() == "unknown"


# --- what a replay runs ----------------------------------------------------------------------
def test_the_replay_request_runs_every_recorded_value_with_the_seed_used():
    r = make_receipt()
    request = replay_request(r, n_tokens=3)
    assert list(request.prompt_ids) == [1, 2, 3]
    # This receipt predates the repetition stop (no stop_on_repetition): it replays with it off.
    assert request.overrides == {
        "temperature": 0.7,
        "seed": 42,
        "max_new_tokens": 3,
        "top_p": 0.9,
        "stop_on_repetition": False,
    }
    assert request.json_mode == "off" and request.json_schema is None
    assert request.top_logprobs == 20
    assert request.messages is None and request.prompt is None


def test_the_recorded_cap_is_kept_when_the_replay_needs_fewer_tokens():
    r = make_receipt()
    assert replay_request(r).overrides["max_new_tokens"] == 64  # no cap asked: as recorded
    assert replay_request(r, n_tokens=65).overrides["max_new_tokens"] == 64
    assert replay_request(r, n_tokens=64).overrides["max_new_tokens"] == 64
    assert replay_request(r, n_tokens=0).overrides["max_new_tokens"] == 1  # never 0


def test_an_unbounded_reply_is_capped_by_its_own_length():
    # The default preset records max_new_tokens None (until the context is full): issue 31's
    # "int() argument must be ... not 'NoneType'" on every default reply.
    r = make_receipt()
    r["preset"]["values"]["max_new_tokens"] = None
    assert replay_request(r, n_tokens=5).overrides["max_new_tokens"] == 5
    assert replay_request(r).overrides["max_new_tokens"] is None
    del r["preset"]["values"]["max_new_tokens"]
    assert replay_request(r, n_tokens=5).overrides["max_new_tokens"] == 5


@pytest.mark.parametrize(
    ("recorded", "n_tokens", "n_ctx", "expected"),
    [
        (None, 9, 10, 7),  # 3 prompt tokens in 10 positions leave 7: the token past is refused
        (None, 9, 12, 9),  # room for all
        (None, 9, 11, 8),
        (64, 9, 10, 7),
        (5, 9, 10, 5),
        (None, 9, 4, 1),  # one position left
        (None, 9, 3, 9),  # none left: not hidden, generate names the overflow
        (None, 9, 2, 9),
    ],
)
def test_the_replay_fits_the_context_window_it_runs_in(recorded, n_tokens, n_ctx, expected):
    r = make_receipt()
    r["preset"]["values"]["max_new_tokens"] = recorded
    assert replay_request(r, n_tokens, n_ctx).overrides["max_new_tokens"] == expected


def test_a_receipt_without_a_seed_value_replays_with_its_seed_used():
    r = make_receipt()
    del r["preset"]["values"]["seed"]
    assert replay_request(r).overrides["seed"] == 42
    r["preset"].pop("seed_used")
    assert "seed" not in replay_request(r).overrides


def test_a_greedy_reply_replays_without_a_seed():
    r = make_receipt()
    r["preset"]["values"]["seed"] = 7  # recorded, but greedy decoding used none
    r["preset"]["seed_used"] = None
    assert "seed" not in replay_request(r).overrides
    r["preset"]["seed_used"] = "42"  # JSON edited by hand: still a number
    assert replay_request(r).overrides["seed"] == 42


def test_json_mode_and_schema_go_to_the_replay():
    r = make_receipt()
    r["json_mode"], r["json_schema"] = "schema", {"type": "object"}
    request = replay_request(r, n_tokens=3)
    assert request.json_mode == "schema" and request.json_schema == {"type": "object"}
    r["json_mode"] = None
    assert replay_request(r).json_mode == "off"
    del r["json_mode"]
    assert replay_request(r).json_mode == "off"


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: r.pop("prompt"),
        lambda r: r["prompt"].pop("token_ids"),
        lambda r: r["prompt"].update(token_ids=None),
        lambda r: r["prompt"].update(token_ids=["x"]),
        lambda r: r.pop("preset"),
        lambda r: r["preset"].pop("values"),
        lambda r: r["preset"].update(values=[1, 2]),
        lambda r: r.update(preset=[]),
        lambda r: r["preset"].update(seed_used="forty-two"),
        lambda r: r["preset"]["values"].update(max_new_tokens="many"),
        lambda r: r["preset"]["values"].update(max_new_tokens=[3]),
    ],
)
def test_a_receipt_that_cannot_be_replayed_says_so(damage):
    r = make_receipt()
    damage(r)
    with pytest.raises(ReceiptError, match="the receipt has no usable prompt or preset"):
        replay_request(r, n_tokens=3)


# --- the first divergence ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 2, 4], 2),
        ([5, 2, 3], [1, 2, 3], 0),
        ([1, 2], [1, 2, 3], 2),  # the original ended, the replay went on
        ([1, 2, 3], [1], 1),  # the replay ended early
        ([], [3], 0),
        ([3], [], 0),
        ([], [], None),
        ([1, 9, 3], [1, 2, 3, 4], 1),  # the first difference, not the length
    ],
)
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


# --- what differs in a receipt -----------------------------------------------------------------
def environment_like(r):
    return {k: dict(r[k]) for k in ("model", "engine", "chat_template")}


def test_a_matching_receipt_has_no_differences():
    r = make_receipt()
    assert receipt_differences(r, environment_like(r), {"values": r["preset"]["values"]}) == []
    assert receipt_differences(r, environment_like(r)) == []


def test_each_kind_of_difference_is_named():
    r = make_receipt()
    now = environment_like(r)
    now["model"] = {"file_name": "b.gguf", "sha256": "bb" * 32}
    now["chat_template"] = {"name": "chatml (fallback)", "sha256": "dd" * 32}
    now["engine"] = {"version": "0.2.0", "kernels": "numpy"}
    r["preset"]["values"]["temperature"] = 1.2  # edited after it was recorded
    resolved = {"values": {**r["preset"]["values"], "top_p": 1.0, "max_new_tokens": 3}}
    assert receipt_differences(r, now, resolved) == [
        "model file: a.gguf (sha256 aaaaaaaaaaaa…) in the receipt, b.gguf (sha256 bbbbbbbbbbbb…) "
        "now",
        "chat template: chatml (cccccccccccc…) in the receipt, chatml (fallback) (dddddddddddd…) "
        "now",
        "engine version: 0.1.0 in the receipt, 0.2.0 now",
        "kernels: JIT avx2, 2 threads in the receipt, numpy now",
        "the receipt's preset was changed after it was recorded",
        "preset top_p: 0.9 in the receipt, 1.0 in the replay",
    ]


def test_same_file_under_another_name_is_told_apart_from_another_file():
    r = make_receipt()
    now = environment_like(r)
    now["model"] = {"file_name": "renamed.gguf", "sha256": r["model"]["sha256"]}
    assert receipt_differences(r, now) == [
        "model file name: a.gguf in the receipt, renamed.gguf now (same contents)"
    ]


def test_a_model_file_that_could_not_be_hashed_is_a_difference():
    r = make_receipt()
    now = environment_like(r)
    now["model"] = {"file_name": "a.gguf", "sha256": None}
    assert receipt_differences(r, now) == [
        "model file: a.gguf (sha256 aaaaaaaaaaaa…) in the receipt, a.gguf (sha256 None…) now"
    ]


def test_a_receipt_missing_its_environment_sections_names_them_as_none():
    r = make_receipt()
    now = environment_like(r)
    for key in ("model", "engine", "chat_template", "checks"):
        del r[key]
    assert receipt_differences(r, now) == [
        f"model file: None (sha256 None…) in the receipt, a.gguf (sha256 {'aa' * 6}…) now",
        f"chat template: None (None…) in the receipt, chatml ({'cc' * 6}…) now",
        "engine version: None in the receipt, 0.1.0 now",
        "kernels: None in the receipt, JIT avx2, 2 threads now",
    ]


@pytest.mark.parametrize(
    ("edit", "section"),
    [
        (lambda r: r["prompt"]["token_ids"].append(4), "prompt"),
        (lambda r: r["preset"].update(seed_used=1), "preset"),
        (lambda r: r["output"]["token_ids"].append(9), "output"),
    ],
)
def test_each_section_edited_after_recording_is_named(edit, section):
    r = make_receipt()
    now = environment_like(r)
    edit(r)
    assert receipt_differences(r, now) == [
        f"the receipt's {section} was changed after it was recorded"
    ]


def test_a_receipt_without_checks_cannot_be_told_tampered():
    r = make_receipt()
    now = environment_like(r)
    r["output"]["token_ids"].append(9)
    r["checks"] = {"prompt": PROMPT_CHECK}  # only what was recorded is compared
    assert receipt_differences(r, now) == []
    r["checks"] = None
    assert receipt_differences(r, now) == []
    r["checks"] = {"output": OUTPUT_CHECK}
    assert receipt_differences(r, now) == ["the receipt's output was changed after it was recorded"]


def test_preset_values_resolved_differently_by_the_replay_are_named():
    r = make_receipt()
    now = environment_like(r)
    resolved = {
        "values": {
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 42,  # from seed_used, on purpose
            "max_new_tokens": 3,  # capped to the original's length, on purpose
            "min_p": 0.05,  # a field this receipt does not have (a newer engine)
        }
    }
    assert receipt_differences(r, now, resolved) == [
        "preset min_p: None in the receipt, 0.05 in the replay"
    ]
    resolved["values"].pop("top_p")
    resolved["values"]["temperature"] = "0.7"
    assert receipt_differences(r, now, resolved) == [
        "preset min_p: None in the receipt, 0.05 in the replay",
        "preset temperature: 0.7 in the receipt, '0.7' in the replay",
        "preset top_p: 0.9 in the receipt, None in the replay",
    ]
    assert receipt_differences(r, now, {}) == [
        "preset temperature: 0.7 in the receipt, None in the replay",
        "preset top_p: 0.9 in the receipt, None in the replay",
    ]
    del r["preset"]
    assert receipt_differences(r, now, {"values": {"top_k": 40}})[-1] == (
        "preset top_k: None in the receipt, 40 in the replay"
    )


# --- the note when the receipt's model file is not the loaded one ------------------------------
def test_the_model_file_note_says_which_file_answered():
    r = make_receipt()
    found = Path("/models/a.gguf")
    assert model_file_note(r, found) == (
        f"replayed on {found}: the receipt's model file a.gguf (sha256 {'aa' * 32}), found on "
        "this machine by its sha256 (the loaded model is another file)"
    )
    assert model_file_note(r, None) == (
        f"the receipt's model file a.gguf (sha256 {'aa' * 32}) is not on this machine (no file "
        "with that sha256 has been opened here); this replay ran on the loaded model instead"
    )
    assert model_file_note({"model": None}, None).startswith(
        "the receipt's model file None (sha256 None) is not on this machine"
    )


# --- describing a divergence -------------------------------------------------------------------
RECORD = {
    "index": 0,
    "token_id": 5,
    "text": " a",
    "logprob": -0.5,
    "top": [{"token_id": 5, "logprob": -0.5}, {"token_id": 9, "logprob": -1.5}],
}


def sampled(token_id, text, logprob, *top, index=0):
    return TokenSampled(index, token_id, text, logprob, tuple(TopAlternative(*a) for a in top))


def test_a_divergence_says_whether_the_model_saw_the_same_distribution():
    same = sampled(9, " b", -1.5, (5, " a", -0.5), (9, " b", -1.5))
    d = _describe(0, [5], [RECORD], [same], lm=None)
    assert (d.index, d.original.token_id, d.original.text, d.original.logprob) == (0, 5, " a", -0.5)
    assert (d.replayed.token_id, d.replayed.text, d.replayed.logprob) == (9, " b", -1.5)
    assert (d.original_logprob_in_replay, d.replayed_logprob_in_original) == (-0.5, -1.5)
    assert d.same_distribution is True
    other = sampled(9, " b", -0.2, (9, " b", -0.2), (5, " a", -2.0))
    assert _describe(0, [5], [RECORD], [other], lm=None).same_distribution is False
    ended = _describe(1, [5], [RECORD], [same, other], lm=None)  # the original had ended
    assert ended.original is None and ended.original_logprob_in_replay is None
    assert ended.replayed.token_id == 9 and ended.same_distribution is None


@pytest.mark.parametrize(
    ("replayed_logprob", "same"),
    [(-1.5 + 2**-17, True), (-1.5 - 2**-17, True), (-1.5 + 2**-16, False), (-1.5 - 2**-16, False)],
)
def test_probabilities_within_float_noise_are_the_same(replayed_logprob, same):
    event = sampled(9, " b", replayed_logprob, (5, " a", -0.5), (9, " b", replayed_logprob))
    assert _describe(0, [5], [RECORD], [event], lm=None).same_distribution is same


def test_a_difference_of_exactly_the_tolerance_is_the_same():
    record = {**RECORD, "top": [{"token_id": 9, "logprob": 0.0}]}
    event = sampled(9, " b", -1e-5, (5, " a", -0.5))  # |0.0 - -1e-5| == 1e-5 exactly
    assert _describe(0, [5], [record], [event], lm=None).same_distribution is True


def test_only_the_first_pair_differing_is_enough_to_differ():
    event = sampled(9, " b", -1.5, (5, " a", -0.4), (9, " b", -1.5))
    assert _describe(0, [5], [RECORD], [event], lm=None).same_distribution is False


def test_a_divergence_where_the_replay_ended():
    class Tokenizer:
        def piece(self, token_id):
            return f"piece{token_id}"

    lm = SimpleNamespace(tokenizer=Tokenizer())
    d = _describe(1, [5, 6], [RECORD], [sampled(5, " a", -0.5)], lm)
    # no stored record at index 1: the text from the vocabulary, the probability unknown
    assert d.original.token_id == 6 and d.original.text == "piece6" and d.original.logprob is None
    assert d.replayed is None and d.replayed_logprob_in_original is None
    assert d.original_logprob_in_replay is None and d.same_distribution is None


def test_a_record_of_another_token_is_not_used_for_the_original():
    # The stored records say token 5 at index 0; the receipt says 6 (edited, or records cut).
    lm = SimpleNamespace(tokenizer=SimpleNamespace(piece=lambda t: {6: " six"}[t]))
    event = sampled(9, " b", -1.5, (6, " six", -3.0), (9, " b", -1.5))
    d = _describe(0, [6], [RECORD], [event], lm)
    assert (d.original.text, d.original.logprob) == (" six", None)
    assert d.original_logprob_in_replay == -3.0
    assert d.replayed_logprob_in_original == -1.5  # the record's alternatives still tell
    assert d.same_distribution is None  # the original's own probability is not known


def test_a_token_the_vocabulary_cannot_show_reads_as_its_id():
    def broken(token_id):
        raise IndexError(token_id)

    lm = SimpleNamespace(tokenizer=SimpleNamespace(piece=broken))
    d = _describe(0, [77], [], [], lm)
    assert d.original == receipt_mod.TokenChoice(77, "<77>", None)
    assert d.replayed is None and d.same_distribution is None


def test_records_are_found_by_index_and_odd_ones_are_skipped():
    records = [
        "not a record",
        {"index": 1, "token_id": 6, "text": " six", "logprob": -0.1, "top": [None, {}]},
        {"index": 0, "token_id": 5, "text": " five", "logprob": -0.2},
    ]
    event = sampled(7, " s", -1.0, (6, " six", -0.1), index=1)
    d = _describe(1, [5, 6], records, [sampled(5, " five", -0.2), event], lm=None)
    assert d.original == receipt_mod.TokenChoice(6, " six", -0.1)
    assert d.original_logprob_in_replay == -0.1
    assert d.replayed_logprob_in_original is None  # 7 is not among the record's alternatives
    d0 = _describe(0, [5], records, [sampled(8, " e", -1.0)], lm=None)
    assert d0.original == receipt_mod.TokenChoice(5, " five", -0.2)
    assert d0.replayed_logprob_in_original is None  # a record without alternatives
    no_text = {"index": 0, "token_id": 5, "logprob": -0.2}
    assert _describe(0, [5], [no_text], [], lm=None).original.text == ""
