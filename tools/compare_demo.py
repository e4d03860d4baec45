"""Screenshot 15-compare: the compare view on the embedded SmolLM2, the chat defaults vs temperature 1.2 (same seed),
after both columns have finished (divergence outlined, both distributions shown).

    DISPLAY=:99 QT_QPA_PLATFORM=xcb .venv/bin/python -m tools.compare_demo [OUT_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parent.parent


def _wait(app, condition, timeout_s: float = 180.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError("the compare demo waited too long")
        app.processEvents(QEventLoop.AllEvents, 50)
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else ROOT / "resources" / "screenshots"
    app = QApplication.instance() or QApplication([])
    from app.controller import EngineController
    from app.engine_bridge import RealEngine
    from app.settings import SettingsFile
    from app.store import Store
    from app.theme import apply_theme
    from app.views.main_window import MainWindow
    from engine.model_files import default_model_path

    apply_theme(app, "light", 11)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "chats.sqlite3")
        settings_file = SettingsFile(Path(tmp) / "settings.json")
        controller = EngineController(RealEngine(digest_cache=Path(tmp) / "d.json"))
        window = MainWindow(controller, store, settings_file.load(), settings_file)
        window.show()
        window.open_model(str(default_model_path()))
        _wait(app, lambda: controller.model is not None)
        dialog = window.open_compare()
        dialog.prompt.setPlainText("Give me three tips for learning to cook.")
        dialog.columns[0].preset.setText("seed=1 max_new_tokens=80")  # the chat defaults
        dialog.columns[1].preset.setText("temperature=1.2 seed=1 max_new_tokens=80")
        dialog.run()
        _wait(app, lambda: not controller.comparing and dialog.run_button.isEnabled())
        app.processEvents()
        dialog.grab().save(str(out / "15-compare.png"))
        dialog.reject()
        window.close()
        store.close()
    print(f"compare screenshot in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
