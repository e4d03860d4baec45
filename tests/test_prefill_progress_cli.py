"""`python -m engine generate`'s prompt-reading line: \\r-updated on a terminal (a pty here),
erased before the answer, absent when stderr is not a terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys

from engine.__main__ import ProgressLine
from engine.events import PrefillProgress

FIRST = PrefillProgress(256, 3800, 0, 3.0, 85.3, 120.4)
SECOND = PrefillProgress(512, 3800, 0, 6.0, 85.3, 100.0)
FIRST_TEXT = "Reading prompt 256 / 3,800 tokens · 85 tok/s · ~2 min left"
SECOND_TEXT = "Reading prompt 512 / 3,800 tokens · 85 tok/s · ~1 min 40 s left"


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other end of the pty is closed
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode("utf-8")


def test_on_a_terminal_the_line_is_rewritten_in_place_then_erased():
    master, slave = pty.openpty()
    with os.fdopen(slave, "w", encoding="utf-8") as stream:
        line = ProgressLine(stream)
        line.show(SECOND)  # the longer text first: the shorter one must blank its tail
        line.show(FIRST)
        line.clear()
    written = _read_all(master)
    os.close(master)
    pad = " " * (len(SECOND_TEXT) - len(FIRST_TEXT))
    blank = " " * len(FIRST_TEXT)
    assert written == f"\r{SECOND_TEXT}\r{FIRST_TEXT}{pad}\r{blank}\r"


def test_not_a_terminal_gets_nothing():
    stream = io.StringIO()
    line = ProgressLine(stream)
    line.show(FIRST)
    line.clear()
    assert stream.getvalue() == ""


def test_generate_shows_the_line_on_a_tty_and_not_in_a_pipe(smollm2_path):
    """End to end on a real small model: a ~700-token prompt is read in three chunks."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 70
    command = [
        sys.executable,
        "-m",
        "engine",
        "generate",
        str(smollm2_path),
        prompt,
        "--greedy",
        "--max-tokens",
        "3",
    ]
    master, slave = pty.openpty()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=slave, timeout=300)
    os.close(slave)
    on_tty = _read_all(master)
    os.close(master)
    assert done.returncode == 0, on_tty
    assert "\rReading prompt 0 / " in on_tty and "tok/s" in on_tty
    last = on_tty.rindex("Reading prompt")
    erased = re.search(r"\r +\r", on_tty[last:])  # the line blanked before anything else
    assert erased is not None
    assert on_tty.index("[length]", last) >= last + erased.end()
    assert b"Reading prompt" not in done.stdout

    piped = subprocess.run(command, capture_output=True, timeout=300)
    assert piped.returncode == 0
    assert b"Reading prompt" not in piped.stderr and b"\r" not in piped.stderr
