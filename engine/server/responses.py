"""Engine events -> OpenAI response objects (whole, or as streamed chunks).

One `ResponseWriter` per request. Streaming: `chunks(event)` for each engine event returns the
chat.completion.chunk / text_completion objects to send now, and `closing_chunks(finished)` the
last ones (the finish reason, then the usage chunk when stream_options.include_usage asked for
it). Not streaming: feed every event to `chunks` and ignore what it returns, then
`response(finished)` is the whole chat.completion / text_completion object.

Text reaches the client as the engine releases it (TextDelta: complete characters, never part of
a stop string). A token's logprob is sent with the first text chunk after it was sampled, so a
chunk may carry several tokens' logprobs, or none.

Reasoning (`<think>...</think>`) goes to `message.reasoning_content` / `delta.reasoning_content`
(DeepSeek's and llama.cpp's name for it), apart from `content`.

Finish reasons: the engine's "stop" (an end-of-generation token), "stop_sequence" (a `stop`
string) and "grammar_complete" (the JSON value is complete) are all OpenAI's "stop"; "length"
stays "length". Two have no OpenAI counterpart and keep our names: "cancelled" (the request was
cancelled, e.g. the server shut down while it ran) and "error" (the engine failed after the
request was accepted; a stream then also carries an `error` object, which OpenAI clients raise).

Tool calls: `message.tool_calls` (whole) and `delta.tool_calls` (streamed) in OpenAI's shape,
finish_reason "tool_calls" when the reply ended on calls. A streamed call's first delta is
{"index": i, "id", "type": "function", "function": {"name", "arguments": ""}}, then deltas
{"index": i, "function": {"arguments": fragment}} whose fragments concatenate to the arguments'
JSON text. When the request's tool_choice is "required" or a named function, every call is
decoded under the call grammar, so its deltas go out as the model writes them. With "auto" a
call is held until the engine has checked it (ToolCallFinished: an offered tool, arguments that
validate), then sent as the same deltas. A call the engine finds malformed (ToolCallMalformed:
not JSON, an unknown tool, arguments the schema rejects) is never sent as a tool call: OpenAI
agents execute every `tool_calls` entry they get and most crash on bad arguments, while text
they show to the user. So what the model wrote comes back as `content` (as llama-server and vLLM
do with calls their parsers cannot read), and the choice carries our extra field
`malformed_tool_calls: [{"name", "text", "problem"}]` saying why. (A constrained call can only be
malformed when it is cut off by max_tokens or a cancel; its deltas were sent already, and the
finish reason, "length" or "cancelled", says it is incomplete.)

Usage: OpenAI's prompt_tokens, completion_tokens, total_tokens and
prompt_tokens_details.cached_tokens (prompt tokens whose KV came from the shared prefix cache),
plus `usage.timings`, our extra field:
    {"prefill_ms", "decode_ms", "ttft_ms", "prompt_tokens_per_second", "decode_tokens_per_second"}
(ttft_ms: from the moment the engine started the request to its first sampled token).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from engine.events import (
    Finished,
    ReasoningDelta,
    TextDelta,
    TokenSampled,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
    Usage,
)
from engine.server.protocol import CHAT, ParsedRequest
from engine.types import FinishReason

OPENAI_FINISH_REASON = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.GRAMMAR_COMPLETE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_calls",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.ERROR: "error",
    FinishReason.REPETITION: "stop",  # a loop the engine ended (engine/repetition.py): no "go on"
}
SYSTEM_FINGERPRINT = "localchat"


def openai_finish_reason(reason: FinishReason) -> str:
    return OPENAI_FINISH_REASON[FinishReason(reason)]


def usage_object(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
        "timings": {
            "prefill_ms": round(usage.prefill_ms, 3),
            "decode_ms": round(usage.decode_ms, 3),
            "ttft_ms": round(usage.ttft_ms, 3),
            "prompt_tokens_per_second": round(usage.prompt_tok_s, 3),
            "decode_tokens_per_second": round(usage.decode_tok_s, 3),
        },
    }


class ResponseWriter:
    def __init__(
        self, parsed: ParsedRequest, model_id: str, token_bytes: Callable[[int], bytes]
    ) -> None:
        self.parsed = parsed
        self.model_id = model_id
        self.token_bytes = token_bytes
        chat = parsed.kind == CHAT
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        # a stream's objects: OpenAI's legacy completions stream sends "text_completion" chunks
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"
        self.tokens: list[TokenSampled] = []  # every sampled token (for logprobs)
        self._unsent_tokens: list[TokenSampled] = []
        self._role_sent = False
        self._text_offset = 0  # completions logprobs: characters of text before each token
        # tool calls: index in the reply's tool_calls (in the order they were sent), the deltas
        # of calls held back until checked, and what the whole response reports
        self._call_index: dict[str, int] = {}
        self._held: dict[str, list[dict]] = {}
        self._content: list[str] = []  # answer text, with malformed calls' text in place
        self._calls: list[dict] = []  # executable calls, OpenAI's tool_calls entries
        self._malformed: list[dict] = []
        self._arguments_text: dict[str, list[str]] = {}  # per call, as the model wrote it

    # --- streaming ---------------------------------------------------------------------------
    def opening_chunks(self) -> list[dict]:
        """Chat streams open with the assistant role, as OpenAI's do."""
        if self.parsed.kind != CHAT or self._role_sent:
            return []
        self._role_sent = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def chunks(self, event: object) -> list[dict]:
        if isinstance(event, TokenSampled):
            self.tokens.append(event)
            if self.parsed.logprobs and self.parsed.stream:
                self._unsent_tokens.append(event)
            return []
        if isinstance(event, TextDelta):
            self._content.append(event.text)
        tool_chunks = self._tool_call_chunks(event)
        if not self.parsed.stream:
            return []
        if tool_chunks:
            return tool_chunks
        if isinstance(event, TextDelta) and event.text:
            return [self._chunk({"content": event.text}, logprobs=self._take_logprobs())]
        if isinstance(event, ReasoningDelta) and event.text:
            return [self._chunk({"reasoning_content": event.text})]
        return []

    def closing_chunks(self, finished: Finished) -> list[dict]:
        out = [
            self._chunk(
                {},
                logprobs=self._take_logprobs(),
                finish_reason=self._finish_reason(finished),
            )
        ]
        if self._malformed:  # our extra field, on the chunk that closes the choice
            out[0]["choices"][0]["malformed_tool_calls"] = list(self._malformed)
        if self.parsed.include_usage:
            usage_chunk = self._envelope(self.chunk_object)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = usage_object(finished.usage)
            out.append(usage_chunk)
        return out

    # --- whole response ----------------------------------------------------------------------
    def response(self, finished: Finished) -> dict:
        body = self._envelope(self.object)
        logprobs = self._logprobs(self.tokens) if self.parsed.logprobs else None
        choice: dict[str, Any] = {"index": 0}
        if self.parsed.kind == CHAT:
            content = "".join(self._content) if self._malformed else finished.text
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if self._calls:
                message["tool_calls"] = list(self._calls)
                if not content:
                    message["content"] = None  # as OpenAI sends a reply that is only calls
            if finished.reasoning:
                message["reasoning_content"] = finished.reasoning
            choice["message"] = message
        else:
            choice["text"] = finished.text
        choice["logprobs"] = logprobs
        choice["finish_reason"] = self._finish_reason(finished)
        if self._malformed:
            choice["malformed_tool_calls"] = list(self._malformed)
        body["choices"] = [choice]
        body["usage"] = usage_object(finished.usage)
        return body

    # --- tool calls --------------------------------------------------------------------------
    def _tool_call_chunks(self, event: object) -> list[dict]:
        """The chunks a tool-call event sends now (none while an "auto" call is held back)."""
        live = self.parsed.tools_constrained
        if isinstance(event, ToolCallStarted):
            first: dict[str, Any] = {"id": event.id, "type": "function"}
            first["function"] = {"name": event.name, "arguments": ""}
            if live:
                return [self._tool_delta(event.id, first)]
            self._held[event.id] = [first]
        elif isinstance(event, ToolCallArgumentsDelta):
            self._arguments_text.setdefault(event.id, []).append(event.text)
            fragment = {"function": {"arguments": event.text}}
            if event.id in self._call_index:
                return [self._tool_delta(event.id, fragment)]
            self._held.setdefault(event.id, []).append(fragment)
        elif isinstance(event, ToolCallFinished):
            self._calls.append(self._whole_call(event))
            held = self._held.pop(event.id, [])
            return [self._tool_delta(event.id, delta) for delta in held]
        elif isinstance(event, ToolCallMalformed):
            self._held.pop(event.id, None)
            self._malformed.append(
                {"name": event.name, "text": event.text, "problem": event.problem}
            )
            if event.id in self._call_index:
                return []  # a constrained call cut short: sent already, the finish reason says so
            self._content.append(event.text)
            return [self._chunk({"content": event.text})] if event.text else []
        return []

    def _whole_call(self, event: ToolCallFinished) -> dict:
        """The call for message.tool_calls, its arguments the text the model wrote (what the
        streamed fragments concatenate to), so a client gets the same call either way."""
        entry = event.call.to_openai()
        written = "".join(self._arguments_text.get(event.id, ()))
        try:
            same = json.loads(written) == event.arguments
        except ValueError:
            same = False
        if same:
            entry["function"]["arguments"] = written
        return entry

    def _tool_delta(self, call_id: str, delta: dict) -> dict:
        index = self._call_index.setdefault(call_id, len(self._call_index))
        return self._chunk({"tool_calls": [{"index": index, **delta}]})

    def _finish_reason(self, finished: Finished) -> str:
        if finished.finish_reason == FinishReason.TOOL_CALLS and not self._calls:
            return "stop"  # only malformed calls: they came back as text
        return openai_finish_reason(finished.finish_reason)

    # --- pieces ------------------------------------------------------------------------------
    def _envelope(self, object_name: str) -> dict:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model_id,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def _chunk(
        self, delta: dict, *, logprobs: dict | None = None, finish_reason: str | None = None
    ) -> dict:
        if self.parsed.kind == CHAT:
            body = self._envelope("chat.completion.chunk")
            choice = {"index": 0, "delta": delta, "logprobs": logprobs}
        else:
            body = self._envelope("text_completion")
            text = delta.get("content", "")
            choice = {"index": 0, "text": text, "logprobs": logprobs}
        choice["finish_reason"] = finish_reason
        body["choices"] = [choice]
        return body

    def _take_logprobs(self) -> dict | None:
        if not self.parsed.logprobs or not self._unsent_tokens:
            return None
        tokens, self._unsent_tokens = self._unsent_tokens, []
        return self._logprobs(tokens)

    def _logprobs(self, tokens: list[TokenSampled]) -> dict:
        top_n = self.parsed.top_logprobs
        if self.parsed.kind == CHAT:
            return {
                "content": [
                    {
                        "token": t.text,
                        "logprob": t.logprob,
                        "bytes": list(self.token_bytes(t.token_id)),
                        "top_logprobs": [
                            {
                                "token": a.text,
                                "logprob": a.logprob,
                                "bytes": list(self.token_bytes(a.token_id)),
                            }
                            for a in t.top[:top_n]
                        ],
                    }
                    for t in tokens
                ],
                "refusal": None,
            }
        offsets = []
        for t in tokens:
            offsets.append(self._text_offset)
            self._text_offset += len(self.token_bytes(t.token_id).decode("utf-8", "replace"))
        return {
            "tokens": [t.text for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{a.text: a.logprob for a in t.top[:top_n]} for t in tokens]
            if top_n
            else None,
            "text_offset": offsets,
        }
