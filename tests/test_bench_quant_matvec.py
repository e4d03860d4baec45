"""bench/bench_quant_matvec.py's `--against REV`: the old side must be built entirely from REV's
unpacker modules, and loading them must leave the imported ones in place."""

import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernels import quant_iq, quant_iq_avx2, quant_iq_vnni

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_quant_matvec as bench  # noqa: E402


def _has_git_history() -> bool:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", "HEAD:engine/kernels/quant_iq_avx2.py"],
        capture_output=True,
    )
    return done.returncode == 0


@pytest.mark.skipif(not _has_git_history(), reason="needs the git checkout with quant_iq_avx2.py")
def test_revision_unpackers_use_that_revisions_sibling_modules():
    old = bench.revision_unpackers("HEAD")
    # REV's quant_iq imports REV's per-ISA modules, not the ones this process imported
    assert old.quant_iq_avx2 is not quant_iq_avx2
    assert old.quant_iq_vnni is not quant_iq_vnni
    assert old.quant_iq_avx2.quant_iq is old  # and they see REV's quant_iq in turn
    # the imported modules are back where they were
    kernels = sys.modules["engine.kernels"]
    assert sys.modules["engine.kernels.quant_iq"] is quant_iq is kernels.quant_iq
    assert sys.modules["engine.kernels.quant_iq_avx2"] is quant_iq_avx2 is kernels.quant_iq_avx2
    assert sys.modules["engine.kernels.quant_iq_vnni"] is quant_iq_vnni is kernels.quant_iq_vnni
    # and REV's unpackers build a working module of every grid type
    for name in quant_iq.GRID_TYPES:
        ir = bench.revision_module_ir(old, name, "avx2", f"mm_{name}_old")
        assert f"@mm_{name}_old(" in ir


def test_unknown_revision_is_a_clear_error():
    with pytest.raises(SystemExit, match="no engine/kernels/quant_iq.py"):
        bench.revision_unpackers("0000000000000000000000000000000000000000")
