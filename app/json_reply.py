"""How a JSON-mode reply is shown: pretty-printed when it parses, with a one-line parse status."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class JsonReplyView:
    ok: bool
    markdown: str  # what the chat view renders
    status: str  # e.g. "valid JSON object" / "not valid JSON: Expecting ',' delimiter (line 2, column 5)"


def render_json_reply(text: str, *, streaming: bool = False) -> JsonReplyView:
    if streaming:
        return JsonReplyView(False, _fenced(text), "JSON: receiving…")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return JsonReplyView(
            False,
            _fenced(text),
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
        )
    kind = {dict: "object", list: "array", str: "string"}.get(type(value), "value")
    pretty = json.dumps(value, indent=2, ensure_ascii=False)
    return JsonReplyView(True, _fenced(pretty), f"valid JSON {kind}")


def _fenced(text: str) -> str:
    fence = "```"
    while fence in text:  # a reply containing ``` must not close the block early
        fence += "`"
    return f"{fence}json\n{text}\n{fence}\n"
