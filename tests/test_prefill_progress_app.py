"""Prefill progress in the window: its wording, the chat's status line (fake engine through the
real worker, controller, router and session), a compare column, and the Serve status line's
source (the batch scheduler on a scripted fake model). No real model is loaded."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from fake_model import BOS, batched_fake_lm, ids, script_tokens, use_fake_detokenizer

from app.compare import ColumnSpec, ColumnState
from app.features.prefill_progress import describe_progress
from app.worker import EventBatch
from engine.batching import BatchScheduler
from engine.cancel import CancelToken
from engine.events import Finished, PrefillProgress
from engine.prefill_progress import format_time_left
from engine.types import GenerationRequest
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window

READING = PrefillProgress(done=1024, total=3800, cached=0, elapsed_s=12.0, tok_s=85.3, eta_s=33.4)


# --- wording -------------------------------------------------------------------------------------
def test_the_status_words():
    assert (
        describe_progress(READING) == "Reading prompt 1,024 / 3,800 tokens · 85 tok/s · ~33 s left"
    )


def test_before_the_first_chunk_there_is_no_speed_or_time_yet():
    start = PrefillProgress(done=0, total=3800, cached=0, elapsed_s=0.0, tok_s=None, eta_s=None)
    assert describe_progress(start) == "Reading prompt 0 / 3,800 tokens"


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(0.4, "~0 s"), (59.4, "~59 s"), (60, "~1 min"), (125, "~2 min 5 s"), (3780, "~1 h 3 min")],
)
def test_time_left_in_words(seconds, words):
    assert format_time_left(seconds) == words


# --- the event path ------------------------------------------------------------------------------
def test_a_drain_keeps_the_newest_progress_only():
    batch = EventBatch(1)
    first = PrefillProgress(256, 3800, 0, 1.0, 256.0, 14.0)
    assert batch.add(first) and batch.add(READING)
    assert batch.progress is READING


@dataclass
class PrefillingEngine(FakeEngine):
    """Yields `progress`, waits at `hold` (the prompt is "being read" until the test releases it),
    yields `after`, then streams its reply (FakeEngine: pause_after / gate hold it mid-reply)."""

    progress: list = field(default_factory=list)
    after: list = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)

    def _stream(self, lm, request, reply, cancel):
        yield from self.progress
        self.hold.wait(WAIT_MS / 1000)
        yield from self.after
        yield from super()._stream(lm, request, reply, cancel)


def test_the_chat_status_line_shows_the_prompt_being_read(qtbot, tmp_path):
    engine = PrefillingEngine(progress=[READING])
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.input.setPlainText("Summarise this long text")
        window.send()
        label = window.state_label
        qtbot.waitUntil(lambda: label.text().startswith("Reading prompt"), timeout=WAIT_MS)
        assert label.text() == "Reading prompt 1,024 / 3,800 tokens · 85 tok/s · ~33 s left"
        assert "3,800-token prompt" in label.toolTip()
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            engine.hold.set()
        assert not label.text().startswith("Reading prompt")
    finally:
        close_window(window)


def test_the_status_line_goes_back_to_generating_once_the_prompt_is_read(qtbot, tmp_path):
    done = PrefillProgress(3800, 3800, 0, 45.0, 84.4, 0.0)
    engine = PrefillingEngine(progress=[READING], after=[done], pause_after=1)
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.input.setPlainText("Summarise this long text")
        window.send()
        label = window.state_label
        qtbot.waitUntil(lambda: label.text().startswith("Reading prompt"), timeout=WAIT_MS)
        engine.hold.set()  # the prompt is read; the reply streams and pauses after a token
        qtbot.waitUntil(lambda: window.chat_view.streaming_widget is not None, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: label.text() == "Generating… (Esc to stop)", timeout=WAIT_MS)
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            engine.gate.set()
    finally:
        close_window(window)


def test_stop_while_the_prompt_is_read_clears_the_status_line(qtbot, tmp_path):
    engine = PrefillingEngine(progress=[READING])
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.input.setPlainText("Summarise this long text")
        window.send()
        qtbot.waitUntil(
            lambda: window.state_label.text().startswith("Reading prompt"), timeout=WAIT_MS
        )
        with qtbot.waitSignal(window.session.busyChanged, timeout=WAIT_MS):
            window.cancel()
            engine.hold.set()
        assert not window.state_label.text().startswith("Reading prompt")
    finally:
        close_window(window)


# --- a compare column ----------------------------------------------------------------------------
def test_a_compare_column_shows_its_prompt_being_read(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        dialog = window.open_compare()
        column = ColumnState(ColumnSpec("A"), request_id=7, prefill=READING)
        read = ColumnState(
            ColumnSpec("A"), request_id=8, prefill=PrefillProgress(3800, 3800, 0, 45.0, 84.4, 0.0)
        )
        dialog.run.columns = [column, read]
        assert dialog._usage_text(0, column) == (
            "Reading prompt 1,024 / 3,800 tokens · 85 tok/s · ~33 s left"
        )
        assert "Reading prompt" not in dialog._usage_text(1, read)
        dialog.close()
    finally:
        close_window(window)


# --- the Serve status line's source --------------------------------------------------------------
def test_the_scheduler_reports_each_running_prefill(monkeypatch):
    use_fake_detokenizer(monkeypatch)
    prompt = [BOS] + ids("a") * 600  # 601 tokens: the loop reads chunks of 256, 256, 89
    lm = batched_fake_lm(script_tokens(len(prompt), ids("b")), n_ctx=1024, max_batch=256)
    seen: list[tuple] = []
    with BatchScheduler(lm, max_concurrency=2) as scheduler:
        lm.model.on_step = lambda segments: seen.append(
            tuple((p.done, p.total) for p in scheduler.prefills())
        )
        request = GenerationRequest(
            prompt_ids=prompt, overrides={"max_new_tokens": 2, "do_sample": False}
        )
        ticket = scheduler.submit(request, CancelToken())
        events = list(ticket.events())
        assert isinstance(events[-1], Finished)
        assert scheduler.prefills() == ()
    assert ((256, 601),) in seen and ((512, 601),) in seen
    assert seen[-1] == ()  # decoding: the prompt is read


# --- the Serve status line, end to end on a real small model -------------------------------------
def test_the_serve_status_line_shows_a_request_reading_its_prompt(
    qtbot, tmp_path, smollm2_path, monkeypatch
):
    import openai

    from app.engine_bridge import RealEngine

    monkeypatch.setattr("PySide6.QtWidgets.QMessageBox.critical", lambda *a, **k: None)
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=str(smollm2_path))
    window.serve_port = 0
    try:
        with qtbot.waitSignal(window.controller.serverStarted, timeout=WAIT_MS) as started:
            window.serve_action.trigger()
        url = started.args[0]
        done = threading.Event()

        def client():
            with openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=300) as c:
                c.completions.create(
                    model=smollm2_path.stem,
                    prompt="The quick brown fox jumps over the lazy dog. " * 300,  # ~3,000 tokens
                    max_tokens=1,
                    temperature=0,
                )
            done.set()

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        qtbot.waitUntil(lambda: "· Reading prompt " in window.server_label.text(), timeout=WAIT_MS)
        assert " tokens" in window.server_label.text()
        qtbot.waitUntil(done.is_set, timeout=WAIT_MS * 5)
        qtbot.waitUntil(lambda: "Reading prompt" not in window.server_label.text(), timeout=WAIT_MS)
    finally:
        close_window(window)


@dataclass
class ComparingEngine(FakeEngine):
    """The bridge's compare(): column 0's prompt is read already, column 1's is being read;
    both wait at `hold`, then finish."""

    hold: threading.Event = field(default_factory=threading.Event)

    def tokenizer_key(self, lm):
        return "fake-vocabulary"

    def compare(self, lm, requests, cancels, models=None):
        read = PrefillProgress(3800, 3800, 0, 40.0, 95.0, 0.0)
        return [self._column(lm, read if i == 0 else READING) for i in range(len(requests))]

    def _column(self, lm, progress):
        yield progress
        self.hold.wait(WAIT_MS / 1000)
        yield from FakeEngine._stream(
            self, lm, GenerationRequest(messages=[]), "Done.", CancelToken()
        )


def test_a_compare_column_in_the_window_shows_its_own_prompt_being_read(qtbot, tmp_path):
    engine = ComparingEngine()
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.input.setPlainText("Summarise this long text")
        dialog = window.open_compare()
        dialog.start()
        columns = dialog.column_widgets
        qtbot.waitUntil(
            lambda: (
                columns[1].usage.text()
                == "Reading prompt 1,024 / 3,800 tokens · 85 tok/s · ~33 s left"
            ),
            timeout=WAIT_MS,
        )
        assert "Reading prompt" not in columns[0].usage.text()
        engine.hold.set()
        qtbot.waitUntil(lambda: not dialog.run.running, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: "Reading prompt" not in columns[1].usage.text(), timeout=WAIT_MS)
        dialog.close()
    finally:
        close_window(window)
