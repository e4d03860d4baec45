"""File > Import reads a zip export back (issue 35): every chat with its whole tree (versions,
branch, receipts) and its project, in one transaction. A hostile archive (a zip bomb, a member
name that climbs out with "..", a malformed manifest, a bad chat among good ones) is refused
with ChatImportError naming the problem, and the database is left exactly as it was."""

import json
import sqlite3
import zipfile

import pytest

import app.archive_import as archive_import
from app.archive_import import is_archive, read_archive
from app.export_job import ExportFormat, ExportScope, run_export, snapshot_chats
from app.store import Store
from engine.errors import ChatImportError
from tests.test_app_import import build_tree, shape, snapshot


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chats.db")
    yield s
    s.close()


@pytest.fixture
def other(tmp_path):
    s = Store(tmp_path / "other.db")
    yield s
    s.close()


def project_of(store: Store, cid: int) -> str | None:
    row = store._db.execute(
        "SELECT p.name FROM conversations c LEFT JOIN projects p ON p.id = c.project_id"
        " WHERE c.id=?",
        (cid,),
    ).fetchone()
    return row[0]


def export_zip(store, ids, path, projects=None):
    chats = snapshot_chats(store, ids, projects)
    return run_export(path, ExportFormat.ZIP, ExportScope.EVERYTHING, chats, lambda d, t: None)


def test_a_zip_export_comes_back_whole(store, other, tmp_path):
    tree = build_tree(store)
    plain = store.create_conversation("Plain")
    store.add_message(plain, "user", "hello")
    store.add_message(plain, "assistant", "hi there", reasoning="greet back")
    path = export_zip(store, [tree, plain], tmp_path / "all.zip", projects={plain: "Garden"})
    assert is_archive(path)
    archive = read_archive(path)
    assert archive.projects == (None, "Garden")
    ids = other.import_conversations(archive.chats, archive.projects)
    assert len(ids) == 2
    # the same tree, branch, receipts, tool calls and text as the original, chat for chat
    assert shape(other, ids[0]) == shape(store, tree)
    assert shape(other, ids[1]) == shape(store, plain)
    assert (project_of(other, ids[0]), project_of(other, ids[1])) == (None, "Garden")
    # a second import files into the same project rather than making another "Garden"
    again = other.import_conversations(archive.chats, archive.projects)
    assert project_of(other, again[1]) == "Garden"
    assert other._db.execute("SELECT count(*) FROM projects").fetchone()[0] == 1


def write_zip(path, members: dict[str, bytes | str], manifest=None):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        if manifest is not None:
            z.writestr("manifest.json", json.dumps(manifest))
        for name, data in members.items():
            z.writestr(name, data)
    return path


def manifest_for(*members, **changes):
    manifest = {
        "format": "localchat-archive",
        "version": 1,
        "counts": {"chats": len(members), "messages": 0, "projects": 0},
        "chats": [{"title": m, "project": None, "json": m, "markdown": None} for m in members],
    }
    manifest.update(changes)
    return manifest


def good_chat_json(store, tmp_path) -> bytes:
    cid = build_tree(store)
    path = export_zip(store, [cid], tmp_path / "one.zip")
    with zipfile.ZipFile(path) as z:
        return z.read("Tree _.json")


