"""Screenshot of a chat with a remote OpenAI-compatible server, for the README.

    .venv/bin/python -m tools.remote_demo resources/screenshots/16-remote-chat.png

Starts llama-cpp-python's server (pip install "llama-cpp-python[server]") on a free loopback
port serving the embedded SmolLM2 as model "smollm2", opens the main window on a throw-away data
directory, adds the connection, picks the server's model from the Remote menu, asks a question,
waits for the streamed reply and saves the window. Run it under Xvfb with QT_QPA_PLATFORM=xcb
(tools/screenshot.sh shows how) or with QT_QPA_PLATFORM=offscreen.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

QUESTION = "What are three good names for a black cat?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(model: Path, port: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--model_alias", "smollm2"]
    command += ["--n_ctx", "2048", "--verbose", "False"]
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server did not start: {log.read_text()[-2000:]}")


def _wait(app, predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app.processEvents()
        if predicate():
            return True
        time.sleep(0.01)
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "resources/screenshots/16-remote-chat.png")
    from PySide6.QtWidgets import QApplication

    from app.controller import EngineController
    from app.engine_bridge import RealEngine
    from app.settings import SettingsFile
    from app.store import Store
    from app.theme import apply_theme
    from app.views.main_window import MainWindow
    from engine.model_files import default_model_path

    app = QApplication.instance() or QApplication(sys.argv[:1])
    data = Path(tempfile.mkdtemp(prefix="localchat-remote-demo-"))
    port = _free_port()
    server = _start_server(default_model_path(), port, data / "server.log")
    try:
        settings_file = SettingsFile(data / "settings.json")
        settings = settings_file.load()
        settings.connections = [
            {
                "id": "gpubox",
                "name": "GPU box",
                "base_url": f"http://127.0.0.1:{port}/v1",
                "timeout_s": 60,
            }
        ]
        apply_theme(app, "light", 11)
        window = MainWindow(
            EngineController(RealEngine()), Store(data / "chats.sqlite3"), settings, settings_file
        )
        window.resize(1280, 800)
        window.show()
        if not _wait(app, lambda: bool(window.model_bar.remote_paths()), 60):
            raise SystemExit("the Remote menu stayed empty")
        window.open_model(window.model_bar.remote_paths()[0])
        if not _wait(app, lambda: window.backends.kind == "remote", 60):
            raise SystemExit("the remote model did not open")
        window.session.set_preset_value("temperature", 0.7)
        window.session.set_preset_value("seed", 42)
        window.session.set_preset_value("max_new_tokens", 120)
        done: list = []
        window.session.replyFinished.connect(done.append)
        window.input.setPlainText(QUESTION)
        window.send()
        if not _wait(app, lambda: bool(done), 180):
            raise SystemExit("no reply")
        window.tabs.setCurrentWidget(window.token_inspector)
        window.token_inspector.select(0)
        _wait(app, lambda: False, 0.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        window.grab().save(str(out))
        print(f"saved {out}")
        window.close()
        window.store.close()
    finally:
        server.terminate()
        server.wait(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
