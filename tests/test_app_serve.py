"""File > Serve this model: the window serves its loaded model over the OpenAI API while the chat
keeps working on the same model (both go through one BatchScheduler); the status bar shows the
URL and the running requests; turning it off closes the port."""

import socket
import threading

import openai
import pytest
from PySide6.QtCore import Qt

from app.engine_bridge import RealEngine
from tests.app_fakes import WAIT_MS, close_window, make_window

pytestmark = pytest.mark.slow


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    return host, int(port)


def test_serve_toggle_shares_the_model_with_the_chat(
    qtbot, tmp_path, smollm2_path, gemma3_path, monkeypatch
):
    shown = []
    monkeypatch.setattr("PySide6.QtWidgets.QMessageBox.critical", lambda *a, **k: shown.append(a))
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=str(smollm2_path))
    window.serve_port = 0  # any free port: tests must not fight over 8080
    assert window.serve_action.isEnabled() and not window.serve_action.isChecked()
    with qtbot.waitSignal(window.controller.serverStarted, timeout=WAIT_MS) as started:
        window.serve_action.trigger()
    url = started.args[0]
    assert window.serve_action.isChecked() and shown == []
    assert window.server_label.text().startswith(f"Serving at {url}")

    # a client streams a long reply while the chat sends a message: both run together in the
    # one scheduler (2 running), and the chat's reply completes while the stream goes on
    first_chunk, leave = threading.Event(), threading.Event()
    remote: list[str] = []

    def client():
        with openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120) as c:
            stream = c.completions.create(
                model=smollm2_path.stem,
                prompt="1, 2, 3,",
                max_tokens=300,
                temperature=0,
                stream=True,
            )
            for chunk in stream:
                remote.append(chunk.choices[0].text)
                first_chunk.set()
                if leave.is_set():
                    break  # closes the connection: the server cancels the rest
            stream.close()

    thread = threading.Thread(target=client)
    thread.start()
    try:
        qtbot.waitUntil(first_chunk.is_set, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: " 1 running" in window.server_label.text(), timeout=WAIT_MS)
        assert window.session.set_preset_value("max_new_tokens", 8) is None
        window.input.setPlainText("What is the capital of France?")
        qtbot.keyClick(window.input, Qt.Key_Return)
        qtbot.waitUntil(lambda: window.controller.server_status().running == 2, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
        assert thread.is_alive()  # the stream outlived the chat's reply
    finally:
        leave.set()
        thread.join(WAIT_MS / 1000)
    reply = window.store.messages(window.session.conversation_id)[-1]
    assert reply.status == "complete" and reply.content.strip()
    assert "".join(remote).strip()
    qtbot.waitUntil(lambda: " 0 running" in window.server_label.text(), timeout=WAIT_MS)

    # opening another model while serving serves the new one (re-opening the loaded file only
    # switches back to it: app/backends/router.py)
    with qtbot.waitSignal(window.controller.serverStarted, timeout=WAIT_MS) as restarted:
        window.open_model(str(gemma3_path))
    with openai.OpenAI(base_url=restarted.args[0], api_key="x", max_retries=0) as c:
        assert c.models.list().data[0].id == gemma3_path.stem
    url = restarted.args[0]
    assert window.server_label.text().startswith(f"Serving at {url}")

    with qtbot.waitSignal(window.controller.serverStopped, timeout=WAIT_MS):
        window.serve_action.trigger()
    assert not window.serve_action.isChecked() and window.server_label.text() == ""
    with pytest.raises(OSError):
        socket.create_connection(_address(url), timeout=5).close()
    # the chat still answers after the server is gone (the new model's preset starts afresh)
    assert window.session.set_preset_value("max_new_tokens", 8) is None
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: not busy
    ):
        window.input.setPlainText("And of Italy?")
        qtbot.keyClick(window.input, Qt.Key_Return)
    assert window.store.messages(window.session.conversation_id)[-1].status == "complete"
    assert shown == []
    close_window(window)


def test_a_taken_port_is_reported_and_the_toggle_stays_off(
    qtbot, tmp_path, smollm2_path, monkeypatch
):
    shown = []
    monkeypatch.setattr("PySide6.QtWidgets.QMessageBox.critical", lambda *a, **k: shown.append(a))
    window = make_window(qtbot, tmp_path, RealEngine(), model_path=str(smollm2_path))
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        window.serve_port = taken.getsockname()[1]
        with qtbot.waitSignal(window.controller.serverFailed, timeout=WAIT_MS) as failed:
            window.serve_action.trigger()
    finally:
        taken.close()
    assert f"127.0.0.1:{window.serve_port}" in failed.args[0]
    assert not window.serve_action.isChecked() and window.server_label.text() == ""
    assert len(shown) == 1 and "Could not serve" in shown[0][1]
    close_window(window)
