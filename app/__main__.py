"""`python -m app [MODEL.gguf]` starts the desktop app.

Other modes:
  --smoke PROMPT [--model PATH]   headless: load the model (the embedded default if none), generate
                                  a short greedy reply through the real engine on the worker
                                  thread, print it, exit 0 (non-zero with the error on stderr)
  --demo-screenshot DIR           play a scripted conversation and save PNGs of the main states
                                  (see app/demo.py and tools/screenshot.sh)
  --data-dir DIR                  keep the chats database and settings in DIR instead of the
                                  platform's user directories
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

SMOKE_MAX_TOKENS = 24


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="localchat", description="LocalChat desktop app")
    parser.add_argument("model_path", nargs="?", help="GGUF model to open")
    parser.add_argument("--model", dest="model_option", help="GGUF model to open")
    parser.add_argument(
        "--smoke", metavar="PROMPT", help="headless smoke test: print a short reply"
    )
    parser.add_argument(
        "--data-dir", type=Path, help="directory for chats.sqlite3 and settings.json"
    )
    parser.add_argument(
        "--demo-screenshot",
        type=Path,
        metavar="DIR",
        help="play a scripted conversation and save screenshots into DIR",
    )
    parser.add_argument(
        "--demo-engine",
        choices=("real", "fake"),
        default="real",
        help="engine for --demo-screenshot (fake needs the tests/ folder)",
    )
    args = parser.parse_args(argv)
    args.model = args.model_option or args.model_path
    return args


def _data_paths(data_dir: Path | None):
    from app.settings import SettingsFile
    from app.store import default_db_path

    if data_dir is None:
        return default_db_path(), SettingsFile()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # chats are private
    return data_dir / "chats.sqlite3", SettingsFile(data_dir / "settings.json")


def run_smoke(prompt: str, model: str | None) -> int:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.controller import EngineController
    from app.engine_bridge import ChatRequest, RealEngine
    from app.icon import app_icon

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setWindowIcon(app_icon())  # exercises QtSvg + image plugins in a frozen bundle
    if model is None:
        from engine.model_files import ModelNotInstalledError, default_model_path

        try:
            model = str(default_model_path())
        except ModelNotInstalledError as exc:
            print(f"smoke: {exc}", file=sys.stderr)
            return 2
    controller = EngineController(RealEngine())
    outcome = {"code": 1}
    pieces: list[str] = []

    def fail(message: str) -> None:
        print(f"smoke: {message}", file=sys.stderr)
        outcome["code"] = 1
        app.quit()

    def on_loaded(_info) -> None:
        controller.generate(
            ChatRequest(
                messages=({"role": "user", "content": prompt},),
                overrides={"do_sample": False, "max_new_tokens": SMOKE_MAX_TOKENS},
                top_logprobs=0,
            )
        )

    def on_finished(finished) -> None:
        if finished.finish_reason == "error":
            fail(finished.error or "generation failed")
            return
        text = finished.text or "".join(pieces)
        print(text)
        u = finished.usage
        print(
            f"[smoke] finish={finished.finish_reason} tokens={u.completion_tokens} "
            f"ttft_ms={u.ttft_ms:.0f} decode_tok_s={u.decode_tok_s:.1f}",
            file=sys.stderr,
        )
        outcome["code"] = 0 if text.strip() else 1
        app.quit()

    controller.modelLoaded.connect(on_loaded)
    controller.loadFailed.connect(lambda path, message: fail(f"{path}: {message}"))
    controller.replyText.connect(pieces.append)
    controller.replyFinished.connect(on_finished)
    controller.replyErrored.connect(fail)
    QTimer.singleShot(0, lambda: controller.load_model(model))
    app.exec()
    controller.shutdown()
    return outcome["code"]


def run_gui(args: argparse.Namespace) -> int:
    import qasync
    from PySide6.QtWidgets import QApplication, QMessageBox

    from app.app_data import open_app_data
    from app.controller import EngineController
    from app.engine_bridge import RealEngine
    from app.icon import app_icon
    from app.instance_lock import InstanceLock, RaiseRequests, request_raise
    from app.store import StoreError
    from app.theme import apply_theme
    from app.views.instance_dialog import (
        QUIT,
        SHOW_OTHER,
        ask_about_running_instance,
    )
    from app.views.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("LocalChat")
    app.setApplicationDisplayName("LocalChat")
    app.setDesktopFileName("localchat")
    app.setWindowIcon(app_icon())
    db_path, settings_file = _data_paths(args.data_dir)
    lock = InstanceLock(db_path.parent)
    read_only = False
    if not lock.acquire():  # another LocalChat is writing these chats
        choice = ask_about_running_instance(db_path.parent)
        if choice == SHOW_OTHER and request_raise(db_path.parent):
            return 0
        if choice == QUIT:
            return 0
        read_only = True  # chosen, or the other window did not answer
    try:
        # A damaged database, a read-only directory or broken settings do not stop the app.
        data = open_app_data(db_path, settings_file, read_only=read_only)
    except StoreError as exc:
        QMessageBox.critical(None, "LocalChat", str(exc))
        return 1
    store, settings = data.store, data.settings
    apply_theme(app, settings.theme, settings.font_size)

    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    controller = EngineController(RealEngine())
    window = MainWindow(controller, store, settings, settings_file)
    window.show_startup_notices(data.notices)
    if data.read_only:
        window.setWindowTitle("LocalChat (read-only)")
    if lock.held:
        raise_requests = RaiseRequests(db_path.parent, window)
        raise_requests.raiseRequested.connect(window.bring_forward)
    window.show()
    window.start(args.model)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    store.close()
    lock.release()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke is not None:
        return run_smoke(args.smoke, args.model)
    if args.demo_screenshot is not None:
        from app.demo import run_demo

        return run_demo(args.demo_screenshot, args.demo_engine, args.model)
    return run_gui(args)


if __name__ == "__main__":
    sys.exit(main())
