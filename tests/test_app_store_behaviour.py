"""The store's promises the first tests left out: recency order, search of LIKE's own wildcard
characters, rollback of a failed transaction, every stored field round-tripping, and the reply
recorder's save throttle (driven through its injectable clock)."""

import sqlite3
import threading
from types import SimpleNamespace

import pytest

from app import store as store_mod
from app.reply_recorder import SAVE_INTERVAL_S, ReplyRecorder
from app.store import Store


@pytest.fixture
def clock(monkeypatch):
    """The store's wall clock, advanced one second per reading: recency order is decided by
    the sequence of writes, not by how fast the machine is."""
    ticks = iter(range(1_000_000, 2_000_000))
    monkeypatch.setattr(store_mod, "time", SimpleNamespace(time=lambda: float(next(ticks))))


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def titles(store, search=""):
    return [c.title for c in store.list_conversations(search)]


def test_a_new_message_moves_its_conversation_to_the_top(store, clock):
    first, second, third = (store.create_conversation(t) for t in ("first", "second", "third"))
    assert titles(store) == ["third", "second", "first"]
    store.add_message(first, "user", "back to the first chat")
    assert titles(store) == ["first", "third", "second"]
    reply = store.begin_reply(second)  # a reply starting counts as new activity too
    assert titles(store) == ["second", "first", "third"]
    # saving the partial reply and finishing it do not reorder the sidebar under the user
    store.save_partial(reply, "partial")
    store.finish_reply(
        reply, content="done", reasoning="", status="complete", finish_reason="stop", usage=None
    )
    store.rename_conversation(third, "third, renamed")
    assert titles(store) == ["third, renamed", "second", "first"]


@pytest.mark.parametrize(
    "query,matches",
    [
        ("50%", ["discount 50% off"]),
        ("%", ["discount 50% off"]),
        ("my_var", ["rename my_var"]),
        ("_", ["rename my_var"]),
        ("C:\\temp", ["path C:\\temp"]),
        ("\\", ["path C:\\temp"]),
    ],
)
def test_search_treats_like_wildcards_and_backslashes_as_plain_text(store, query, matches):
    for title in ("discount 50% off", "discount 500 off", "rename my_var", "rename myXvar"):
        store.create_conversation(title)
    conversation = store.create_conversation("a path")
    store.add_message(conversation, "user", "path C:\\temp")
    found = [
        store.messages(c.id)[0].content if c.title == "a path" else c.title
        for c in store.list_conversations(query)
    ]
    assert found == matches


def test_a_failed_transaction_is_rolled_back_and_the_store_stays_usable(store):
    conversation = store.create_conversation("kept")
    with pytest.raises(ZeroDivisionError), store._transaction():
        store._db.execute(
            "INSERT INTO conversations(title, created_at, updated_at) VALUES ('x',0,0)"
        )
        store._db.execute("UPDATE conversations SET title='changed' WHERE id=?", (conversation,))
        1 / 0  # noqa: B018 - any error inside the transaction
    assert titles(store) == ["kept"]
    # no transaction was left open: the next one (BEGIN IMMEDIATE) starts and commits
    store.add_message(conversation, "user", "still works")
    assert [m.content for m in store.messages(conversation)] == ["still works"]


