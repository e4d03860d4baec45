"""The JIT cache's key and entries when they are damaged or special files (issue 31): a FIFO as
the key or an entry hung start-up, and a damaged key disabled the cache for good (a full compile,
31 s, on every launch). A damaged key is rewritten, and a FIFO is never opened for reading.

Each launch runs in a child process with a timeout, so a launch that blocks on a FIFO fails the
test instead of hanging pytest.
"""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys

import pytest

from tests.test_kernels_compiler import _LOAD_IN_CHILD, ADD_ONE

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")


def _limits() -> None:  # in the child: a regression reading /dev/zero fails, not the machine
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def launch(cache_dir) -> dict:
    """compiled/loaded counts and add_one(41) of a fresh process's kernel library."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_IN_CHILD, str(cache_dir), ADD_ONE],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            preexec_fn=_limits,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the launch blocked (killed after 120 s)")
    assert done.returncode == 0, f"child exited with {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


COMPILED = {"compiled": 1, "loaded": 0, "result": 42}
LOADED = {"compiled": 0, "loaded": 1, "result": 42}


@pytest.mark.parametrize(
    "damage",
    ["truncated", "empty", "too_long", "fifo", "dev_zero_link"],
)
def test_a_damaged_key_is_rewritten_and_the_cache_works_again(tmp_path, damage):
    cache = tmp_path / "jit"
    key = tmp_path / "jit.key"
    assert launch(cache) == COMPILED
    assert launch(cache) == LOADED
    old = key.read_bytes()
    key.unlink()
    if damage == "truncated":
        key.write_bytes(old[:5])
    elif damage == "empty":
        key.write_bytes(b"")
    elif damage == "too_long":
        key.write_bytes(old + b"\n")
    elif damage == "fifo":
        os.mkfifo(key)
    else:
        key.symlink_to("/dev/zero")

    assert launch(cache) == COMPILED  # the old entries were signed with the old key
    assert stat.S_ISREG(key.lstat().st_mode)
    new = key.read_bytes()
    assert len(new) == 32 and new != old
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert launch(cache) == LOADED  # the cache works again


def test_a_fifo_as_a_cache_entry_is_not_read_and_is_replaced(tmp_path):
    cache = tmp_path / "jit"
    assert launch(cache) == COMPILED
    (entry,) = cache.glob("add-*")
    entry.unlink()
    os.mkfifo(entry)
    assert launch(cache) == COMPILED
    assert stat.S_ISREG(entry.lstat().st_mode)
    assert launch(cache) == LOADED


def test_a_directory_as_the_key_is_left_alone_and_kernels_compile_in_memory(tmp_path):
    cache = tmp_path / "jit"
    key = tmp_path / "jit.key"
    key.mkdir()
    (key / "keep").write_text("not ours to delete")
    assert launch(cache) == COMPILED
    assert launch(cache) == COMPILED  # no key, no cache, but no failure
    assert (key / "keep").read_text() == "not ours to delete"
    assert list(cache.glob("add-*")) == []
