"""Check a JSON schema typed by the user before it is used for constrained decoding.

Parsing errors come from `json` (with line and column); everything else (nesting depth, `$ref`
cycles with no way out, what llguidance rejects) from the engine's own validator,
engine.constrained.validate_schema, which compiles the schema as JSON mode does, so a schema
accepted here is one the engine can use. Whatever goes wrong, the caller gets a message,
never an exception: the editor must never keep showing an earlier "valid"."""

from __future__ import annotations

import json

from engine.errors import ConstraintError
from engine.schema_structure import MAX_SCHEMA_DEPTH


def check_schema(text: str) -> tuple[dict | None, str | None]:
    """Returns (schema, None) when usable, else (None, a message for the user)."""
    # Imported here: engine.constrained loads numpy and llguidance, which the window must not
    # wait for at start-up (tests/test_types.py).
    from engine.constrained import validate_schema

    try:
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        if not isinstance(schema, dict):
            return (
                None,
                f"A JSON schema must be an object ({{...}}), not {type(schema).__name__}",
            )
        validate_schema(schema)
    except ConstraintError as exc:
        return None, str(exc)
    except RecursionError:
        # json.loads recurses: a document nested ~1,000 levels fails there, before the depth check.
        return None, f"The JSON schema is nested more than {MAX_SCHEMA_DEPTH} levels deep"
    except BaseException as exc:
        # llguidance is native code: a Rust panic arrives as pyo3's PanicException, which derives
        # from BaseException. Anything but a request to stop becomes a message.
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None, f"The JSON schema cannot be checked: {type(exc).__name__}: {exc}"
    return schema, None


EXAMPLE_SCHEMA = """{
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"}
  },
  "required": ["name", "age"]
}"""
