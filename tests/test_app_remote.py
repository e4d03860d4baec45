"""End to end in the window with a real OpenAI-compatible server (llama-cpp-python on loopback):
add a connection, pick its model, chat, stop, restart the app on the same data directory, and
the chat is there and still bound to that connection. The flows whose assertions depend on what
the model says (exact usage numbers, a tool call and the answer from its result) run against a
scripted server (tests/scripted_openai_server.py) instead of a sampling model."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMessageBox

from app.backends.remote import remote_model_path
from engine.types import MessageStatus, Role
from tests.app_fakes import FakeEngine, close_window, make_window
from tests.llama_server import start_openai_server
from tests.scripted_openai_server import Reply, ScriptedOpenAIServer

WAIT_MS = 120_000  # a real model on a busy shared machine


@pytest.fixture(scope="module")
def openai_server(smollm2_path, tmp_path_factory):
    """This module's own llama-cpp-python server, fresh: in one full run the session's server,
    after other files' interrupted streams, answered this module's first greedy request with an
    empty reply (not reproduced alone; the window tests check what the app shows, so they start
    from a server in a known state)."""
    server = start_openai_server(smollm2_path, tmp_path_factory.mktemp("llama-server-window"))
    yield server
    server.stop()


@pytest.fixture
def scripted_server():
    """`start(replies) -> ScriptedOpenAIServer`, running until the test ends."""
    servers: list[ScriptedOpenAIServer] = []

    def start(replies: list[Reply]) -> ScriptedOpenAIServer:
        servers.append(ScriptedOpenAIServer(replies).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def dialogs(monkeypatch):
    shown = []
    monkeypatch.setattr(
        QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append((title, text))
    )
    return shown


def add_connection(
    qtbot, window, base_url: str, key: str = "", models: tuple[str, ...] = ("smollm2",)
) -> None:
    dialog = window.open_connections()
    qtbot.mouseClick(dialog.findChild(type(dialog.test_button), "add_connection"), Qt.LeftButton)
    qtbot.keyClicks(dialog.name, "loopback llama")
    qtbot.keyClicks(dialog.base_url, base_url)
    if key:
        qtbot.keyClicks(dialog.api_key, key)
    qtbot.mouseClick(dialog.test_button, Qt.LeftButton)
    qtbot.waitUntil(
        lambda: dialog.models.count() > 0 or "Cannot" in dialog.status.text(), timeout=WAIT_MS
    )
    assert [dialog.models.item(i).text() for i in range(dialog.models.count())] == list(models)
    assert "Connected" in dialog.status.text()
    dialog.accept()


def pick_remote_model(qtbot, window) -> str:
    qtbot.waitUntil(lambda: bool(window.model_bar.remote_paths()), timeout=WAIT_MS)
    # Let every model listing end first (closing the dialog starts one more): llama-cpp-python
    # breaks off a running stream as soon as any other request reaches it, /v1/models included,
    # so a listing that lands during the first reply would cut that reply to nothing.
    window.catalog.wait()
    QApplication.processEvents()  # their results (queued to this thread) rebuild the menu
    action = next(a for a in window.model_bar.remote_menu.actions() if a.data())
    assert "remote" in action.text() and "127.0.0.1" in action.text()
    path = action.data()  # a later listing may rebuild the menu (and delete the action)
    with qtbot.waitSignal(window.backends.modelLoaded, timeout=WAIT_MS):
        action.trigger()
    return path


def send(qtbot, window, text: str) -> None:
    window.input.setPlainText(text)
    qtbot.keyClick(window.input, Qt.Key_Return)


def stop_mid_stream(qtbot, window, text: str, after_chars: int):
    """Send `text` and press Stop once more than `after_chars` of the reply are shown; returns
    the stored reply."""
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as finished:
        send(qtbot, window, text)
        qtbot.waitUntil(
            lambda: (
                window.chat_view.streaming_widget is not None
                and len(window.chat_view.streaming_widget.text) > after_chars
            ),
            timeout=WAIT_MS,
        )
        qtbot.mouseClick(window.cancel_button, Qt.LeftButton)
    return finished.args[0]


def restart(qtbot, data_dir, model_path: str):
    """A new window on the same data directory, started as the app starts (it opens the last
    chat's model, here a remote one); returns it once that model is open."""
    again = make_window(qtbot, data_dir, FakeEngine(), load=False)
    again.start()
    qtbot.waitUntil(
        lambda: again.backends.model is not None and again.backends.model.path == model_path,
        timeout=WAIT_MS,
    )
    return again


def test_remote_chat_stop_and_restart_keep_the_binding(qtbot, tmp_path, openai_server, dialogs):
    window = make_window(qtbot, tmp_path, FakeEngine())  # a local model is open first
    add_connection(qtbot, window, f"127.0.0.1:{openai_server.port}")
    connection = window.book.connections[0]
    assert connection.base_url == openai_server.base_url  # "/v1" added, http:// assumed
    path = pick_remote_model(qtbot, window)
    assert path == remote_model_path(connection.id, "smollm2")
    assert window.backends.kind == "remote"
    assert "remote on 127.0.0.1" in window.model_bar.model_label.text()

    # The sampling panel: what is sent (the user's values) and what is left to the server.
    assert window.preset_panel.view.sources["top_k"] == "server's default (not sent)"
    # A reply, streamed from the server into the same views.
    window.session.set_preset_value("max_new_tokens", 16)
    window.session.set_preset_value("do_sample", False)
    assert window.preset_panel.view.sources["max_new_tokens"] == "override"
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as done:
        send(qtbot, window, "Name three colors.")
    stored = done.args[0]
    reply = window.chat_view.widgets[-1]
    assert reply.text.strip() and reply.text == stored.content
    # The server's logprobs are the token inspector's tokens, one per streamed token.
    assert 0 < len(stored.tokens) <= 16
    assert "".join(t["text"] for t in stored.tokens) == stored.content
    assert window.usage_panel.text_of("completion_tokens") == str(len(stored.tokens))
    # llama-cpp-python sends no usage in a stream: said so, not shown as 0.
    assert window.usage_panel.text_of("prompt_tokens") == "not reported by the server"
    assert window.usage_panel.network_note.isVisibleTo(window.usage_panel)

    # Stop mid-stream: the partial reply stays, marked cancelled.
    window.session.set_preset_value("max_new_tokens", 400)
    stopped = stop_mid_stream(qtbot, window, "Write a long story about a dragon.", 20)
    assert stopped.status == MessageStatus.CANCELLED and stopped.content
    cid = window.session.conversation_id
    binding = window.store.chat_backend(cid)
    assert (binding.kind, binding.connection_id, binding.model) == (
        "remote",
        connection.id,
        "smollm2",
    )
    messages_before = [(m.role, m.content) for m in window.store.messages(cid)]
    assert dialogs == []
    close_window(window)

    # Restart on the same data directory: the chat reopens bound to the same server's model.
    again = restart(qtbot, tmp_path, path)  # the remote chat's model, not the last file
    assert again.session.conversation_id == cid
    assert [(m.role, m.content) for m in again.store.messages(cid)] == messages_before
    assert again.store.messages(cid)[-1].status == MessageStatus.CANCELLED
    # And it still chats there: the history goes to the server.
    again.session.set_preset_value("max_new_tokens", 8)
    with qtbot.waitSignal(again.session.replyFinished, timeout=WAIT_MS):
        send(qtbot, again, "Thanks.")
    assert again.store.messages(cid)[-1].role == Role.ASSISTANT
    assert again.store.messages(cid)[-1].content.strip()
    close_window(again)


def test_a_servers_usage_and_a_stop_reach_the_window_and_restart_keeps_the_binding(
    qtbot, tmp_path, scripted_server, dialogs
):
    """Against a scripted server, so every number is known: the include_usage chunk's counts
    are what the usage panel shows (not the streamed chunks counted), the tokens' logprobs are
    the inspector's tokens, Stop closes the connection while the server is still streaming,
    and after a restart the chat is still bound to the server and its history goes there.
    Catches usage counted from the chunks instead of the server's numbers (planted: fails), and
    a Stop that does not end the stream (the scripted reply never ends by itself). A real
    server counting the cancelled request (`python -m engine serve`'s /health) is
    test_remote_client.py::test_stop_mid_stream_is_seen_by_our_server_as_a_cancelled_request."""
    server = scripted_server(
        [
            Reply("Red, green and blue.", usage=(23, 5)),
            Reply("Once upon a time a dragon", endless=True),
            Reply("You are welcome."),
        ]
    )
    window = make_window(qtbot, tmp_path, FakeEngine())
    add_connection(qtbot, window, server.base_url, models=(server.model,))
    connection = window.book.connections[0]
    path = pick_remote_model(qtbot, window)
    assert path == remote_model_path(connection.id, server.model)
    assert window.backends.kind == "remote"

    window.session.set_preset_value("max_new_tokens", 12)
    window.session.set_preset_value("do_sample", False)
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as done:
        send(qtbot, window, "Name three colors.")
    stored = done.args[0]
    assert stored.status == MessageStatus.COMPLETE and stored.content == "Red, green and blue."
    assert window.chat_view.widgets[-1].text == stored.content
    assert [t["text"] for t in stored.tokens] == ["Red,", " green", " and", " blue."]
    assert window.usage_panel.text_of("prompt_tokens") == "23"
    assert window.usage_panel.text_of("completion_tokens") == "5"
    first = server.requests[0]
    assert (first["model"], first["max_tokens"], first["temperature"]) == (server.model, 12, 0.0)
    assert first["messages"][-1] == {"role": "user", "content": "Name three colors."}

    window.session.set_preset_value("max_new_tokens", 400)
    stopped = stop_mid_stream(qtbot, window, "Write a long story about a dragon.", 40)
    assert stopped.status == MessageStatus.CANCELLED
    assert stopped.content.startswith("Once upon a time a dragon more")
    assert server.client_left.wait(WAIT_MS / 1000)  # the server was streaming when it went
    cid = window.session.conversation_id
    binding = window.store.chat_backend(cid)
    assert (binding.kind, binding.connection_id, binding.model) == (
        "remote",
        connection.id,
        server.model,
    )
    messages_before = [(m.role, m.content) for m in window.store.messages(cid)]
    assert dialogs == []
    close_window(window)

    again = restart(qtbot, tmp_path, path)
    assert again.session.conversation_id == cid
    assert [(m.role, m.content) for m in again.store.messages(cid)] == messages_before
    with qtbot.waitSignal(again.session.replyFinished, timeout=WAIT_MS) as answered:
        send(qtbot, again, "Thanks.")
    assert answered.args[0].status == MessageStatus.COMPLETE
    assert again.store.messages(cid)[-1].content == "You are welcome."
    history = [(m["role"], m["content"]) for m in server.requests[-1]["messages"]]
    assert history[-5:] == [*messages_before, ("user", "Thanks.")]
    assert again.store.chat_backend(cid).model == server.model
    close_window(again)


def test_a_chat_continues_locally_and_back(qtbot, tmp_path, openai_server, dialogs):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["local answer"]))
    add_connection(qtbot, window, openai_server.base_url)
    remote_path = pick_remote_model(qtbot, window)
    window.session.set_preset_value("max_new_tokens", 8)
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        send(qtbot, window, "Hello there.")
    cid = window.session.conversation_id
    # Back to the local file: the same chat, answered locally, its binding now local.
    with qtbot.waitSignal(window.backends.modelLoaded, timeout=WAIT_MS):
        window.open_model("/models/fake-model.gguf")
    assert window.backends.kind == "local"
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        send(qtbot, window, "And locally?")
    contents = [m.content for m in window.store.messages(cid)]
    assert contents[0] == "Hello there." and contents[-1] == "local answer" and len(contents) == 4
    assert window.store.chat_backend(cid).kind == "local"
    # Another chat on the remote model; opening the first chat again goes back to local.
    window.new_chat()
    with qtbot.waitSignal(window.backends.modelLoaded, timeout=WAIT_MS):
        window.open_model(remote_path)
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        send(qtbot, window, "Hi.")
    with qtbot.waitSignal(window.backends.modelLoaded, timeout=WAIT_MS):
        window.session.open_conversation(cid)
    assert window.backends.kind == "local"
    close_window(window)


