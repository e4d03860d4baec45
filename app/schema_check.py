"""Check a JSON schema typed by the user before it is used for constrained decoding.

Parsing errors come from `json` (with line and column); schema errors come from llguidance, the
same library the engine's JSON mode compiles schemas with, so a schema accepted here is one the
engine can use."""

from __future__ import annotations

import json

import llguidance


def check_schema(text: str) -> tuple[dict | None, str | None]:
    """Returns (schema, None) when usable, else (None, a message for the user)."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    if not isinstance(schema, dict):
        return None, f"A JSON schema must be an object ({{...}}), not {type(schema).__name__}"
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        return None, f"Invalid schema: {problem}"
    return schema, None


EXAMPLE_SCHEMA = """{
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"}
  },
  "required": ["name", "age"]
}"""