def test_a_migration_that_fails_halfway_leaves_the_old_database_untouched(tmp_path):
    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(store_mod.SCHEMA_V1)
    # the migration's last step creates this index: it already exists, so that step fails
    old.execute("CREATE INDEX messages_by_conversation ON messages(role)")
    old.execute("INSERT INTO conversations(id, title, created_at) VALUES (1, 'Old', 5.0)")
    old.commit()
    old.close()
    with pytest.raises(sqlite3.OperationalError, match="messages_by_conversation"):
        Store(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    columns = [row[1] for row in db.execute("PRAGMA table_info(conversations)")]
    assert columns == ["id", "title", "created_at"]  # the ALTER TABLEs were rolled back
    db.close()


def test_every_field_round_trips_and_defaults_are_empty(store):
    conversation = store.create_conversation()
    got = store.conversation(conversation)
    assert (got.title, got.system_prompt) == ("New chat", "")
    assert store.conversation(conversation + 1) is None

    plain = store.add_message(conversation, "user", "hi")
    tokens = [{"index": 0, "token_id": 5, "text": "hi", "logprob": -0.1, "top": []}]
    full = store.add_message(
        conversation,
        "assistant",
        "answer",
        reasoning="thought",
        finish_reason="stop",
        usage={"completion_tokens": 1},
        tokens=tokens,
        json_mode="object",
    )
    a, b = store.messages(conversation)
    assert (a.id, a.conversation_id, a.position, a.role, a.content) == (
        plain,
        conversation,
        0,
        "user",
        "hi",
    )
    assert (a.reasoning, a.status, a.finish_reason, a.usage, a.tokens, a.json_mode) == (
        "",
        "complete",
        None,
        None,
        [],
        "off",
    )
    assert a.created_at > 0
    assert (b.id, b.position, b.reasoning, b.finish_reason, b.usage, b.tokens, b.json_mode) == (
        full,
        1,
        "thought",
        "stop",
        {"completion_tokens": 1},
        tokens,
        "object",
    )
    assert store.message(full) == b and store.message(full + 1) is None


def test_a_reply_starts_empty_and_keeps_its_json_mode(store):
    conversation = store.create_conversation()
    plain, schema = store.begin_reply(conversation), store.begin_reply(conversation, "schema")
    assert [(m.content, m.status, m.json_mode) for m in store.messages(conversation)] == [
        ("", "streaming", "off"),
        ("", "streaming", "schema"),
    ]
    store.save_partial(plain, "grow")
    assert (store.message(plain).content, store.message(plain).reasoning) == ("grow", "")
    store.finish_reply(
        schema, content="{}", reasoning="", status="complete", finish_reason="stop", usage=None
    )
    assert (store.message(schema).tokens, store.message(schema).usage) == ([], None)


def test_the_store_makes_its_directory_and_has_a_default_place(tmp_path, monkeypatch):
    nested = tmp_path / "a" / "b" / "chats.sqlite3"
    Store(nested).close()
    assert nested.is_file()
    default = tmp_path / "default" / "chats.sqlite3"
    monkeypatch.setattr(store_mod, "default_db_path", lambda: default)
    s = Store()
    assert s.path == default and default.is_file()
    s.close()


def test_the_store_answers_from_another_thread(store):
    store.create_conversation("from the GUI thread")
    seen = []
    worker = threading.Thread(target=lambda: seen.extend(titles(store)))
    worker.start()
    worker.join(60)
    assert seen == ["from the GUI thread"]


# --- the reply recorder's save throttle ----------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_partial_reply_is_saved_at_most_once_per_interval(store):
    assert SAVE_INTERVAL_S == 0.25  # the README promises a quarter of a second
    conversation = store.create_conversation()
    reply = store.begin_reply(conversation)
    clock = FakeClock()
    recorder = ReplyRecorder(store, reply, clock=clock)

    def saved():
        return store.message(reply).content

    clock.now = 0.125
    recorder.add_text("one")
    assert saved() == ""  # less than the interval since the recorder started
    clock.now = 0.25
    recorder.add_text(" two")
    assert saved() == "one two"  # the interval has passed: saved with everything so far
    clock.now = 0.375
    recorder.add_reasoning("hmm")
    assert store.message(reply).reasoning == ""
    assert not recorder.maybe_save()
    clock.now = 0.5  # a repaint tick with no new text still saves what is pending
    assert recorder.maybe_save()
    assert store.message(reply).reasoning == "hmm"
    clock.now = 10.0
    assert not recorder.maybe_save()  # nothing new: no write


def test_a_custom_interval_is_honoured(store):
    conversation = store.create_conversation()
    reply = store.begin_reply(conversation)
    clock = FakeClock()
    recorder = ReplyRecorder(store, reply, save_interval_s=2.0, clock=clock)
    clock.now = 1.5
    recorder.add_text("a")
    assert store.message(reply).content == ""
    clock.now = 2.0
    recorder.add_text("b")
    assert store.message(reply).content == "ab"
