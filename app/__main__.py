"""`python -m app [MODEL.gguf]` starts the desktop app.

Other modes:
  --smoke PROMPT [--model PATH]   headless: load the model (the embedded default if none), generate
                                  a short greedy reply through the real engine on the worker
                                  thread, print it, exit 0 (non-zero with the error on stderr)
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


def data_dir_problem(data_dir: Path | None) -> str | None:
    """Why --data-dir cannot hold the app's files (None when it can; it is created if missing)."""
    if data_dir is None:
        return None
    if data_dir.exists() and not data_dir.is_dir():
        return f"--data-dir {data_dir}: is a file, not a directory"
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # chats are private
    except OSError as exc:
        return f"--data-dir {data_dir}: cannot create the directory ({exc.strerror})"
    return None


def model_file_problem(model: str | None) -> str | None:
    """Why the model named on the command line cannot be opened (missing, a directory, a FIFO
    that would block the load), or None. Checked up front: a missing file must be reported,
    never quietly replaced by another model."""
    if model is None:
        return None
    from engine.errors import InputFileError
    from engine.input_files import require_regular_file

    try:
        require_regular_file(model, "model")
    except InputFileError as exc:
        return str(exc)
    return None


def open_requested_model(window, model: str | None) -> None:
    """Open the named model, or (none named) the last one or the built-in default. A named
    model that is not there gets a message on stderr and a dialog, and no model is loaded: the
    user asked for that file, so loading a different one would hide the mistake."""
    problem = model_file_problem(model)
    if problem is None:
        window.start(model)
        return
    print(f"localchat: {problem}", file=sys.stderr, flush=True)
    window.show_error(
        "Could not open the model", f"{problem}\n\nOpen a model with File > Open (Ctrl+O)."
    )


def print_load_line(info) -> None:
    """One line on stderr per loaded model: name, architecture, quant and kernel path."""
    print(info.summary or f"loaded {info.name}", file=sys.stderr, flush=True)


def run_smoke(prompt: str, model: str | None) -> int:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.controller import EngineController
    from app.engine_bridge import RealEngine
    from app.icon import app_icon
    from engine.types import FinishReason, GenerationRequest

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setWindowIcon(app_icon())  # exercises QtSvg + image plugins in a frozen bundle
    problem = model_file_problem(model)
    if problem is not None:
        print(f"smoke: {problem}", file=sys.stderr)
        return 2
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
            GenerationRequest(
                messages=({"role": "user", "content": prompt},),
                overrides={"do_sample": False, "max_new_tokens": SMOKE_MAX_TOKENS},
                top_logprobs=0,
            )
        )

    def on_finished(finished) -> None:
        if finished.finish_reason == FinishReason.ERROR:
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

    controller.modelLoaded.connect(print_load_line)
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
    controller.modelLoaded.connect(print_load_line)
    window = MainWindow(controller, store, settings, settings_file)
    window.show_startup_notices(data.notices)
    if data.read_only:
        window.setWindowTitle("LocalChat (read-only)")
    if lock.held:
        raise_requests = RaiseRequests(db_path.parent, window)
        raise_requests.raiseRequested.connect(window.bring_forward)
    window.show()
    open_requested_model(window, args.model)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    store.close()
    lock.release()
    return 0


def main(argv: list[str] | None = None) -> int:
    from app.controller import GIL_SWITCH_INTERVAL_S

    # 1 ms instead of 5: GUI-thread GIL waits stay short while the engine worker runs Python.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    args = parse_args(argv)
    problem = data_dir_problem(args.data_dir)
    if problem is not None:
        print(f"localchat: {problem}", file=sys.stderr)
        return 2
    if args.smoke is not None:
        return run_smoke(args.smoke, args.model)
    return run_gui(args)


if __name__ == "__main__":
    sys.exit(main())
