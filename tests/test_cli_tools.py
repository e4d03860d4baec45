"""`python -m engine generate --tools FILE`: the calls the model would make, printed (text and
--json), and every problem with the file or the flags a usage error (exit 2) naming --tools.
A tiny random llama with SmolLM2's tokenizer: a required call is grammar-constrained, so even
random weights make a valid one."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.__main__ import EXIT_USAGE, main

# Short calls only: random weights would fill a free string until the token budget ends.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_unit",
            "description": "Choose the temperature unit",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "toggle",
            "parameters": {
                "type": "object",
                "properties": {"on": {"type": "boolean"}},
                "required": ["on"],
                "additionalProperties": False,
            },
        },
    },
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    return str(
        write_tiny_model(tmp_path_factory.mktemp("cli-tools") / "tiny.gguf", "llama", seed=5)
    )


@pytest.fixture(scope="module")
def tools_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "tools.json"
    path.write_text(json.dumps(TOOLS))
    return str(path)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_required_call_is_printed(capsys, tiny, tools_file):
    code, out, err = run_cli(
        capsys, "generate", tiny, "weather in Paris?", "--chat", "--tools", tools_file,
        "--tool-choice", "set_unit", "--max-tokens", "120", "--seed", "1", "--sample",
    )  # fmt: skip
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("[tool call "))
    arguments = json.loads(line[line.index("(") + 1 : line.rindex(")")])
    assert line.split("] ", 1)[1].startswith("set_unit(")
    jsonschema.validate(arguments, TOOLS[0]["function"]["parameters"])
    assert "[tool_calls]" in err


def test_json_output_has_the_calls_in_openai_shape(capsys, tiny, tools_file):
    code, out, _ = run_cli(
        capsys, "generate", tiny, "hi", "--chat", "--tools", tools_file, "--tool-choice",
        "required", "--max-tokens", "120", "--json",
    )  # fmt: skip
    assert code == 0
    record = json.loads(out)
    assert record["finish_reason"] == "tool_calls"
    (call,) = record["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] in {t["function"]["name"] for t in TOOLS}
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert record["malformed_tool_calls"] == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("not json", "not valid JSON"),
        ('"a string"', "JSON list"),
        ('[{"name": "has space"}]', "tools[0].name"),
        (
            '[{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strin"}}}}]',
            "tools[0].parameters",
        ),
    ],
)
def test_a_bad_tools_file_is_a_usage_error_naming_it(capsys, tiny, tmp_path, content, problem):
    path = tmp_path / "tools.json"
    path.write_text(content)
    code, _, err = run_cli(capsys, "generate", tiny, "hi", "--chat", "--tools", path)
    assert code == EXIT_USAGE
    assert err.count("--tools") == 1 and problem in err and str(path) in err


def test_tools_flags_are_checked(capsys, tiny, tools_file, tmp_path):
    assert run_cli(capsys, "generate", tiny, "hi", "--tools", tools_file)[0] == EXIT_USAGE
    assert (
        run_cli(capsys, "generate", tiny, "hi", "--chat", "--tool-choice", "required")[0]
        == EXIT_USAGE
    )
    code, _, err = run_cli(capsys, "generate", tiny, "hi", "--chat", "--tools", tmp_path)
    assert code == EXIT_USAGE and "is a directory" in err
    code, _, err = run_cli(
        capsys, "generate", tiny, "hi", "--chat", "--tools", tools_file, "--tool-choice", "nope"
    )
    assert code == EXIT_USAGE and "tool_choice.function.name" in err