def hostile_archives(good: bytes):
    yield "not a zip", lambda p: p.write_bytes(b"PK\x03\x04 but nothing more"), "not a readable zip"
    yield "no manifest", lambda p: write_zip(p, {"a.json": good}), "no manifest.json"
    yield (
        "manifest not JSON",
        lambda p: write_zip(p, {"manifest.json": "{nope", "a.json": good}),
        "manifest.json is not valid JSON",
    )
    yield (
        "wrong format",
        lambda p: write_zip(p, {"a.json": good}, manifest_for("a.json", format="zip")),
        "not 'localchat-archive'",
    )
    yield (
        "future version",
        lambda p: write_zip(p, {"a.json": good}, manifest_for("a.json", version=99)),
        '"version" is 99',
    )
    yield (
        "counts that lie",
        lambda p: write_zip(
            p, {"a.json": good}, manifest_for("a.json", counts={"chats": 7, "messages": 1})
        ),
        '"counts.chats" is 7 but "chats" lists 1',
    )
    yield (
        "a member the manifest names is missing",
        lambda p: write_zip(p, {"a.json": good}, manifest_for("a.json", "b.json")),
        "member 'b.json' is not in the archive",
    )
    yield (
        "path traversal",
        lambda p: write_zip(p, {"../../evil.json": good}, manifest_for("../../evil.json")),
        'climbs out of the archive with ".."',
    )
    yield (
        "absolute name",
        lambda p: write_zip(p, {"/etc/evil.json": good}, manifest_for("/etc/evil.json")),
        "is an absolute path",
    )
    yield (
        "windows path",
        lambda p: write_zip(p, {"..\\evil.json": good}, manifest_for("..\\evil.json")),
        "has a backslash",
    )
    yield (
        "a project name with a control character",
        lambda p: write_zip(
            p,
            {"a.json": good},
            {**manifest_for("a.json"), "chats": [{"json": "a.json", "project": "Work\x1b[2J"}]},
        ),
        "manifest chat 1: The project name contains the control character U+001B",
    )
    yield (
        "a bad chat after a good one",
        lambda p: write_zip(
            p,
            {"a.json": good, "b.json": '{"format": "localchat-conversation", "version": 2}'},
            manifest_for("a.json", "b.json"),
        ),
        'b.json: the chat: "title" is missing',
    )


@pytest.mark.parametrize("name", [case[0] for case in hostile_archives(b"")])
def test_a_hostile_archive_is_refused_by_name_and_nothing_is_imported(store, other, tmp_path, name):
    good = good_chat_json(store, tmp_path)
    make, problem = next(case[1:] for case in hostile_archives(good) if case[0] == name)
    path = tmp_path / "hostile.zip"
    make(path)
    before = snapshot(other)
    with pytest.raises(ChatImportError) as caught:
        archive = read_archive(path)
        other.import_conversations(archive.chats, archive.projects)
    assert problem in caught.value.problem, name
    assert caught.value.path == path
    assert snapshot(other) == before


def test_a_zip_bomb_is_refused_before_it_is_unpacked(store, tmp_path, monkeypatch):
    good = good_chat_json(store, tmp_path)
    # 3 MB of zeros compresses to a few kB: with the limit at 1 MB this archive is a bomb.
    monkeypatch.setattr(archive_import, "MAX_UNPACKED_BYTES", 2**20)
    path = write_zip(
        tmp_path / "bomb.zip",
        {"a.json": good, "zeros.md": b"\0" * 3 * 2**20},
        manifest_for("a.json"),
    )
    assert path.stat().st_size < 100_000
    read = []
    monkeypatch.setattr(
        archive_import._ArchiveReader, "unpack", lambda self, info, limit: read.append(info)
    )
    with pytest.raises(ChatImportError) as caught:
        read_archive(path)
    assert "unpacks to 3," in caught.value.problem and "zip bomb" in caught.value.problem
    assert read == []  # not one member was unpacked


def test_a_member_that_unpacks_to_more_than_the_limit_is_refused(store, tmp_path, monkeypatch):
    monkeypatch.setattr(archive_import, "MAX_IMPORT_BYTES", 1000)
    good = good_chat_json(store, tmp_path)
    assert len(good) > 1000
    path = write_zip(tmp_path / "big.zip", {"a.json": good}, manifest_for("a.json"))
    with pytest.raises(ChatImportError) as caught:
        read_archive(path)
    assert f"member 'a.json' unpacks to {len(good):,} bytes; the limit is 1,000" in (
        caught.value.problem
    )


def test_a_failed_write_leaves_no_chat_of_the_archive(store, other, tmp_path, monkeypatch):
    ids = [build_tree(store) for _ in range(3)]
    archive = read_archive(export_zip(store, ids, tmp_path / "three.zip"))
    before = snapshot(other)
    real_insert = Store._insert_imported
    calls = []

    def fail_on_the_third(self, chat, project_id):
        calls.append(chat.title)
        if len(calls) == 3:
            raise sqlite3.OperationalError("database or disk is full")
        return real_insert(self, chat, project_id)

    monkeypatch.setattr(Store, "_insert_imported", fail_on_the_third)
    with pytest.raises(Exception, match="disk is full"):
        other.import_conversations(archive.chats, archive.projects)
    assert len(calls) == 3 and snapshot(other) == before
