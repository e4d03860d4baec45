"""Compare side by side (app/compare.py, app/views/compare_view.py) on the real SmolLM2: two
presets stream at once through the one BatchScheduler, the marked divergence is the first token
id where two direct engine runs of the same requests differ, the shading is each chosen token's
probability, a refused column fails alone, Stop stops every column, and a kept answer becomes a
version of the chat's reply."""

import math

import pytest

from app.compare import ColumnSpec
from app.engine_bridge import RealEngine
from engine.cancel import CancelToken
from engine.events import FINISH_CANCELLED, TokenSampled
from engine.types import Role
from tests.app_fakes import WAIT_MS, close_window, make_window

pytestmark = pytest.mark.slow

GREEDY = ColumnSpec("Greedy", {"do_sample": False, "max_new_tokens": 32})
SAMPLED = ColumnSpec(
    "Seeded", {"do_sample": True, "temperature": 0.8, "seed": 11, "max_new_tokens": 32}
)


def _direct_tokens(lm, request) -> list[TokenSampled]:
    """The same request run alone, straight through the engine on this thread."""
    events = RealEngine().generate(lm, request, CancelToken())
    return [e for e in events if isinstance(e, TokenSampled)]


def _open(window, prompt: str):
    window.input.setPlainText(prompt)
    dialog = window.open_compare()
    window.input.clear()
    return dialog


def test_two_presets_stream_at_once_divergence_shading_and_keep(
    qtbot, tmp_path, smollm2_path, smollm2
):
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=str(smollm2_path))
    try:
        dialog = _open(window, "Tell me about the sea.")
        run = dialog.run
        run.set_columns([GREEDY, SAMPLED])
        dialog._rebuild_columns()
        both_streaming = []

        def watch(_index):
            a, b = run.columns
            both_streaming.append(bool(a.tokens and b.tokens and a.running and b.running))

        run.columnChanged.connect(watch)
        bridge = window.backends.local.bridge
        with qtbot.waitSignal(run.finished, timeout=WAIT_MS):
            dialog.compare_button.click()
        a, b = run.columns
        assert a.error is None and b.error is None
        # at once: seen streaming together, and decoded in fewer scheduler steps than tokens
        assert any(both_streaming)
        steps = bridge._scheduler.stats().steps
        assert steps < len(a.tokens) + len(b.tokens)
        for column in (a, b):
            assert column.usage.ttft_ms > 0 and column.usage.completion_tokens > 0
            assert "TTFT" in dialog.column_widgets[run.columns.index(column)].usage.text()

        # independently: the same two requests run alone through engine.generate
        direct_a = _direct_tokens(smollm2, run.request(0))
        direct_b = _direct_tokens(smollm2, run.request(1))
        ids_a, ids_b = [t.token_id for t in direct_a], [t.token_id for t in direct_b]
        assert a.token_ids == ids_a and b.token_ids == ids_b  # batched = alone, exactly
        first = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
        marked = run.divergence(1)
        assert marked.index == first
        assert marked.reference_token.token_id == ids_a[first]
        assert marked.other_token.token_id == ids_b[first]
        assert f"token {first + 1}" in dialog.column_widgets[1].divergence.text()
        # both distributions at that position are listed
        shown = dialog.column_widgets[1].divergence.text()
        assert len(marked.other_token.top) > 1
        assert f"{math.exp(marked.other_token.top[1].logprob):.1%}" in shown
        assert f"{math.exp(marked.reference_token.top[1].logprob):.1%}" in shown

        # shading: the probability of each chosen token, from the direct run's logprobs
        for index, direct in ((0, direct_a), (1, direct_b)):
            shading = dialog.shading(index)
            n = len(run.columns[index].finished.token_ids)
            assert [t.token_id for t, _ in shading] == [t.token_id for t in direct[:n]]
            assert [p for _, p in shading] == pytest.approx(
                [math.exp(t.logprob) for t in direct[:n]], rel=1e-6
            )
        assert "Shading" in dialog.legend.text()

        # keep the sampled answer, then the greedy one: two versions of one reply
        dialog.column_widgets[1].use_button.click()
        dialog.column_widgets[0].use_button.click()
        store, session = window.store, window.session
        user, reply = session.branch[-2], session.branch[-1]
        assert user.role == Role.USER and user.content == "Tell me about the sea."
        assert reply.content == a.finished.text and reply.version_count == 2
        versions = [store.message(i) for i in reply.version_ids]
        assert sorted(v.content for v in versions) == sorted([a.finished.text, b.finished.text])
        assert store.tokens(reply.id)[0]["token_id"] == ids_a[0]
        dialog.close()

        # "Compare answers" on that user message answers it again, with its history above it
        widget = window.chat_view.widget_for(user.id)
        widget.compare_button.click()
        again = window.compare_dialog
        assert again.run.prompt == user.content and again.run.user_message_id == user.id
        assert again.run.messages()[-1] == {"role": Role.USER, "content": user.content}
        assert len(again.run.messages()) == 1  # nothing above the first question
        again.run.set_columns([GREEDY, SAMPLED])
        again._rebuild_columns()
        with qtbot.waitSignal(again.run.finished, timeout=WAIT_MS):
            again.compare_button.click()
        again.column_widgets[1].use_button.click()
        again.close()
        kept = window.session.branch[-1]
        assert window.session.branch[-2].id == user.id  # no second copy of the question
        assert kept.version_count == 3 and kept.content == again.run.columns[1].finished.text
        assert store.receipt(kept.id)["prompt"] is not None
    finally:
        close_window(window)


