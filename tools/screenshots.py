"""Screenshots of the window's layout at two screen sizes, both themes and two font sizes, with a
cancelled, a failed, a tool-calling (its answer with a long code line) and a JSON reply in one
chat (issue 31), from the repository root:

    python -m tools.screenshots [OUT_DIR] [--sizes 1280x800,1920x1080] [--themes light,dark]
                                [--fonts 10,16] [--no-compress]

Each screen size gets its own X server (Xvfb, which must be installed: see tools/screenshot.sh)
and each shot its own process running the real window (xcb platform) over the scripted engine of
tests/app_fakes.py, so the replies and the timing are the same every run. A chat taller than the
view is taken a view at a time, top to bottom (-1, -2, ...). The PNGs are reduced to 256 colours
and recompressed (ImageMagick `convert`, `optipng` when present) to keep the repository small.

Files: OUT_DIR/layout-<W>x<H>-<theme>-<N>pt[-1|-2|...].png (default OUT_DIR:
resources/screenshots).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_PATH = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # a name only: the engine is scripted
STORY = (
    "The story of a lighthouse keeper is a tale of resilience, sacrifice, and the quiet work of "
    "keeping a light burning for ships that never learn your name."
)
OVERFLOW = (
    "The prompt does not fit: 4,180 prompt tokens + max_tokens 256 > context 4,096. Shorten the "
    "chat, start a new one, or raise the context size in Settings."
)
JSON_ANSWER = json.dumps(
    {
        "city": "Paris",
        "country": "France",
        "population": 2102650,
        "source": "https://www.insee.fr/fr/statistiques/zones/2011101?geo=COM-75056&debut=0",
    }
)
# Prose and a code block with a line too long for the card: the prose wraps, the block scrolls
# sideways by itself.
ANSWER = (
    "6 × 7 = **42**. To check it yourself, paste this line into Python; it prints the product "
    "and every step of the multiplication written out as repeated addition:\n\n```python\n"
    "print(6 * 7, ' + '.join(['6'] * 7), sum([6] * 7), all(6 * n == sum([6] * n) "
    "for n in range(1, 8)))  # 42 6 + 6 + 6 + 6 + 6 + 6 + 6 42 True\n```"
)
NOTICE = (
    "Opened read-only: another LocalChat window uses this data directory, so nothing you do "
    "here is saved."
)


def _wait(app, predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("screenshots: timed out waiting for the window")
        app.processEvents()
        time.sleep(0.01)


def _settle(app, seconds: float = 0.4) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)


def take(out_dir: Path, width: int, height: int, theme: str, font_size: int) -> list[Path]:
    """One window, one chat, its screenshots (runs under an X server: DISPLAY set, xcb)."""
    sys.path.insert(0, str(ROOT))
    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QCursor
    from PySide6.QtWidgets import QApplication

    from app.controller import EngineController
    from app.settings import SettingsFile
    from app.store import Store
    from app.theme import apply_theme
    from app.tool_registry import builtin_key
    from app.views.main_window import MainWindow
    from engine.errors import ContextOverflowError
    from tests.app_fakes import FakeEngine, ToolCallReply

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("LocalChat")
    apply_theme(app, theme, font_size)
    data = Path(tempfile.mkdtemp(prefix="localchat-shots-"))
    settings_file = SettingsFile(data / "settings.json")
    settings = settings_file.load()
    settings.theme, settings.font_size = theme, font_size
    engine = FakeEngine(
        replies=[
            STORY,
            "(not sent: this request fails)",
            ToolCallReply(calls=(("calculator", {"expression": "6*7"}),)),
            ANSWER,
            JSON_ANSWER,
        ],
        pause_after=12,
    )
    store = Store(data / "chats.sqlite3")
    window = MainWindow(EngineController(engine), store, settings, settings_file)
    window.show_error = lambda title, message: None  # the failed reply is in the chat itself
    window.move(0, 0)
    window.resize(width, height)
    window.show()
    window.open_model(MODEL_PATH)
    _wait(app, lambda: window.controller.model is not None)

    def send(text: str) -> None:
        window.input.setPlainText(text)
        window.send()
        _wait(app, lambda: not window.session.busy)

    window.input.setPlainText("Tell me a long story about a lighthouse keeper.")
    window.send()
    _wait(app, lambda: len(engine.requests) == 1 and window.chat_view.streaming_widget is not None)
    _wait(app, lambda: len(window.chat_view.streaming_widget.text.split()) >= 12)
    window.cancel()
    engine.gate.set()
    _wait(app, lambda: not window.session.busy)
    engine.fail_generate_with = ContextOverflowError(OVERFLOW)
    send("Now tell it again, with every detail of the lighthouse.")
    engine.fail_generate_with = None
    window.session.set_tool_enabled(builtin_key("calculator"), True)
    send("What is 6*7?")
    _wait(app, lambda: len(engine.requests) == 4 and not window.session.busy)
    window.json_bar.combo.setCurrentIndex(1)  # any JSON object
    send("Paris as JSON: city, country, population and a source.")
    window.notice_banner.show_notice("startup-0", NOTICE)
    window.tabs.setCurrentWidget(window.tools_panel)  # the MCP form at this font size
    _settle(app)

    stem = f"layout-{width}x{height}-{theme}-{font_size}pt"
    # The pointer off the chat (a real hover would show one card's buttons by chance); the
    # last reply shows its buttons as under the pointer, on purpose.
    QCursor.setPos(window.mapToGlobal(QPoint(0, 0)))
    window.chat_view.widgets[-1].show_hover_actions(True)
    bar = window.chat_view.verticalScrollBar()
    # The whole chat, a view at a time (a little overlap), top to bottom.
    step = max(1, window.chat_view.viewport().height() - 40)
    positions = list(range(0, bar.maximum(), step)) + [bar.maximum()]
    paths = []
    for number, position in enumerate(positions, 1):
        bar.setValue(position)
        _settle(app)
        suffix = f"-{number}" if len(positions) > 1 else ""
        path = out_dir / f"{stem}{suffix}.png"
        window.grab().save(str(path))
        paths.append(path)
        print(path, flush=True)
    window.close()
    store.close()
    shutil.rmtree(data, ignore_errors=True)
    return paths


def compress(path: Path) -> None:
    """256 colours, no metadata: a tenth of the size, text still crisp."""
    if shutil.which("convert"):
        subprocess.run(
            ["convert", str(path), "-strip", "-dither", "None", "-colors", "256", str(path)],
            check=True,
        )
    if shutil.which("optipng"):
        subprocess.run(["optipng", "-quiet", "-o2", str(path)], check=True)


def _free_display() -> str:
    for number in range(90, 200):
        if (
            not Path(f"/tmp/.X11-unix/X{number}").exists()
            and not Path(f"/tmp/.X{number}-lock").exists()
        ):
            return f":{number}"
    raise SystemExit("screenshots: no free X display number")


def run_all(out_dir: Path, sizes, themes, fonts, do_compress: bool) -> int:
    if not shutil.which("Xvfb"):
        raise SystemExit("screenshots: Xvfb is not installed (see tools/screenshot.sh)")
    out_dir.mkdir(parents=True, exist_ok=True)
    for width, height in sizes:
        display = _free_display()
        xvfb = subprocess.Popen(
            ["Xvfb", display, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            socket = Path(f"/tmp/.X11-unix/X{display[1:]}")
            deadline = time.monotonic() + 10
            while not socket.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb")
            for theme in themes:
                for font in fonts:
                    args = [str(out_dir), f"--one={width}x{height},{theme},{font}"]
                    result = subprocess.run(
                        [sys.executable, "-m", "tools.screenshots", *args],
                        cwd=ROOT,
                        env=env,
                        capture_output=True,
                        text=True,
                    )
                    if result.returncode != 0:
                        sys.stderr.write(result.stderr)
                        return result.returncode
                    for line in result.stdout.splitlines():
                        if do_compress:
                            compress(Path(line))
                        print(line)
        finally:
            xvfb.terminate()
            xvfb.wait()
    return 0


def _sizes(text: str) -> list[tuple[int, int]]:
    """ "1280x800,1920x1080" -> [(1280, 800), (1920, 1080)]"""
    sizes = []
    for part in text.split(","):
        width, height = part.lower().split("x")
        sizes.append((int(width), int(height)))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", nargs="?", type=Path, default=ROOT / "resources/screenshots")
    parser.add_argument("--sizes", default="1280x800,1920x1080")
    parser.add_argument("--themes", default="light,dark")
    parser.add_argument("--fonts", default="10,16")
    parser.add_argument("--no-compress", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # WxH,theme,font: one window, here
    args = parser.parse_args(argv)
    if args.one:
        size, theme, font = args.one.split(",")
        ((width, height),) = _sizes(size)
        take(args.out_dir, width, height, theme, int(font))
        return 0
    return run_all(
        args.out_dir,
        _sizes(args.sizes),
        args.themes.split(","),
        [int(f) for f in args.fonts.split(",")],
        not args.no_compress,
    )


if __name__ == "__main__":
    sys.exit(main())
