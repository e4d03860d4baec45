"""Screenshots of the model library: 13-library (a Hugging Face cache, an LM Studio folder and a
folder of the user's, with real models, an unsupported one and a broken file) and 14-download (the
Download tab against a loopback Hub mirror, mid-download). Nothing leaves the machine: the
library's "other tools" folders are a temporary home, the Hub is tests/hub_mirror.py.

    DISPLAY=:99 QT_QPA_PLATFORM=xcb .venv/bin/python -m tools.library_demo [OUT_DIR]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def _wait(app: QApplication, condition, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError("the library demo waited too long")
        app.processEvents(QEventLoop.AllEvents, 50)
        time.sleep(0.01)


def _settle(app: QApplication, ms: int = 300) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def _fake_home(home: Path) -> None:
    from engine.model_files import default_model_path, gemma3_270m_path

    hub = home / ".cache" / "huggingface" / "hub"
    for repo, name, src in (
        (
            "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
            "smollm2-135m-instruct-q4_1.gguf",
            default_model_path(),
        ),
        ("unsloth/gemma-3-270m-it-GGUF", "gemma-3-270m-Q4_K_M.gguf", gemma3_270m_path()),
    ):
        snap = hub / f"models--{repo.replace('/', '--')}" / "snapshots" / ("a" * 40)
        snap.mkdir(parents=True)
        (snap / name).symlink_to(src)
    lms = home / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF"
    lms.mkdir(parents=True)
    for name in ("tiny_qwen3", "tiny_phi3", "tiny_qwen3moe"):
        shutil.copy(FIXTURES / f"{name}.gguf", lms / f"{name}.gguf")
    mine = home / "models"
    mine.mkdir()
    for name in ("tiny_llama", "tiny_gemma2", "tiny_olmo2"):
        shutil.copy(FIXTURES / f"{name}.gguf", mine / f"{name}.gguf")
    data = (FIXTURES / "tiny_llama.gguf").read_bytes()
    alien = data.replace(b"llama", b"mamba", 1)  # an architecture the engine does not run
    (mine / "mamba-130m-Q8_0.gguf").write_bytes(alien)
    (mine / "download-interrupted.gguf").write_bytes(data[:4000])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else ROOT / "resources" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication([])
    from app.theme import apply_theme

    apply_theme(app, "light", 11)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        _fake_home(home)
        from app.library.download_runner import DownloadRunner
        from app.library.hub import HubClient
        from app.library.scan import known_model_folders
        from app.library.scan_runner import LibraryScanRunner
        from app.views.download_panel import DownloadPanel
        from app.views.library_dialog import LibraryDialog
        from tests.hub_mirror import HubMirror

        known = known_model_folders(env={}, home=home, platform="linux")
        with HubMirror() as mirror:
            content = (FIXTURES / "tiny_gemma3.gguf").read_bytes() * 40  # ~37 MB to watch
            mirror.state.repos["unsloth/Qwen3-0.6B-GGUF"] = {
                f"Qwen3-0.6B-{q}.gguf": content[: len(content) // (i + 1)]
                for i, q in enumerate(
                    ("BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")
                )
            }
            mirror.state.repos["bartowski/Qwen3-1.7B-GGUF"] = {"Qwen3-1.7B-Q4_K_M.gguf": b"GGUF"}
            mirror.state.downloads = {
                "unsloth/Qwen3-0.6B-GGUF": 98231,
                "bartowski/Qwen3-1.7B-GGUF": 40210,
            }
            env = {"HF_ENDPOINT": mirror.url, "HF_HUB_CACHE": str(home / "dl")}
            runner = DownloadRunner(client_factory=lambda: HubClient(env=env))
            scan = LibraryScanRunner(known=known)
            dialog = LibraryDialog(scan, [str(home / "models")], DownloadPanel(runner))
            dialog.resize(1180, 640)
            dialog.show()
            _wait(app, lambda: dialog.table.rowCount() > 0)
            dialog.select_path(str(home / "models" / "mamba-130m-Q8_0.gguf"))
            _settle(app)
            dialog.table.sortItems(8)
            dialog.select_path(
                next(s.path for s in dialog.summaries if "smollm2" in s.display_name)
            )
            _settle(app)
            dialog.grab().save(str(out / "13-library.png"))

            panel = dialog.download_panel
            dialog.tabs.setCurrentIndex(1)
            panel.query.setText("qwen3")
            panel.search()
            _wait(app, lambda: panel.repos.count() == 2)
            panel.repos.setCurrentRow(0)
            _wait(app, lambda: panel.table.rowCount() == 7)
            panel.select_file("Qwen3-0.6B-Q4_K_M.gguf")
            # Slow the transfer down so the shot shows it under way.
            gate = threading.Event()
            seen = [0]

            def slow(done, total):
                seen[0] = done
                if done > (total or 0) * 0.4:
                    gate.wait(30)

            runner_download = runner.client_factory

            def factory():
                client = runner_download()
                real = client.download

                def download(*a, progress=None, **k):
                    def both(done, total):
                        progress(done, total)
                        slow(done, total)

                    return real(*a, progress=both, **k)

                client.download = download  # type: ignore[method-assign]
                return client

            runner.client_factory = factory
            from huggingface_hub import constants

            constants.DOWNLOAD_CHUNK_SIZE = 256 * 1024
            import app.library.download_runner as download_runner

            download_runner.PROGRESS_INTERVAL_S = 0.0  # every chunk, so the gated one is shown
            panel.download_selected()
            _wait(app, lambda: panel.progress.value() > 300)
            _settle(app, 400)
            dialog.grab().save(str(out / "14-download.png"))
            gate.set()
            runner.stop()
            runner.wait()
            scan.wait()
    print(f"library screenshots in {out}", file=sys.stderr)
    os._exit(0)  # daemon threads of the mirror may still hold sockets; nothing left to save


if __name__ == "__main__":
    raise SystemExit(main())