def test_a_refused_column_fails_alone_and_stop_stops_all(qtbot, tmp_path, smollm2_path):
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=str(smollm2_path))
    try:
        dialog = _open(window, "Count to five.")
        run = dialog.run
        run.set_columns([GREEDY, ColumnSpec("Bad", {"temperature": -1.0})])
        dialog._rebuild_columns()
        with qtbot.waitSignal(run.finished, timeout=WAIT_MS):
            dialog.compare_button.click()
        good, bad = run.columns
        assert good.error is None and good.finished is not None and good.tokens
        assert bad.error is not None and "temperature" in bad.error
        assert dialog.column_widgets[1].error.isVisible()
        assert "temperature" in dialog.column_widgets[1].error.text()
        assert not dialog.column_widgets[1].use_button.isEnabled()
        assert dialog.column_widgets[0].use_button.isEnabled()

        dialog.prompt.setPlainText("Write a long story about a dragon and a knight.")
        long = {"do_sample": False, "max_new_tokens": 2000}
        run.set_columns([ColumnSpec("A", long), ColumnSpec("B", {**long, "do_sample": True})])
        dialog._rebuild_columns()
        dialog.compare_button.click()
        qtbot.waitUntil(lambda: all(len(c.tokens) >= 3 for c in run.columns), timeout=WAIT_MS)
        assert dialog.stop_button.isEnabled()
        with qtbot.waitSignal(run.finished, timeout=WAIT_MS):
            dialog.stop_button.click()
        for column in run.columns:
            assert column.finished is not None and column.finished.finish_reason == FINISH_CANCELLED
            assert len(column.tokens) < 2000
        assert not window.backends.local.busy
        dialog.close()
    finally:
        close_window(window)


def test_a_column_on_a_second_model_file(qtbot, tmp_path, smollm2_path, gemma3_path):
    """A column can answer with another GGUF file, loaded on the worker beside the chat's model
    with its own scheduler: both stream; with two vocabularies no token divergence is claimed;
    closing the view unloads the second file and the chat's model still answers."""
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=str(smollm2_path))
    try:
        dialog = _open(window, "Name a color.")
        run = dialog.run
        run.set_columns([GREEDY, ColumnSpec("Gemma", dict(GREEDY.overrides))])
        dialog._rebuild_columns()
        dialog.set_column_model(1, str(gemma3_path))
        assert run.columns[1].spec.model_path == str(gemma3_path)
        with qtbot.waitSignal(run.finished, timeout=WAIT_MS):
            dialog.compare_button.click()
        small, gemma = run.columns
        assert small.error is None and gemma.error is None, (small.error, gemma.error)
        assert small.model_name == smollm2_path.name and gemma.model_name == gemma3_path.name
        assert small.tokens and gemma.tokens
        assert small.tokenizer_key != gemma.tokenizer_key
        assert not run.shares_tokenizer(1) and run.divergence(1) is None
        assert "Another tokenizer" in dialog.column_widgets[1].divergence.text()
        assert gemma.finished.receipt["model"]["file_name"] == gemma3_path.name
        # the second model's values come from its own file: shown with their sources
        assert "(override)" in dialog.column_widgets[1].sources.text()
        worker = window.backends.local._worker
        dialog.close()
        qtbot.waitUntil(lambda: not worker._side_models, timeout=WAIT_MS)
        assert not window.backends.local.bridge._side
        # the chat's model and prefix cache are untouched
        window.input.setPlainText("Hi")
        with qtbot.waitSignal(
            window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: not busy
        ):
            window.send()
        assert window.session.branch[-1].status == "complete"
    finally:
        close_window(window)


