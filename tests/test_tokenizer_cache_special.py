"""The tokenizer's merges cache file is read only when it is a regular file (issue 31: a FIFO in
place of an app's cache file blocked start-up until a writer came)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from engine.tokenizer import spm_merges

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")


def test_a_fifo_as_the_merges_cache_is_ignored_unopened_and_replaced(tmp_path):
    path = tmp_path / "x.merges"
    os.mkfifo(path)
    outcome: dict[str, object] = {}
    reader = threading.Thread(target=lambda: outcome.update(value=spm_merges.read_cached(path)))
    reader.start()
    reader.join(60)
    if reader.is_alive():  # blocked in open(): give it a writer so the thread can end
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(60)
        pytest.fail("reading the cache blocked on a FIFO")
    assert outcome == {"value": None}
    spm_merges.write_cached(path, np.array([[3, 4], [5, 6]]))  # merges as token-id pairs
    cached = spm_merges.read_cached(path)
    assert cached is not None and cached.tolist() == [[3, 4], [5, 6]]


def test_a_device_as_the_merges_cache_is_not_read(tmp_path):
    import resource
    import subprocess
    import sys

    path = tmp_path / "x.merges"
    path.symlink_to("/dev/zero")
    code = "import sys; from engine.tokenizer import spm_merges; "
    code += "print(spm_merges.read_cached(__import__('pathlib').Path(sys.argv[1])))"

    def limit():  # a regression reads /dev/zero until MemoryError in the child, not the host
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        preexec_fn=limit,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "None"), done.stderr[-2000:]
