"""tools/bootstrap.sh (run by tools/run_app.sh on every launch) installs once and then stays off
the network: after a successful install its stamp makes later runs skip pip entirely.

The venv's python is a stand-in script that logs its arguments and, like a real pip with no
network, fails every pip command while PIP_INDEX_URL points at a closed port."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$* CMAKE_ARGS=${CMAKE_ARGS:-}" >> "$BOOTSTRAP_LOG"
if [ "${1:-}" = -m ] && [ "${2:-}" = pip ] && [ "${PIP_INDEX_URL:-}" = http://127.0.0.1:9/ ]; then
  echo "ERROR: Could not find a version that satisfies the requirement (network)" >&2
  exit 1
fi
"""


@pytest.fixture
def checkout(tmp_path):
    """A copy of the checkout's bootstrap inputs with a fake .venv/bin/python."""
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "bootstrap.sh", tmp_path / "tools" / "bootstrap.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def bootstrap(checkout: Path, *extras: str, offline: bool = False):
    log = checkout / "calls.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "BOOTSTRAP_LOG": str(log)}
    if offline:
        env["PIP_INDEX_URL"] = "http://127.0.0.1:9/"
    result = subprocess.run(
        ["bash", str(checkout / "tools" / "bootstrap.sh"), *extras],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return result, calls


def test_second_launch_runs_offline_without_pip(checkout):
    first, calls = bootstrap(checkout)
    assert first.returncode == 0, first.stderr
    assert any("pip install -q -e ." in call for call in calls)
    second, calls = bootstrap(checkout, offline=True)
    assert second.returncode == 0, second.stderr
    assert calls == []  # pip never ran, so nothing (no setuptools warning box) was printed
    assert second.stdout == "" and second.stderr == ""


def test_a_failed_install_leaves_no_stamp(checkout):
    failed, _ = bootstrap(checkout, offline=True)
    assert failed.returncode != 0
    retry, calls = bootstrap(checkout)
    assert retry.returncode == 0 and any("pip install" in call for call in calls)


def test_changed_pyproject_or_new_extras_install_again(checkout):
    assert bootstrap(checkout)[0].returncode == 0
    _, calls = bootstrap(checkout, "test")
    assert any("-e .[test]" in call for call in calls)
    assert bootstrap(checkout)[1] == []  # both stamps are kept
    assert bootstrap(checkout, "test")[1] == []
    with (checkout / "pyproject.toml").open("a") as f:
        f.write("\n# a new dependency\n")
    _, calls = bootstrap(checkout)
    assert any("pip install -q -e ." in call for call in calls)


def test_the_peer_extra_builds_llama_cpp_with_chosen_flags_never_native(checkout):
    # A native llama.cpp build on a CPU that reports AMX segfaults on these VMs; the app's own
    # set-up (no extras) must not build llama.cpp at all.
    _, calls = bootstrap(checkout)
    assert not any("-DGGML" in call for call in calls)
    _, calls = bootstrap(checkout, "test,peer")
    install = next(call for call in calls if "-e .[test,peer]" in call)
    assert "-DGGML_NATIVE=OFF" in install and "-DGGML_AMX_TILE=OFF" in install