@pytest.fixture
def loopback_server(smollm2):
    """An OpenAI-compatible server on 127.0.0.1 (our own, engine/server) in front of SmolLM2:
    the remote model a column picks."""
    from engine.batching.scheduler import BatchScheduler
    from engine.server.background import BackgroundServer

    scheduler = BatchScheduler(smollm2, max_concurrency=2)
    server = BackgroundServer(smollm2, scheduler, port=0, model_id="loopback-smollm2")
    server.wait_ready(60)
    yield server
    server.stop()
    scheduler.close()


def _connect(qtbot, window, base_url: str) -> str:
    """Add a connection in the Connections dialog and pick its model (as a user does)."""
    from PySide6.QtCore import Qt

    dialog = window.open_connections()
    qtbot.mouseClick(dialog.findChild(type(dialog.test_button), "add_connection"), Qt.LeftButton)
    qtbot.keyClicks(dialog.name, "loopback")
    qtbot.keyClicks(dialog.base_url, base_url)
    qtbot.mouseClick(dialog.test_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dialog.models.count() > 0, timeout=WAIT_MS)
    dialog.accept()
    qtbot.waitUntil(lambda: bool(window.model_bar.remote_paths()), timeout=WAIT_MS)
    action = next(a for a in window.model_bar.remote_menu.actions() if a.data())
    path = action.data()
    with qtbot.waitSignal(window.backends.modelLoaded, timeout=WAIT_MS):
        action.trigger()
    return path


def test_a_column_on_a_remote_model(qtbot, tmp_path, smollm2_path, loopback_server, monkeypatch):
    """Once a remote model was picked (app/backends), a column can answer with it while the
    local model answers beside it; its usage is the network's; Stop stops it too."""
    from PySide6.QtWidgets import QMessageBox

    monkeypatch.setattr(QMessageBox, "critical", lambda *a, **k: None)
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=str(smollm2_path))
    try:
        remote_path = _connect(qtbot, window, loopback_server.url)
        assert window.backends.kind == "remote" and window.backends.local.model is not None
        dialog = _open(window, "Name a fruit.")
        run = dialog.run
        run.set_columns([GREEDY, ColumnSpec("Server", dict(GREEDY.overrides))])
        dialog._rebuild_columns()
        labels = [a.text() for a in dialog.model_menu(1).actions()]
        assert any(label.startswith("Remote: ") for label in labels)
        dialog.set_column_model(1, remote_path)
        with qtbot.waitSignal(run.finished, timeout=WAIT_MS):
            dialog.compare_button.click()
        local, remote = run.columns
        assert local.error is None and remote.error is None, (local.error, remote.error)
        assert remote.finished.text.strip() and remote.usage.measured_over_network
        assert not local.usage.measured_over_network
        assert remote.ttft_ms is not None and "TTFT" in dialog.column_widgets[1].usage.text()
        assert window.session.branch == []  # the remote reply did not leak into the chat
        assert run.divergence(1) is None  # another server's vocabulary: not compared by id

        # Stop stops the remote column as well
        long = {"do_sample": False, "max_new_tokens": 400}  # the server's context is 512
        run.set_columns([ColumnSpec("A", long), ColumnSpec("B", long, model_path=remote_path)])
        dialog._rebuild_columns()
        dialog.prompt.setPlainText("Write a long story about a dragon and a knight.")
        dialog.compare_button.click()
        qtbot.waitUntil(
            lambda: all(len(c.text) > 10 or c.error for c in run.columns), timeout=WAIT_MS
        )
        assert [c.error for c in run.columns] == [None, None], [
            (c.error, c.text, c.request_id) for c in run.columns
        ]
        with qtbot.waitSignal(run.finished, timeout=WAIT_MS):
            dialog.stop_button.click()
        for column in run.columns:
            assert column.finished is not None, column.error
            assert column.finished.finish_reason == FINISH_CANCELLED
            assert column.usage.completion_tokens < 400
        dialog.close()
    finally:
        close_window(window)
