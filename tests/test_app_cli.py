"""`python -m app` argument handling: a named model that is not there, a --data-dir that is a
file, and the one line printed when a model has loaded."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox

from app.__main__ import open_requested_model
from tests.app_fakes import FakeEngine, close_window, make_window

ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT_S = 300  # a loaded, shared machine; nothing here waits on a bound this tight


def run_app(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )


def test_a_missing_model_is_reported_and_no_other_model_is_opened(
    qtbot, tmp_path, monkeypatch, capsys
):
    dialogs = []
    monkeypatch.setattr(
        QMessageBox, "critical", lambda parent, title, text, *a, **k: dialogs.append(text)
    )
    window = make_window(qtbot, tmp_path, FakeEngine())
    opened = []
    monkeypatch.setattr(window, "open_model", opened.append)
    open_requested_model(window, str(tmp_path / "typo.gguf"))
    assert opened == []  # neither the default nor the last model replaces the one asked for
    assert len(dialogs) == 1 and "typo.gguf" in dialogs[0] and "not found" in dialogs[0]
    assert "typo.gguf: file not found" in capsys.readouterr().err
    close_window(window)


def test_a_model_that_exists_is_opened(qtbot, tmp_path, monkeypatch):
    model = tmp_path / "real.gguf"
    model.write_bytes(b"GGUF")
    window = make_window(qtbot, tmp_path, FakeEngine())
    opened = []
    monkeypatch.setattr(window, "open_model", opened.append)
    open_requested_model(window, str(model))
    assert opened == [str(model)]
    close_window(window)


def test_smoke_with_a_missing_model_says_so():
    result = run_app("--smoke", "Hi", "--model", "/nonexistent/typo.gguf")
    assert result.returncode == 2
    assert "typo.gguf: file not found" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_data_dir_that_is_a_file_is_an_error_message(tmp_path, kind):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    data_dir = a_file if kind == "file" else a_file / "sub"
    result = run_app("--data-dir", str(data_dir))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"--data-dir {data_dir}" in result.stderr


def test_smoke_prints_one_load_line_with_model_architecture_quant_and_kernels(tmp_path):
    result = run_app("--smoke", "Hi", "--data-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("loaded ")]
    assert len(lines) == 1
    line = lines[0]
    assert "(llama, Q4_1)" in line  # SmolLM2-135M-Instruct.Q4_1.gguf
    assert "JIT " in line and "thread" in line
    assert "editable" not in result.stderr  # no setuptools warning box
