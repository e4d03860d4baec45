"""JSON schemas that broke the schema editor (issue 17): nested ~1,000 levels (RecursionError, the
editor kept showing "valid") and `$ref` cycles (accepted, then failing at the first token)."""

import json

import pytest
from PySide6.QtWidgets import QDialogButtonBox

from app.schema_check import check_schema
from app.views.json_mode_bar import SchemaDialog
from engine.schema_structure import MAX_SCHEMA_DEPTH

GOOD = '{"type": "object", "properties": {"a": {"type": "integer"}}}'


def nested_schema(levels: int) -> str:
    return '{"type": "object", "properties": {"a": ' * levels + "{}" + "}}" * levels


CYCLES = [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}},
]


@pytest.mark.parametrize("cycle", CYCLES)
def test_unguarded_ref_cycles_are_refused_with_a_message(cycle):
    schema, problem = check_schema(json.dumps(cycle))
    assert schema is None and "$ref cycle" in problem


def test_recursive_schema_through_properties_is_allowed():
    linked_list = {
        "type": "object",
        "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}},
        "required": ["value"],
    }
    assert check_schema(json.dumps(linked_list)) == (linked_list, None)


def test_deeply_nested_schema_is_refused_with_a_message():
    schema, problem = check_schema(nested_schema(1000))
    assert schema is None and f"more than {MAX_SCHEMA_DEPTH} levels" in problem
    schema, problem = check_schema(nested_schema(60))  # 121 containers: parses, then refused
    assert schema is None and f"more than {MAX_SCHEMA_DEPTH} levels" in problem


def test_editor_clears_valid_for_a_deep_schema_and_a_ref_cycle(qtbot):
    dialog = SchemaDialog(GOOD)
    qtbot.addWidget(dialog)
    ok = dialog.buttons.button(QDialogButtonBox.Ok)
    assert ok.isEnabled() and dialog.status.text() == "✔ valid schema"
    for text in (nested_schema(1000), json.dumps(CYCLES[1])):
        dialog.editor.setPlainText(text)
        assert dialog.schema is None and not ok.isEnabled()
        assert dialog.status.text().startswith("✖ ")
        dialog.editor.setPlainText(GOOD)
        assert ok.isEnabled()
