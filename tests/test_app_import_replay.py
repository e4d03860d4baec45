"""A reply exported on one machine replays on another (issue 14): SmolLM2 answers a sampled prompt
in one data directory, the chat is exported to JSON, and a second window with its own data
directory and its own model-digest cache imports it and replays the reply token for token from
the imported receipt. A receipt naming a model file this machine has never seen replays on the
loaded model and says plainly that the receipt's file (name and sha256) is not here; with another
model loaded, a file here with the receipt's sha256 is used for the replay.

The first test is the same path in the fast tier, with every setting at its default (an
unbounded, sampled reply), on the app's RealEngine over the scripted model."""

import json

from PySide6.QtCore import Qt

from app.engine_bridge import RealEngine
from tests.app_fakes import WAIT_MS, close_window, make_window
from tests.fake_model import use_fake_detokenizer
from tests.test_app_replay import ScriptedModelEngine, click_replay

SAMPLED = {"do_sample": True, "temperature": 0.9, "top_p": 0.95, "max_new_tokens": 16}


def replay_in(qtbot, window, message_id):
    dialog = window.show_details(message_id)
    with qtbot.waitSignal(window.session.replayFinished, timeout=WAIT_MS) as done:
        dialog.replay_button.click()
    return dialog, done.args[1]


def test_a_default_settings_reply_replays_after_export_and_import(qtbot, tmp_path, monkeypatch):
    use_fake_detokenizer(monkeypatch)
    model = tmp_path / "scripted.gguf"
    model.write_bytes(b"GGUF scripted model")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    engine = ScriptedModelEngine(digest_cache=first / "d.json")
    window = make_window(qtbot, first, engine, model_path=str(model))
    window.input.setPlainText("Hello")
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        qtbot.keyClick(window.input, Qt.Key_Return)
    original = window.store.messages(window.session.conversation_id)[-1]
    assert original.receipt["preset"]["values"]["max_new_tokens"] is None
    exported = tmp_path / "chat.json"
    window.export_to(str(exported))
    close_window(window)

    engine = ScriptedModelEngine(digest_cache=second / "d.json")
    other = make_window(qtbot, second, engine, model_path=str(model))
    reply = other.store.messages(other.import_from(str(exported)))[-1]
    assert reply.receipt == original.receipt
    report = click_replay(qtbot, other, other.show_details(reply.id))
    assert not isinstance(report, str), f"Replay failed: {report}"
    assert report.identical and report.differences == (), report
    assert report.replayed_tokens == len(original.receipt["output"]["token_ids"])

    data = json.loads(exported.read_text())
    data["messages"][-1]["receipt"]["model"].update(file_name="elsewhere.gguf", sha256="ab" * 32)
    tampered = tmp_path / "elsewhere.json"
    tampered.write_text(json.dumps(data))
    elsewhere = other.store.messages(other.import_from(str(tampered)))[-1]
    report = click_replay(qtbot, other, other.show_details(elsewhere.id))
    assert not isinstance(report, str), f"Replay failed: {report}"
    assert report.identical  # the loaded model is the same scripted one
    assert report.differences[0] == (
        f"the receipt's model file elsewhere.gguf (sha256 {'ab' * 32}) is not on this machine "
        "(no file with that sha256 has been opened here); this replay ran on the loaded model "
        "instead"
    )
    assert report.differences[1].startswith("model file: elsewhere.gguf (sha256 abababababab…)")
    close_window(other)


def test_an_exported_reply_replays_exactly_after_import_elsewhere(
    qtbot, tmp_path, smollm2_path, gemma3_path
):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    window = make_window(
        qtbot, first, RealEngine(digest_cache=first / "d.json"), model_path=str(smollm2_path)
    )
    for name, value in SAMPLED.items():
        assert window.session.set_preset_value(name, value) is None
    window.input.setPlainText("Name three colours.")
    with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
        qtbot.keyClick(window.input, Qt.Key_Return)
    original = window.store.messages(window.session.conversation_id)[-1]
    exported = tmp_path / "chat.json"
    window.export_to(str(exported))
    close_window(window)

    other = make_window(
        qtbot, second, RealEngine(digest_cache=second / "d.json"), model_path=str(smollm2_path)
    )
    assert all(not other.store.branch(c.id) for c in other.store.list_conversations())
    new_id = other.import_from(str(exported))
    assert new_id is not None
    reply = other.store.messages(new_id)[-1]
    assert (reply.role, reply.content) == ("assistant", original.content)
    assert reply.receipt == original.receipt
    dialog, report = replay_in(qtbot, other, reply.id)
    assert report.identical and report.differences == (), report
    assert report.replayed_tokens == len(original.receipt["output"]["token_ids"])
    assert "Reproduced exactly" in dialog.result.text()

    # The same chat as if made with a model file this machine has never hashed.
    data = json.loads(exported.read_text())
    model = data["messages"][-1]["receipt"]["model"]
    model.update(file_name="made-elsewhere.gguf", sha256="ab" * 32)
    tampered = tmp_path / "elsewhere.json"
    tampered.write_text(json.dumps(data))
    elsewhere = other.store.messages(other.import_from(str(tampered)))[-1]
    dialog, report = replay_in(qtbot, other, elsewhere.id)
    note = report.differences[0]
    assert "made-elsewhere.gguf" in note and "ab" * 32 in note, note
    assert "not on this machine" in note
    assert "not on this machine" in dialog.result.text()

    # Another model loaded, but this machine has hashed the receipt's file (SmolLM2, opened
    # above): the replay runs on that file, exactly, and says so.
    with qtbot.waitSignal(other.controller.modelLoaded, timeout=WAIT_MS):
        other.open_model(str(gemma3_path))
    again = other.store.messages(other.import_from(str(exported)))[-1]
    dialog, report = replay_in(qtbot, other, again.id)
    assert report.identical, report
    assert report.differences[0].startswith(f"replayed on {smollm2_path.resolve()}")
    close_window(other)
