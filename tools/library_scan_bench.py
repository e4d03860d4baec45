"""Time the model library's scan of 50 hard links of one GGUF file: cold (a new scanner, every
header read) and cached (a rescan of unchanged files). Medians of 5 cold runs.

    .venv/bin/python -m tools.library_scan_bench [MODEL.gguf]   (default: the embedded SmolLM2)
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from app.library.scan import LibraryScanner, ModelFolder
from engine.model_files import default_model_path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0]) if argv else default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        folder = ModelFolder(Path(tmp), "bench")
        for i in range(50):
            try:
                os.link(src, Path(tmp) / f"m{i:02}.gguf")
            except OSError:  # another filesystem
                shutil.copy(src, Path(tmp) / f"m{i:02}.gguf")
        cold = []
        for _ in range(5):
            start = time.perf_counter()
            rows = LibraryScanner().scan([folder])
            cold.append(time.perf_counter() - start)
        scanner = LibraryScanner()
        scanner.scan([folder])
        start = time.perf_counter()
        scanner.scan([folder])
        cached = time.perf_counter() - start
    print(
        f"{src.name}: {len(rows)} files, cold scan median {statistics.median(cold) * 1000:.0f} ms "
        f"(runs {', '.join(f'{c * 1000:.0f}' for c in cold)}), cached rescan {cached * 1000:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
