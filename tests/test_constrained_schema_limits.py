"""JSON schemas the grammar library mishandles (issue 17): nesting past the depth limit, and `$ref`
cycles no finite value can satisfy, are refused by `validate_schema` with a typed error; recursive
schemas that can end still work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.constrained import JsonConstraint, make_json_constraint, validate_schema
from engine.errors import ConstraintError
from engine.schema_structure import MAX_SCHEMA_DEPTH
from tests.test_constrained import TinyTokenizer, run_constrained


# --- schema depth ------------------------------------------------------------------------------
def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize("as_text", [False, True], ids=["dict", "text"])
@pytest.mark.parametrize("levels", [60, 1000, 5000])
def test_a_deeply_nested_schema_is_refused_naming_the_depth_limit(levels, as_text):
    if as_text:  # written by hand: json.dumps itself recurses too deeply at these depths
        opening = '{"type": "object", "required": ["a"], "properties": {"a": '
        schema = opening * levels + '{"type": "string"}' + "}}" * levels
    else:
        schema = _nested(levels)
    with pytest.raises(ConstraintError, match=f"schema depth limit is {MAX_SCHEMA_DEPTH}"):
        validate_schema(schema)


def test_a_reasonably_nested_schema_is_accepted():
    validate_schema(_nested(MAX_SCHEMA_DEPTH // 3 - 1))  # 3 containers per level


# --- $ref cycles -------------------------------------------------------------------------------
UNSATISFIABLE = {
    "ref to itself": {"$ref": "#"},
    "two definitions in a ring": {
        "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
        "$ref": "#/$defs/A",
    },
    "allOf around itself": {"allOf": [{"$ref": "#"}]},
    "required property of itself": {
        "type": "object",
        "properties": {"x": {"$ref": "#"}},
        "required": ["x"],
    },
    "required link in a definition": {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"next": {"$ref": "#/$defs/Node"}},
                "required": ["next"],
            }
        },
        "$ref": "#/$defs/Node",
    },
    "non-empty array of itself": {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    "optional property into a ring": {
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/A"}, "y": {"type": "integer"}},
        "$defs": {"A": {"$ref": "#/$defs/A"}},
    },
}


@pytest.mark.parametrize("schema", UNSATISFIABLE.values(), ids=UNSATISFIABLE.keys())
def test_a_ref_cycle_with_no_way_out_is_refused_at_validation(schema):
    with pytest.raises(ConstraintError, match=r"\$ref cycle with no way out: '#"):
        validate_schema(schema)
    with pytest.raises(ConstraintError, match="cycle"):
        make_json_constraint(TinyTokenizer(), "schema", schema)


TREE = {
    "type": "object",
    "properties": {
        "v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
    },
    "required": ["v", "kids"],
}
SATISFIABLE = {
    "tree through an array that may be empty": TREE,
    "anyOf with a way out": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]},
    "optional self link": {
        "$defs": {"N": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/N"}}, "required": ["v"]}},
        "$ref": "#/$defs/N",
    },
    "unused broken definition": {"type": "integer", "$defs": {"A": {"$ref": "#/$defs/A"}}},
}  # fmt: skip


@pytest.mark.parametrize("schema", SATISFIABLE.values(), ids=SATISFIABLE.keys())
def test_recursive_schemas_that_can_end_are_accepted_and_usable(schema):
    validate_schema(schema)
    tok = TinyTokenizer()
    constraint = make_json_constraint(tok, "schema", schema)
    assert isinstance(constraint, JsonConstraint) and constraint.allowed_mask().any()


def test_a_recursive_tree_schema_generates_a_finite_tree():
    tok = TinyTokenizer()
    constraint = make_json_constraint(tok, "schema", TREE)
    target = tok.encode('{"v": 1, "kids": [{"v": 2, "kids": []}]}')

    def prefer_target(step):
        logits = np.zeros(tok.vocab_size, np.float32)
        logits[target[step] if step < len(target) else tok.eos_id] = 10.0
        return logits

    generated, reason = run_constrained(tok, constraint, prefer_target, max_tokens=100)
    assert reason == "grammar_complete"
    assert json.loads(tok.decode(generated)) == {"v": 1, "kids": [{"v": 2, "kids": []}]}
