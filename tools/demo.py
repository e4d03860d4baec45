"""Play a scripted conversation in the main window and save PNGs of its states, from the repository
root (tools/screenshot.sh runs it under Xvfb):

    python -m tools.demo OUT_DIR [--engine real|fake] [--model PATH]

With `--engine real` (default) the replies come from the real engine and the model (the embedded
default when no --model); `fake` uses the scripted test engine (tests/app_fakes.py).

Shots: 01-loading, 02-streaming, 03-chat, 04-json, 05-tokens, 06-sampling, 07-dark, 08-cancelled;
`--only explore` takes just the exploring shots: 09-versions (a reply regenerated twice, version
2 of 3 showing), 10-details-replay (its receipt and an exact replay), 11-replay-diverged (the
receipt's preset changed behind its back), 12-chat-defaults (the preset panel's chat defaults
and an implied do_sample). `--only compare` takes 15-compare (greedy vs seeded sampling side by
side, the divergence marked, the confidence shading).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

DEMO_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}
FAKE_REPLIES = [
    'Here is a small Python function:\n\n```python\ndef greet(name):\n    return f"Hello, {name}!"\n```\n\n'
    'Call it as `greet("Ada")` to get **Hello, Ada!**',
    "The capital of France is **Paris**.",
    '{"city": "Paris", "country": "France"}',
    "Once upon a time, on a rocky island far from the shore, there lived an old lighthouse keeper "
    "named Elias who had not missed a single night in forty years. " * 3,
]


def _wait(app, predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        app.processEvents()
        time.sleep(0.01)
    return True


def _settle(app, seconds: float = 0.3) -> None:
    _wait(app, lambda: False, seconds)


def _engine(kind: str):
    if kind == "fake":
        repo = Path(__file__).resolve().parent.parent
        sys.path.insert(0, str(repo))
        from tests.app_fakes import FakeEngine

        return FakeEngine(
            replies=FAKE_REPLIES,
            token_delay_s=0.06,
            load_stages=(("reading model file", 0.1), ("compiling kernels", 0.5)),
        )
    from app.engine_bridge import RealEngine

    return RealEngine()


def run_demo(
    out_dir: Path, engine_kind: str = "real", model: str | None = None, only: str = "all"
) -> int:
    from PySide6.QtWidgets import QApplication

    from app.controller import EngineController
    from app.icon import app_icon
    from app.settings import SettingsFile
    from app.store import Store
    from app.theme import apply_theme
    from app.views.main_window import MainWindow
    from app.views.sidebar import KIND_CHAT

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("LocalChat")
    app.setWindowIcon(app_icon())
    data = Path(tempfile.mkdtemp(prefix="localchat-demo-"))
    settings_file = SettingsFile(data / "settings.json")
    settings = settings_file.load()
    settings.theme = "light"
    apply_theme(app, settings.theme, settings.font_size)
    store = Store(data / "chats.sqlite3")
    controller = EngineController(_engine(engine_kind))
    window = MainWindow(controller, store, settings, settings_file)
    window.resize(1280, 800)
    window.demo_out_dir = out_dir
    window.show()

    def shot(name: str) -> None:
        _settle(app)
        path = out_dir / f"{name}.png"
        window.grab().save(str(path))
        print(path)

    def send(text: str, *, capture_streaming: str | None = None) -> None:
        window.input.setPlainText(text)
        window.send()
        if capture_streaming:
            _wait(
                app,
                lambda: (
                    window.chat_view.streaming_widget is not None
                    and len(window.chat_view.streaming_widget.text) > 25
                ),
                60,
            )
            shot(capture_streaming)
        if not _wait(app, lambda: not window.session.busy, 300):
            raise SystemExit("demo: the reply did not finish in 5 minutes")

    # 1. loading
    window.start(model)
    _wait(app, lambda: window.model_bar.progress.value() > 0 or controller.model is not None, 30)
    shot("01-loading")
    if not _wait(app, lambda: controller.model is not None, 300):
        raise SystemExit("demo: the model did not load")
    window.session.set_preset_value("max_new_tokens", 60)
    if only == "compare":
        _compare_shot(app, window, send)
        window.close()
        return 0
    if only == "explore":
        _explore_shots(app, window, send, shot)
        window.close()
        store.close()
        shutil.rmtree(data, ignore_errors=True)
        return 0

    # 2-3. a conversation with a code block, streaming and finished
    window.system_prompt.setText("You are a concise assistant.")
    send("Write a Python function that greets someone by name.", capture_streaming="02-streaming")
    send("What is the capital of France?")
    shot("03-chat")

    # 4. JSON mode with a schema
    window.session.new_conversation()
    window.json_bar.set_schema(json.dumps(DEMO_SCHEMA, indent=2), DEMO_SCHEMA)
    window.json_bar._previous_index = 0
    window.json_bar.combo.setCurrentIndex(2)
    send("Give the capital of France and its country as JSON.")
    shot("04-json")

    # 5. token inspector with a token selected
    window.tabs.setCurrentWidget(window.token_inspector)
    _settle(app)
    if window.token_inspector.tokens:
        window.token_inspector.select(min(2, len(window.token_inspector.tokens) - 1))
    shot("05-tokens")

    # 6. sampling preset: one override accepted, one refused
    window.tabs.setCurrentWidget(window.preset_panel)
    panel = window.preset_panel
    panel.table.item(panel.row_of("temperature"), 1).setText("0.7")
    if "top_p" in panel.view.values:
        panel.table.item(panel.row_of("top_p"), 1).setText("1.5")
    shot("06-sampling")

    # 7. dark theme, back on the first chat
    apply_theme(app, "dark", settings.font_size)
    conversations = store.list_conversations()
    first_chat = window.sidebar.item_for(KIND_CHAT, conversations[-1].id)
    window.sidebar.tree.setCurrentItem(first_chat)
    window.tabs.setCurrentIndex(0)
    shot("07-dark")

    # 8. a reply stopped with Esc: the partial text stays, marked cancelled
    apply_theme(app, "light", settings.font_size)
    window.json_bar.combo.setCurrentIndex(0)
    window.session.new_conversation()
    window.input.setPlainText("Tell me a long story about a lighthouse keeper.")
    window.send()
    _wait(
        app,
        lambda: (
            window.chat_view.streaming_widget is not None
            and len(window.chat_view.streaming_widget.text) > 60
        ),
        120,
    )
    window.cancel()
    _wait(app, lambda: not window.session.busy, 60)
    shot("08-cancelled")

    window.close()
    store.close()
    shutil.rmtree(data, ignore_errors=True)
    return 0


def _explore_shots(app, window, send, shot) -> None:
    def settle_until(predicate, timeout_s=300):
        if not _wait(app, predicate, timeout_s):
            raise SystemExit("demo: timed out")

    # Versions, Details and Replay with the checkpoint's own preset, no cap: the path a user
    # takes (Replay once failed on every reply made this way, issue 31).
    window.session.reset_preset()
    send("Write a haiku about the sea.")
    for _ in range(2):
        window.session.regenerate_last()
        settle_until(lambda: not window.session.busy)
    reply = window.chat_view.widgets[-1]
    reply.previous_version.click()
    shot("09-versions")

    reply = window.chat_view.widgets[-1]
    window.select_message(reply.message.id)
    dialog = window.show_details(reply.message.id)
    dialog.move(window.geometry().center() - dialog.rect().center())
    done = []
    window.session.replayFinished.connect(lambda *args: done.append(args))
    dialog.replay_button.click()
    settle_until(lambda: len(done) == 1)
    _settle(app)
    dialog.body.verticalScrollBar().setValue(0)

    def dialog_shot(name):
        _settle(app)
        path = Path(window.demo_out_dir) / f"{name}.png"
        dialog.grab().save(str(path))
        print(path)

    dialog_shot("10-details-replay")
    receipt = window.store.receipt(reply.message.id)
    receipt["preset"]["values"]["temperature"] = 1.8
    receipt["preset"]["values"]["top_p"] = 1.0
    receipt["preset"]["values"]["min_p"] = 0.0
    window.store.set_receipt(reply.message.id, receipt)
    dialog = window.show_details(reply.message.id)
    dialog.move(window.geometry().center() - dialog.rect().center())
    dialog.replay_button.click()
    settle_until(lambda: len(done) == 2)
    dialog_shot("11-replay-diverged")
    dialog.close()

    window.tabs.setCurrentWidget(window.preset_panel)
    window._on_preset_edit("temperature", "0")
    shot("12-chat-defaults")


def _compare_shot(app, window, send) -> None:
    from app.compare import ColumnSpec

    send("Hello! Who are you?")
    window.input.setPlainText("Give me three tips for learning to cook.")
    dialog = window.open_compare()
    window.input.clear()
    dialog.run.set_columns(
        [
            ColumnSpec("Greedy", {"do_sample": False, "max_new_tokens": 80}),
            ColumnSpec(
                "Temperature 0.8, seed 7",
                {"do_sample": True, "temperature": 0.8, "seed": 7, "max_new_tokens": 80},
            ),
        ]
    )
    dialog._rebuild_columns()
    dialog.resize(1240, 760)
    dialog.move(window.geometry().center() - dialog.rect().center())
    dialog.compare_button.click()
    if not _wait(app, lambda: not dialog.run.running, 300):
        raise SystemExit("demo: the comparison did not finish")
    _settle(app, 0.5)
    path = Path(window.demo_out_dir) / "15-compare.png"
    dialog.grab().save(str(path))
    print(path)
    dialog.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path, help="directory for the PNGs")
    parser.add_argument("--engine", choices=("real", "fake"), default="real")
    parser.add_argument("--model", help="GGUF model for the real engine")
    parser.add_argument("--only", choices=("all", "explore", "compare"), default="all")
    args = parser.parse_args(argv)
    return run_demo(args.out_dir, args.engine, args.model, args.only)


if __name__ == "__main__":
    sys.exit(main())
