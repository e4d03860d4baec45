"""The remote backend: an EngineBridge (app/engine_bridge.py) over an OpenAI-compatible server,
so the same EngineController and worker thread that run the local engine run it too.

"Loading" a remote model means contacting the server and checking that it lists the model;
a remote model is named by a path `remote://<connection id>/<model id>` (ModelInfo.path, the
chat's backend binding, the saved preset's key). Sampling values go to the server only when
the user set them (the panel shows the others as the server's default)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from app.backends.connection import Connection
from app.backends.errors import RemoteError, UnknownModelError
from app.engine_bridge import StreamNotice
from engine.cancel import CancelToken
from engine.events import Finished
from engine.types import FinishReason, GenerationRequest, JsonMode, ModelInfo, ResolvedPreset

if TYPE_CHECKING:
    from app.backends.openai_client import OpenAIClient

REMOTE_SCHEME = "remote://"
REMOTE_ARCHITECTURE = "remote"
SOURCE_SERVER_DEFAULT = "server's default (not sent)"
USER_SOURCES = ("override", "saved preset")  # engine.presets SOURCE_OVERRIDE / SOURCE_SAVED
# Our field -> the OpenAI request field. Those after the standard ones are extras that vLLM,
# llama.cpp's server and llama-cpp-python accept; a server that refuses one gets the request
# again without it (openai_client.OPTIONAL_FIELDS) and the user is told.
OPENAI_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_new_tokens": "max_tokens",
    "stop": "stop",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
}
NOT_SENT = ("repeat_last_n",)


def remote_model_path(connection_id: str, model: str) -> str:
    return f"{REMOTE_SCHEME}{connection_id}/{quote(model, safe='')}"


def parse_remote_path(path: str) -> tuple[str, str] | None:
    """(connection id, model id) for a remote path, None for a local file."""
    if not str(path).startswith(REMOTE_SCHEME):
        return None
    connection_id, _, model = str(path)[len(REMOTE_SCHEME) :].partition("/")
    return connection_id, unquote(model)


def is_remote_path(path: str) -> bool:
    return parse_remote_path(path) is not None


class ConnectionBook:
    """The user's connections and a way to their keys; shared by the GUI and the worker."""

    def __init__(self, connections: list[Connection], keys):
        self.connections = list(connections)
        self.keys = keys  # app.backends.keys.KeyStore

    def get(self, connection_id: str) -> Connection | None:
        return next((c for c in self.connections if c.id == connection_id), None)

    def client(self, connection: Connection) -> OpenAIClient:
        from app.backends.openai_client import OpenAIClient  # httpx loads on first use

        return OpenAIClient(connection, self.keys.get(connection.id))


@dataclass
class RemoteHandle:
    """The 'loaded model' of the remote backend (lives on the worker thread)."""

    connection: Connection
    model: str
    client: OpenAIClient
    context_length: int | None


def openai_params(request: GenerationRequest, preset: ResolvedPreset) -> dict:
    """The request fields beside model/messages: sampling values the user set, JSON mode,
    logprobs."""
    values, sources = preset.values, preset.sources
    params: dict = {}
    for ours, theirs in OPENAI_FIELDS.items():
        if sources.get(ours) in USER_SOURCES and values.get(ours) not in (None, [], ()):
            params[theirs] = list(values[ours]) if ours == "stop" else values[ours]
    if sources.get("do_sample") in USER_SOURCES and values.get("do_sample") is False:
        params["temperature"] = 0.0  # greedy, as OpenAI-compatible servers spell it
    if request.json_mode == JsonMode.OBJECT:
        params["response_format"] = {"type": "json_object"}
    elif request.json_mode == JsonMode.SCHEMA and request.json_schema is not None:
        params["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": request.json_schema, "strict": True},
        }
    if request.top_logprobs:
        params["logprobs"] = True
        params["top_logprobs"] = int(request.top_logprobs)
    tools = [_openai_tool(t) for t in request.tools or ()]
    if tools:
        params["tools"] = tools
        choice = request.tool_choice
        params["tool_choice"] = str(choice) if isinstance(choice, str) else dict(choice)
    return params


def _openai_tool(tool) -> dict:
    """The OpenAI function-tool dict (GenerationRequest.tools also takes the bare function)."""
    tool = dict(tool)
    return tool if "function" in tool else {"type": "function", "function": tool}


def openai_message(message) -> dict:
    """A chat message as the OpenAI API takes it: tool calls in the history with their arguments
    as JSON text, a tool result with the id of the call it answers."""
    out: dict = {"role": str(message["role"]), "content": message.get("content")}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_openai_call(c) for c in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key) and (key != "name" or out["role"] == "tool"):
            out[key] = message[key]
    if out["content"] is None and not calls:
        out["content"] = ""
    return out


def _openai_call(call) -> dict:
    if hasattr(call, "to_openai"):  # engine.types.ToolCall
        return call.to_openai()
    call = dict(call)
    function = dict(call.get("function") or {})
    if not isinstance(function.get("arguments", ""), str):
        function["arguments"] = json.dumps(function["arguments"])
    return {**call, "type": "function", "function": function}


