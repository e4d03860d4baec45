"""The remote backend's parts that need no server: the SSE parser (hand-written streams), the
request fields built from a preset, the key store's fallback file, and the chat_backends table."""

from __future__ import annotations

import json

import pytest

from app.backends.keys import KeyStore
from app.backends.openai_client import Connection, normalized_base_url
from app.backends.remote import (
    SOURCE_SERVER_DEFAULT,
    RemoteEngine,
    json_reply_problem,
    openai_params,
    parse_remote_path,
    remote_model_path,
)
from app.backends.sse import SseEvent, SseParser
from app.store import SCHEMA_VERSION, Store
from engine.types import GenerationRequest, JsonMode, ModelInfo

STREAM = (
    b'data: {"a":1}\r\n\r\n'
    b": keep-alive comment\n\n"
    b"data: first line\ndata: second line\n\n"
    b'event: error\ndata: {"error":"x"}\n\n'
    + "data: caf\u00e9 \U0001f600\n\n".encode()
    + b"data: [DONE]\n\n"
)
EXPECTED = [
    SseEvent('{"a":1}'),
    SseEvent("first line\nsecond line"),
    SseEvent('{"error":"x"}', "error"),
    SseEvent("caf\u00e9 \U0001f600"),
    SseEvent("[DONE]"),
]


@pytest.mark.parametrize("piece", [1, 2, 3, 7, len(STREAM)])
def test_sse_events_whatever_the_network_splits(piece):
    """Split mid-line, between \\r and \\n, and inside a 4-byte UTF-8 character."""
    parser = SseParser()
    events = []
    for at in range(0, len(STREAM), piece):
        events += parser.feed(STREAM[at : at + piece])
    events += parser.close()
    assert events == EXPECTED


def test_sse_last_event_without_blank_line_still_counts():
    parser = SseParser()
    assert parser.feed(b"data: tail") == []
    assert parser.close() == [SseEvent("tail")]


def test_base_url_normalized_and_bad_ones_refused():
    assert normalized_base_url("127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    assert normalized_base_url("https://api.example.com/v1/") == "https://api.example.com/v1"
    assert normalized_base_url("http://h:1/openai/v1") == "http://h:1/openai/v1"
    for bad in ("", "ftp://host/v1", "http://", "host:port/v1"):
        with pytest.raises(ValueError):
            normalized_base_url(bad)


def _preset(saved=None, overrides=None):
    engine = RemoteEngine(book=None)
    info = ModelInfo("remote://c/m", "m", "remote", 0, "remote on h")
    return engine.resolve_preset(info, saved, overrides)


def test_only_the_values_the_user_set_are_sent():
    preset = _preset(saved={"top_p": 0.9}, overrides={"temperature": 0.7, "top_k": 20, "seed": 5})
    request = GenerationRequest(messages=(), top_logprobs=3)
    params = openai_params(request, preset)
    assert params == {
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 5,
        "top_k": 20,
        "logprobs": True,
        "top_logprobs": 3,
    }
    assert preset.sources["min_p"] == SOURCE_SERVER_DEFAULT
    assert preset.sources["temperature"] == "override"


def test_greedy_max_tokens_stop_and_json_modes_map_to_openai_fields():
    preset = _preset(overrides={"do_sample": False, "max_new_tokens": 32, "stop": ["END"]})
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    schema_request = GenerationRequest(messages=(), json_mode=JsonMode.SCHEMA, json_schema=schema)
    params = openai_params(schema_request, preset)
    assert params["temperature"] == 0.0 and params["max_tokens"] == 32
    assert params["stop"] == ["END"]
    assert params["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": schema, "strict": True},
    }
    object_request = GenerationRequest(messages=(), json_mode=JsonMode.OBJECT)
    assert openai_params(object_request, preset)["response_format"] == {"type": "json_object"}


def test_a_server_that_ignored_the_json_format_is_caught():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["n"],
    }
    request = GenerationRequest(messages=(), json_mode=JsonMode.SCHEMA, json_schema=schema)
    assert json_reply_problem('{"n": 3, "tags": ["a"]}', request) is None
    assert "not valid JSON" in json_reply_problem("Sure! Here is", request)
    assert "lacks the required key 'n'" in json_reply_problem('{"m": 1}', request)
    assert "asks for integer" in json_reply_problem('{"n": true}', request)
    assert "asks for string" in json_reply_problem('{"n": 1, "tags": [2]}', request)
    object_mode = GenerationRequest(messages=(), json_mode=JsonMode.OBJECT)
    assert "asks for object" in json_reply_problem("[1, 2]", object_mode)


def test_remote_paths_round_trip_model_ids_with_slashes():
    path = remote_model_path("abc", "meta-llama/Llama-3.1-8B-Instruct")
    assert parse_remote_path(path) == ("abc", "meta-llama/Llama-3.1-8B-Instruct")
    assert parse_remote_path("/models/x.gguf") is None


def test_key_file_fallback_is_private_and_keys_can_be_removed(tmp_path):
    keys = KeyStore(tmp_path / "d" / "api-keys.json", use_keychain=False)
    assert "0600" in keys.where and not keys.uses_keychain
    keys.set("c1", "sk-one")
    keys.set("c2", "sk-two")
    path = tmp_path / "d" / "api-keys.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o700
    assert KeyStore(path, use_keychain=False).get("c1") == "sk-one"
    keys.set("c1", None)
    assert json.loads(path.read_text()) == {"c2": "sk-two"}


def test_connection_never_serialises_a_key():
    connection = Connection.from_dict(
        {"id": "x", "name": "box", "base_url": "h:1", "api_key": "sk-leak"}
    )
    assert "sk-leak" not in json.dumps(connection.to_dict())
    assert connection.label == "box (h:1)"


def test_chat_backend_binding_persists_and_goes_with_its_chat(tmp_path):
    store = Store(tmp_path / "chats.sqlite3")
    cid = store.create_conversation()
    assert store.chat_backend(cid) is None
    store.set_chat_backend(cid, "remote", "c1", "smollm2")
    store.set_chat_backend(cid, "remote", "c1", "qwen")  # the latest choice wins
    store.close()
    store = Store(tmp_path / "chats.sqlite3")
    binding = store.chat_backend(cid)
    assert (binding.kind, binding.connection_id, binding.model) == ("remote", "c1", "qwen")
    store.delete_conversation(cid)
    assert store.chat_backend(cid) is None
    assert store.schema_version == SCHEMA_VERSION  # the binding table adds no version
    store.close()
