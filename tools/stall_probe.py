"""Measure how long the GUI event loop stalls while a reply streams at full speed.

    QT_QPA_PLATFORM=offscreen python -m tools.stall_probe [--seconds 3] [--rate TOKENS_PER_S]
    QT_QPA_PLATFORM=offscreen python -m tools.stall_probe --real 128   # the real engine instead
    QT_QPA_PLATFORM=offscreen python -m tools.stall_probe --real 16 --history 1500   # long chat
    QT_QPA_PLATFORM=offscreen python -m tools.stall_probe --seconds 0.3 --messages 200  # many turns

A flood engine on the worker thread yields TokenSampled + TextDelta pairs as fast as Python can
for `--seconds` (no model, no sleep: hundreds of times faster than a real model). A QTimer
heartbeat every HEARTBEAT_MS records the gap between its ticks; the worst gap minus the interval
is the longest time the window could not react to input. Reported separately: while streaming,
and the one-off work when the reply finishes (final markdown render, database commit).
Around send, three numbers: `send_call_ms` is the GUI thread's own work inside send() (widgets,
rows); `send_stall_ms` the heartbeat gap that contains it; `prefill_stall_ms` the worst gap after
send() returned until the first token reached the GUI, i.e. while the worker thread renders,
tokenizes and prefills the prompt (`--history N` puts ~N tokens of earlier turns in the chat so
that prefill is long). `--messages N` opens a chat of N stored messages whose replies carry
REPLY_TOKENS token records each (what a real reply stores for the token inspector), so the GUI
thread's per-Send cost of reading the chat shows in `send_stall_ms`. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from engine.events import FINISH_STOP, Finished, TextDelta, TokenSampled, TopAlternative, Usage
from engine.types import ModelInfo, ResolvedPreset

HEARTBEAT_MS = 5
REPLY_TOKENS = 150  # token records per stored reply in --messages chats (~ a short answer)


class FloodEngine:
    """Emits tokens with no delay for `seconds`; markdown-ish text so rendering is realistic."""

    def __init__(self, seconds: float, rate: float = 0.0):
        self.seconds, self.rate = seconds, rate  # rate 0: unlimited

    def load(self, path, *, n_ctx, n_threads, progress):
        return path

    def unload(self, lm):
        pass

    def describe(self, lm):
        return ModelInfo(
            path=str(lm), name="flood", architecture="none", n_ctx=1 << 20, template="none"
        )

    def resolve_preset(self, model, saved, overrides):
        return ResolvedPreset({"temperature": 0.0}, {"temperature": "default"})

    def generate(self, lm, request, cancel):
        words = [
            "The",
            " **quick**",
            " brown",
            " fox",
            " `jumps`",
            " over",
            " the",
            " lazy",
            " dog.",
            "\n\n",
        ]
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
        usage = Usage(
            1, n, None, 0.0, elapsed * 1000, 0.0, 0.0, n / max(elapsed, 1e-9), 1 + n, 1 << 20
        )
        yield Finished(FINISH_STOP, usage, text="")


def _history_turns(n_tokens: int) -> list[tuple[str, str]]:
    """Earlier (role, text) turns of roughly n_tokens tokens (~5 characters a token)."""
    sentence = (
        "The keeper climbed the spiral stairs at dusk, trimmed the wick, wound the clockwork "
        "and watched the beam sweep across the grey water towards the reef. "
    )
    turns, chars, i = [], 0, 0
    while chars < 5 * n_tokens:
        user = f"Question {i}: what happened on night {i} at the lighthouse?"
        answer = f"On night {i}: " + sentence * 3
        turns += [("user", user), ("assistant", answer)]
        chars += len(user) + len(answer)
        i += 1
    return turns


def _token_records(n: int) -> list[dict]:
    """What ReplyRecorder stores per reply: each token with its top-5 alternatives."""
    return [
        {
            "index": i,
            "token_id": 1000 + i,
            "text": " word",
            "logprob": -0.25,
            "top": [
                {"token_id": 1000 + i + k, "text": " alt", "logprob": -1.5 - k} for k in range(5)
            ],
        }
        for i in range(n)
    ]


def measure(
    seconds: float, rate: float = 0.0, real_tokens: int = 0, history: int = 0, messages: int = 0
) -> dict:
    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication

    from app.controller import GIL_SWITCH_INTERVAL_S, EngineController
    from app.settings import SettingsFile
    from app.store import Store
    from app.views.main_window import MainWindow

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # as app/__main__.py main() does
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
    if history:
        cid = store.create_conversation("stall probe history")
        for role, text in _history_turns(history):
            store.add_message(cid, role, text)
        window.session.open_conversation(cid)
    if messages:
        cid = store.create_conversation("stall probe many turns")
        records = _token_records(REPLY_TOKENS)
        for i in range(messages):
            if i % 2 == 0:
                store.add_message(cid, "user", f"Question {i // 2}: tell me about night {i // 2}.")
            else:
                text = " ".join(r["text"].strip() for r in records)
                store.add_message(
                    cid, "assistant", text, usage={"context_used": 10 * i}, tokens=records
                )
        window.session.open_conversation(cid)
    for _ in range(20):  # let the opened chat lay out before the clock starts
        app.processEvents()
        time.sleep(0.005)

    gaps: list[float] = []  # heartbeat gaps while streaming
    prefill_gaps: list[float] = []  # after send() returned, until the first token arrived
    finish_gaps: list[float] = []  # the gap that contains the finish work, and after
    done = []
    first_token: list[float] = []  # perf_counter when the first tokens reached the session
    clock = QElapsedTimer()
    heartbeat = QTimer()
    heartbeat.setInterval(HEARTBEAT_MS)

    def beat():
        gap = clock.nsecsElapsed() / 1e6
        clock.restart()
        (finish_gaps if done else gaps if first_token else prefill_gaps).append(gap)

    def on_tokens(_tokens):
        if not first_token:
            first_token.append(time.perf_counter())

    heartbeat.timeout.connect(beat)
    window.session.replyTokens.connect(on_tokens)
    window.session.replyFinished.connect(done.append)
    window.input.setPlainText(
        "Tell me a long story about a lighthouse keeper." if real_tokens else "flood"
    )
    clock.start()
    heartbeat.start()
    started = time.perf_counter()
    window.send()
    send_call = time.perf_counter() - started
    while not done or len(finish_gaps) < 2:
        app.processEvents()
        time.sleep(0.0005)  # idle like a real event loop would, instead of spinning
    elapsed = time.perf_counter() - started
    heartbeat.stop()
    # The tick that contains send() (widgets created, rows inserted) is the first one after it.
    send_gap = (prefill_gaps or gaps).pop(0)
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
        "prompt_tokens": done[0].usage.get("prompt_tokens"),
        "ttft_ms": round((first_token[0] - started) * 1000) if first_token else None,
        "send_call_ms": round(send_call * 1000, 1),
        "send_stall_ms": round(send_gap - HEARTBEAT_MS, 1),
        "prefill_stall_ms": round(max(prefill_gaps) - HEARTBEAT_MS, 1) if prefill_gaps else None,
        "prefill_heartbeats": len(prefill_gaps),
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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--rate", type=float, default=0.0, help="tokens per second (default 0: as fast as possible)"
    )
    parser.add_argument(
        "--real",
        type=int,
        default=0,
        metavar="N",
        help="instead of the flood: N tokens from the real engine + default model",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        metavar="TOKENS",
        help="earlier turns of about TOKENS tokens in the chat (a long prefill)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=0,
        metavar="N",
        help=f"open a chat of N stored messages (replies with {REPLY_TOKENS} token records each)",
    )
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.seconds, args.rate, args.real, args.history, args.messages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
