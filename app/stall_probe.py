"""Measure how long the GUI event loop stalls while a reply streams at full speed.

    QT_QPA_PLATFORM=offscreen python -m app.stall_probe [--seconds 3] [--rate TOKENS_PER_S]
    QT_QPA_PLATFORM=offscreen python -m app.stall_probe --real 128   # the real engine instead

A flood engine on the worker thread yields TokenSampled + TextDelta pairs as fast as Python can
for `--seconds` (no model, no sleep: hundreds of times faster than a real model). A QTimer
heartbeat every HEARTBEAT_MS records the gap between its ticks; the worst gap minus the interval
is the longest time the window could not react to input. Reported separately: while streaming,
and the one-off work when the reply finishes (final markdown render, database commit).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from app.engine_bridge import ModelInfo, PresetView
from engine.events import FINISH_STOP, Finished, TextDelta, TokenSampled, TopAlternative, Usage

HEARTBEAT_MS = 5


class FloodEngine:
    """Emits tokens with no delay for `seconds`; markdown-ish text so rendering is realistic."""

    def __init__(self, seconds: float, rate: float = 0.0):
        self.seconds, self.rate = seconds, rate  # rate 0: unlimited

    def load(self, path, *, n_ctx, n_threads, progress):
        return path

    def unload(self, lm):
        pass

    def describe(self, lm):
        return ModelInfo(path=str(lm), name="flood", architecture="none", n_ctx=1 << 20, template="none")

    def resolve_preset(self, lm, saved, overrides):
        return PresetView({"temperature": 0.0}, {"temperature": "default"})

    def generate(self, lm, request, cancel):
        words = ["The", " **quick**", " brown", " fox", " `jumps`", " over", " the", " lazy", " dog.", "\n\n"]
        start = time.perf_counter()
        deadline = start + self.seconds
        n = 0
        i = 0
        while not cancel.cancelled:
            i += 1
            if i % 256 == 0 and time.perf_counter() > deadline:
                break
            piece = words[i % len(words)]
            yield TokenSampled(i, i, piece, -0.1, (TopAlternative(i, piece, -0.1),))
            yield TextDelta(piece)
            n += 1
            if self.rate:
                lag = start + n / self.rate - time.perf_counter()
                if lag > 0:
                    time.sleep(lag)
        elapsed = time.perf_counter() - start
        usage = Usage(1, n, None, 0.0, elapsed * 1000, 0.0, 0.0, n / max(elapsed, 1e-9), 1 + n, 1 << 20)
        yield Finished(FINISH_STOP, usage, text="")


def measure(seconds: float, rate: float = 0.0, real_tokens: int = 0) -> dict:
    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication

    from app.controller import EngineController
    from app.settings import SettingsFile
    from app.store import Store
    from app.views.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    data = Path(tempfile.mkdtemp(prefix="localchat-stall-"))
    store = Store(data / "chats.sqlite3")
    settings_file = SettingsFile(data / "settings.json")
    if real_tokens:
        from app.engine_bridge import RealEngine
        from engine.model_files import default_model_path

        controller = EngineController(RealEngine())
        model = str(default_model_path())
    else:
        controller = EngineController(FloodEngine(seconds, rate))
        model = "flood"
    window = MainWindow(controller, store, settings_file.load(), settings_file)
    window.show()
    loaded = []
    controller.modelLoaded.connect(loaded.append)
    controller.load_model(model)
    while not loaded:
        app.processEvents()
        time.sleep(0.001)
    if real_tokens:
        window.session.set_preset_value("max_new_tokens", real_tokens)

    gaps: list[float] = []  # heartbeat gaps while streaming
    finish_gaps: list[float] = []  # the gap that contains the finish work, and after
    done = []
    clock = QElapsedTimer()
    heartbeat = QTimer()
    heartbeat.setInterval(HEARTBEAT_MS)

    def beat():
        (finish_gaps if done else gaps).append(clock.nsecsElapsed() / 1e6)
        clock.restart()

    heartbeat.timeout.connect(beat)
    window.session.replyFinished.connect(done.append)
    started = time.perf_counter()
    clock.start()
    heartbeat.start()
    window.input.setPlainText("Tell me a long story about a lighthouse keeper." if real_tokens else "flood")
    window.send()
    while not done or len(finish_gaps) < 2:
        app.processEvents()
        time.sleep(0.0005)  # idle like a real event loop would, instead of spinning
    elapsed = time.perf_counter() - started
    heartbeat.stop()
    send_gap = gaps.pop(0)  # the tick that contains send(): widgets created, rows inserted
    gaps.sort()
    n_tokens = done[0].usage["completion_tokens"]
    result = {
        "engine": "real SmolLM2" if real_tokens else "flood",
        "rate_limit_tok_s": None if real_tokens else (rate or "unlimited"),
        "tokens": n_tokens,
        "seconds": round(elapsed, 3),
        "tokens_per_s": round(n_tokens / elapsed),
        "frames_drawn": window.chat_view.frames_drawn,
        "heartbeats": len(gaps),
        "send_stall_ms": round(send_gap - HEARTBEAT_MS, 1),
        "max_stall_streaming_ms": round(max(gaps) - HEARTBEAT_MS, 1) if gaps else None,
        "p99_gap_streaming_ms": round(gaps[int(len(gaps) * 0.99)], 1) if gaps else None,
        "finish_stall_ms": round(max(finish_gaps) - HEARTBEAT_MS, 1),
        "reply_chars": len(window.chat_view.widgets[-1].text),
    }
    window.close()
    store.close()
    shutil.rmtree(data, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="tokens per second (default 0: as fast as possible)")
    parser.add_argument("--real", type=int, default=0, metavar="N",
                        help="instead of the flood: N tokens from the real engine + default model")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.seconds, args.rate, args.real)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
