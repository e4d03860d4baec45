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

Usage: OpenAI's prompt_tokens, completion_tokens, total_tokens and
prompt_tokens_details.cached_tokens (prompt tokens whose KV came from the shared prefix cache),
plus `usage.timings`, our extra field:
    {"prefill_ms", "decode_ms", "ttft_ms", "prompt_tokens_per_second", "decode_tokens_per_second"}
(ttft_ms: from the moment the engine started the request to its first sampled token).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from engine.events import Finished, ReasoningDelta, TextDelta, TokenSampled, Usage
from engine.server.protocol import CHAT, ParsedRequest
from engine.types import FinishReason

OPENAI_FINISH_REASON = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.GRAMMAR_COMPLETE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.ERROR: "error",
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
        self.tokens: list[TokenSampled] = []  # every sampled token (for logprobs)
        self._unsent_tokens: list[TokenSampled] = []
        self._role_sent = False
        self._text_offset = 0  # completions logprobs: characters of text before each token

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
        if not self.parsed.stream:
            return []
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
                finish_reason=openai_finish_reason(finished.finish_reason),
            )
        ]
        if self.parsed.include_usage:
            usage_chunk = self._envelope(self.object + ".chunk")
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
            message: dict[str, Any] = {"role": "assistant", "content": finished.text}
            if finished.reasoning:
                message["reasoning_content"] = finished.reasoning
            choice["message"] = message
        else:
            choice["text"] = finished.text
        choice["logprobs"] = logprobs
        choice["finish_reason"] = openai_finish_reason(finished.finish_reason)
        body["choices"] = [choice]
        body["usage"] = usage_object(finished.usage)
        return body

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