def test_wrong_key_is_named_and_never_stored_in_the_clear(
    qtbot, tmp_path, openai_server_with_key, dialogs
):
    server = openai_server_with_key
    window = make_window(qtbot, tmp_path, FakeEngine())
    dialog = window.open_connections()
    assert "0600" in dialog.key_note.text()  # this machine has no keychain service
    qtbot.mouseClick(dialog.findChild(type(dialog.test_button), "add_connection"), Qt.LeftButton)
    qtbot.keyClicks(dialog.base_url, server.base_url)
    qtbot.keyClicks(dialog.api_key, "sk-wrong-key-987")
    qtbot.mouseClick(dialog.test_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dialog.test_button.isEnabled(), timeout=WAIT_MS)
    assert "refused the API key" in dialog.status.text()
    assert "sk-wrong-key-987" not in dialog.status.text()
    dialog.api_key.clear()
    qtbot.keyClicks(dialog.api_key, server.api_key)
    qtbot.mouseClick(dialog.test_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dialog.models.count() > 0, timeout=WAIT_MS)
    dialog.accept()
    pick_remote_model(qtbot, window)
    window.session.set_preset_value("max_new_tokens", 8)
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        send(qtbot, window, "Hello.")
    key_file = tmp_path / "api-keys.json"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert server.api_key in key_file.read_text()
    assert server.api_key not in (tmp_path / "settings.json").read_text()
    # The dialog never shows a stored key; "Forget stored key" removes it.
    again = window.open_connections()
    assert again.api_key.text() == "" and "stored" in again.api_key.placeholderText()
    qtbot.mouseClick(again.forget_key, Qt.LeftButton)
    again.accept()
    assert server.api_key not in key_file.read_text()
    close_window(window)
    assert server.api_key.encode() not in (tmp_path / "chats.sqlite3").read_bytes()
    assert dialogs == []


