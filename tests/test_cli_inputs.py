"""The command line against hostile or mistaken input: bytes that are not UTF-8, files that are
not regular files (a FIFO would block the open forever, /dev/zero never ends), oversized or
invalid schemas, a strict UTF-8 stdout, and Ctrl-C before the command's work has started."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.__main__ import main
from engine.input_files import MAX_SCHEMA_BYTES

ROOT = Path(__file__).resolve().parent.parent
# Long enough for a loaded machine; a FIFO open without the check blocks forever.
CHILD_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("cli") / "tiny-llama.gguf", "llama", seed=3)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_child(args: list, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m engine ARGS` with bytes arguments passed through untouched."""
    env = {**os.environ, **(env_extra or {})}
    argv = [sys.executable.encode(), b"-m", b"engine"]
    argv += [a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=CHILD_TIMEOUT_S)


# --- text that is not UTF-8 ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,name",
    [
        ([b"tokenize", "{model}", b"hi \xff"], b"TEXT"),
        ([b"generate", "{model}", b"hi \xff", b"--max-tokens", b"1"], b"PROMPT"),
        ([b"generate", "{model}", b"hi", b"--chat", b"--system", b"\xfe"], b"--system"),
        ([b"generate", "{model}", b"hi", b"--stop", b"a\xc3"], b"--stop"),
        ([b"score", "{model}", b"\xff\xfe"], b"TEXT"),
    ],
)
def test_invalid_utf8_arguments_exit_2_naming_the_argument(tiny, args, name):
    argv = [os.fsencode(str(tiny)) if a == "{model}" else a for a in args]
    result = run_child(argv)
    assert result.returncode == 2, result.stderr
    assert b"Traceback" not in result.stderr
    assert name in result.stderr and b"UTF-8" in result.stderr


def test_info_on_a_non_utf8_path_prints_with_a_strict_utf8_stdout(tmp_path, tiny):
    odd = tmp_path / os.fsdecode(b"model-\xff.gguf")
    odd.symlink_to(tiny)
    for extra in ([], [b"--json"]):
        result = run_child(
            [b"info", os.fsencode(odd), *extra], {"PYTHONIOENCODING": "utf-8:strict"}
        )
        assert result.returncode == 0, result.stderr
        assert b"Traceback" not in result.stderr
        assert b"model-\\udcff.gguf" in result.stdout  # escaped, not dropped
    assert json.loads(result.stdout)["architecture"] == "llama"


# --- files that are not regular files ------------------------------------------------------------
@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_a_fifo_as_model_is_refused_without_blocking(fifo):
    result = run_child([b"info", fifo])
    assert result.returncode == 2
    assert b"FIFO" in result.stderr and b"not a regular file" in result.stderr


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_non_regular_schema_file_is_refused_without_blocking(tiny, fifo, tmp_path, kind):
    schema = {"fifo": fifo, "device": Path("/dev/zero"), "directory": tmp_path}[kind]
    result = run_child([b"generate", tiny, b"hi", b"--json-schema", schema, b"--max-tokens", b"1"])
    assert result.returncode == 2, result.stderr
    assert b"--json-schema" in result.stderr and b"Traceback" not in result.stderr


def test_an_oversized_schema_is_refused(capsys, tiny, tmp_path):
    schema = tmp_path / "big.json"
    schema.write_text('{"description": "' + "x" * MAX_SCHEMA_BYTES + '"}')
    code, out, err = run_cli(capsys, "generate", tiny, "hi", "--json-schema", schema)
    assert code == 2 and out == ""
    assert "--json-schema" in err and "larger than the limit" in err


@pytest.mark.parametrize(
    "content,problem",
    [(None, "not found"), (b"{", "not valid JSON"), (b"\xff{}", "not UTF-8")],
)
def test_every_schema_problem_is_a_usage_error_naming_the_file_once(
    capsys, tiny, tmp_path, content, problem
):
    schema = tmp_path / "schema.json"
    if content is not None:
        schema.write_bytes(content)
    code, out, err = run_cli(capsys, "generate", tiny, "hi", "--json-schema", schema)
    assert code == 2 and out == ""
    assert problem in err and err.count(str(schema)) == 1


# --- Ctrl-C before the command's own work --------------------------------------------------------
def test_ctrl_c_while_kernels_compile_exits_130_with_one_line(tmp_path, tiny):
    # An empty cache directory makes the child compile every kernel (seconds), and it says so.
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    child = subprocess.Popen(
        [sys.executable, "-m", "engine", "score", str(tiny), "The cat"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A child inherits an ignored SIGINT (nohup, a runner without job control), and Python
        # then installs no KeyboardInterrupt handler: give it the default a terminal gives.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first_line = child.stderr.readline()
    assert "first launch" in first_line  # the compile has started
    child.send_signal(signal.SIGINT)
    out, rest = child.communicate(timeout=CHILD_TIMEOUT_S)
    assert child.returncode == 130, rest
    assert "Traceback" not in rest
    assert rest.strip().splitlines()[-1] == "interrupted"
    assert out == ""