class RemoteEngine:
    """EngineBridge for remote models. `interrupt` is called from the GUI thread on Stop."""

    def __init__(self, book: ConnectionBook):
        self.book = book
        self._active: OpenAIClient | None = None

    def load(self, path, *, n_ctx, n_threads, progress, cache_type="f16") -> RemoteHandle:
        parsed = parse_remote_path(path)
        if parsed is None:
            raise RemoteError("", f"{path} is not a remote model")
        connection_id, model = parsed
        connection = self.book.get(connection_id)
        if connection is None:
            raise RemoteError(
                "",
                f"The connection for the remote model '{model}' was removed; add it again in "
                "Settings > Connections or pick another model.",
            )
        progress(f"contacting {connection.host}", 0.3)
        client = self.book.client(connection)
        try:
            models = client.list_models()
        except BaseException:
            client.close()
            raise
        found = next((m for m in models if m.id == model), None)
        if found is None:
            client.close()
            listed = ", ".join(m.id for m in models[:8]) or "none"
            raise UnknownModelError(
                connection.label,
                f"{connection.label} does not list the model '{model}' (it lists: {listed}).",
            )
        progress("connected", 1.0)
        return RemoteHandle(connection, model, client, found.context_length)

    def describe(self, handle: RemoteHandle) -> ModelInfo:
        label = handle.connection.label
        return ModelInfo(
            path=remote_model_path(handle.connection.id, handle.model),
            name=handle.model,
            architecture=REMOTE_ARCHITECTURE,
            n_ctx=handle.context_length or 0,
            template=f"remote on {handle.connection.host}",
            summary=f"connected to {handle.model} on {label}",
        )

    def unload(self, handle: RemoteHandle) -> None:
        handle.client.close()

    def resolve_preset(self, model: ModelInfo, saved, overrides) -> ResolvedPreset:
        """The engine's validation (the same ranges as for local models) with the values the
        user did not set shown as the server's default: they are not sent."""
        from engine.presets import resolve_preset

        resolved = resolve_preset(model, saved=saved or None, overrides=overrides or None)
        sources = {
            name: source if source in USER_SOURCES else SOURCE_SERVER_DEFAULT
            for name, source in resolved.sources.items()
        }
        notes = resolved.notes + (
            "Remote model: only the values you set are sent; top_k, min_p and "
            "repetition_penalty go as extra fields, which vLLM and llama.cpp accept. "
            "repeat_last_n is not sent.",
        )
        return replace(resolved, sources=sources, notes=notes)

    def generate(
        self, handle: RemoteHandle, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[object]:
        preset = self.resolve_preset(self.describe(handle), request.saved_preset, request.overrides)
        params = openai_params(request, preset)
        messages = [openai_message(m) for m in request.messages]
        self._active = handle.client
        events = handle.client.chat(handle.model, messages, params, cancel)
        if request.json_mode == JsonMode.OFF:
            return events
        return _checked_json(events, request, handle.connection.label)

    def interrupt(self) -> None:
        client = self._active
        if client is not None:
            client.interrupt()


def _checked_json(events: Iterator[object], request: GenerationRequest, label: str):
    """JSON mode on a server: the reply is checked here as a local one would be (the local
    engine cannot produce anything else); a server that ignored response_format is said so
    before the Finished event."""
    for event in events:
        if isinstance(event, Finished) and event.finish_reason in (
            FinishReason.STOP,
            FinishReason.STOP_SEQUENCE,
        ):
            problem = json_reply_problem(event.text, request)
            if problem is not None:
                yield StreamNotice(
                    f"{label} did not follow the requested JSON format ({problem}); the server "
                    "may not support response_format."
                )
        yield event


def json_reply_problem(text: str, request: GenerationRequest) -> str | None:
    """Why a JSON-mode reply is not what was asked for, or None."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the reply is not valid JSON: {exc}"
    schema = request.json_schema if request.json_mode == JsonMode.SCHEMA else {"type": "object"}
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return None
    return _schema_problem(value, schema if isinstance(schema, dict) else {}, "the reply")


_JSON_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def _schema_problem(value, schema: dict, where: str) -> str | None:
    """The checks a server that ignored the schema fails: type, required keys, nested
    properties and array items (not a full JSON Schema validator; the constrained local engine
    needs none)."""
    wanted = schema.get("type")
    if isinstance(wanted, str) and wanted in _JSON_TYPES:
        ok = isinstance(value, _JSON_TYPES[wanted])
        if wanted in ("integer", "number") and isinstance(value, bool):
            ok = False
        if not ok:
            return f"{where} is {type(value).__name__}, the schema asks for {wanted}"
    if isinstance(value, dict):
        for key in schema.get("required", []) or []:
            if key not in value:
                return f"{where} lacks the required key '{key}'"
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and isinstance(sub, dict):
                problem = _schema_problem(value[key], sub, f"'{key}'")
                if problem:
                    return problem
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = _schema_problem(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None