def test_a_stream_cut_short_is_named_kept_and_the_chat_goes_on(
    qtbot, tmp_path, scripted_server, dialogs
):
    """The app's side of network faults (a stream cut mid-reply, a 429, a server refusing
    `logprobs`), injected by the fault proxy. Upstream is the scripted server, not
    llama-cpp-python: after a client cut mid-stream, that server's next request (the model
    list the app asks for) sometimes never completed, and 3 of 6 full runs waited 120 s here.
    Cuts against the real servers are test_remote_client.py's stream-cut tests."""
    from tests.fault_proxy import Fault, FaultProxy

    words = " ".join(f"colour{i}" for i in range(60))  # ~60 events: far past the 1500-byte cut
    server = scripted_server([Reply(f"Red, green, blue, {words}.")])
    proxy = FaultProxy("127.0.0.1", server.port).start()
    try:
        window = make_window(qtbot, tmp_path, FakeEngine())
        add_connection(qtbot, window, proxy.base_url, models=(server.model,))
        pick_remote_model(qtbot, window)
        window.session.set_preset_value("max_new_tokens", 24)
        proxy.fault = Fault(cut_after_bytes=1500)
        with qtbot.waitSignal(window.session.replyFailed, timeout=WAIT_MS) as failed:
            send(qtbot, window, "Name three colors.")
        message, stored = failed.args
        assert "127.0.0.1" in message and dialogs[-1] == ("Generation failed", message)
        assert stored.status == MessageStatus.ERROR and stored.content  # the partial reply
        cid = window.session.conversation_id
        assert window.store.messages(cid)[-1].content == stored.content
        # Refused before the stream: named (with the wait), stored as a failed reply.
        proxy.fault = Fault(status_429_retry_after="7")
        with qtbot.waitSignal(window.session.replyFailed, timeout=WAIT_MS) as failed:
            send(qtbot, window, "And now?")
        assert "rate limiting" in failed.args[0] and "Try again in 7 s" in failed.args[0]
        assert window.store.messages(cid)[-1].status == MessageStatus.ERROR
        # A server without logprobs: asked once more without them, said so, and the inspector
        # says there is nothing to inspect.
        proxy.fault = Fault(refuse_field="logprobs")
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as done:
            send(qtbot, window, "Again, please.")
        assert done.args[0].status == MessageStatus.COMPLETE and done.args[0].content
        assert done.args[0].tokens == []
        assert "'logprobs'" in window.notice
        assert "does not report token probabilities" in window.token_inspector.hint.text()
        assert len(window.store.messages(cid)) == 6
        close_window(window)
    finally:
        proxy.stop()


def test_settings_leads_to_connections_and_names_where_keys_go(qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QPushButton

    from app.views.settings_dialog import SettingsDialog

    def click_connections(dialog):
        dialog.findChild(QPushButton, "open_connections").click()
        return dialog.result()

    monkeypatch.setattr(SettingsDialog, "exec", click_connections)
    window = make_window(qtbot, tmp_path, FakeEngine())
    window.open_settings()
    dialog = window.connections_dialog
    assert dialog.isVisible()
    # No keychain service on a headless box: the dialog says where keys go instead.
    assert str(tmp_path / "api-keys.json") in dialog.key_note.text()
    assert "0600" in dialog.key_note.text()
    dialog.reject()
    close_window(window)


def test_a_remote_model_calls_a_tool_and_answers_from_its_result(
    qtbot, tmp_path, scripted_server, dialogs
):
    """The app's tool flow on a remote model, scripted: the server's streamed tool_calls become
    a tool message the app runs (the built-in calculator), and the next request carries the
    call and its result, paired by id, with tool_choice "none" after the required first round.
    Catches tools or tool_choice left out of the remote request and a result not sent back.
    Real servers' calls: test_remote_tools.py; a real model's: test_qwen_coder_tools.py."""
    from app.tool_registry import builtin_key
    from engine.types import ToolChoice

    server = scripted_server(
        [Reply(tool_calls=(("calculator", {"expression": "17 * 23"}),)), Reply("It is 391.")]
    )
    window = make_window(qtbot, tmp_path, FakeEngine())
    add_connection(qtbot, window, server.base_url, models=(server.model,))
    pick_remote_model(qtbot, window)
    assert window.backends.kind == "remote"
    window.session.tools.first_choice = ToolChoice.REQUIRED
    window.session.set_tool_enabled(builtin_key("calculator"), True)
    send(qtbot, window, "Use the calculator: what is 17 * 23?")
    qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)  # busy through the rounds
    first, second = server.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["calculator"]
    assert (first["tool_choice"], second["tool_choice"]) == ("required", "none")
    call_message, result = second["messages"][-2:]
    (call,) = call_message["tool_calls"]
    assert call_message["role"] == "assistant" and call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "17 * 23"}
    assert result == {"role": "tool", "tool_call_id": call["id"], "content": "391"}
    roles = [m.role for m in window.session.branch]
    assert roles == ["user", "assistant", "tool", "assistant"]
    tool = window.session.branch[2]
    assert tool.tool["name"] == "calculator" and not tool.tool["is_error"] and tool.content == "391"
    assert window.session.branch[3].content == "It is 391."
    assert dialogs == []
    close_window(window)
