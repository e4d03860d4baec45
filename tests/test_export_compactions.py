"""A zip export carries each chat's compactions and import brings them back (issue 35): a
shared long chat used to arrive with its summaries gone, so the model read the whole old history
again. Exporting everything leaves out chats without messages, and the manifest says how many."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from app.archive_import import read_archive
from app.export_job import ExportFormat, ExportScope, run_export, snapshot_chats
from app.store import Store
from engine.errors import ChatImportError


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chats.db")
    yield s
    s.close()


@pytest.fixture
def other(tmp_path):
    s = Store(tmp_path / "other.db")
    # Rows already there, so imported messages get other ids than they had: a summary whose
    # covered ids were not mapped would point at these.
    cid = s.create_conversation("already here")
    for i in range(9):
        s.add_message(cid, "user", f"old {i}")
    yield s
    s.close()


def _compacted_chat(store: Store) -> tuple[int, list[int]]:
    cid = store.create_conversation("Long chat")
    ids = [store.add_message(cid, ("user", "assistant")[i % 2], f"turn {i}") for i in range(6)]
    store.add_compaction(cid, ids[:2], "the first two turns")
    store.add_compaction(cid, ids[:4], "the first four turns", receipt={"model": "m.gguf"})
    return cid, ids


def _export(store, ids, path, scope=ExportScope.EVERYTHING):
    chats = snapshot_chats(store, ids)
    return run_export(path, ExportFormat.ZIP, scope, chats, lambda d, t: None)


def _manifest(path) -> dict:
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read("manifest.json"))


def test_compactions_travel_in_the_zip_and_come_back_mapped_to_the_new_messages(
    store, other, tmp_path
):
    cid, _ids = _compacted_chat(store)
    archive = read_archive(_export(store, [cid], tmp_path / "a.zip"))
    (new_cid,) = other.import_conversations(archive.chats, archive.projects, archive.compactions)

    text = {m.id: m.content for m in other.tree(new_cid)}
    old, new = other.compactions(new_cid)
    assert [text[i] for i in old.covered] == ["turn 0", "turn 1"]
    assert [text[i] for i in new.covered] == ["turn 0", "turn 1", "turn 2", "turn 3"]
    assert (old.summary, old.active) == ("the first two turns", False)
    assert (new.summary, new.active, new.receipt) == (
        "the first four turns",
        True,
        {"model": "m.gguf"},
    )
    assert other.active_compaction(new_cid) == new


def test_exporting_everything_leaves_out_empty_chats_and_says_how_many(store, tmp_path):
    full, _ids = _compacted_chat(store)
    empty = [store.create_conversation("New chat") for _ in range(2)]
    path = _export(store, [empty[0], full, empty[1]], tmp_path / "all.zip")
    manifest = _manifest(path)
    assert [c["title"] for c in manifest["chats"]] == ["Long chat"]
    assert manifest["counts"]["chats"] == 1
    assert manifest["left_out"] == {"empty_chats": 2}
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["Long chat.json", "Long chat.md", "manifest.json"]


def test_one_empty_chat_asked_for_by_itself_is_still_exported(store, tmp_path):
    empty = store.create_conversation("Empty on purpose")
    manifest = _manifest(_export(store, [empty], tmp_path / "one.zip", ExportScope.CHAT))
    assert [c["title"] for c in manifest["chats"]] == ["Empty on purpose"]
    assert manifest["left_out"] == {"empty_chats": 0}


def _with_compactions(tmp_path, store, compactions) -> Path:
    cid, _ids = _compacted_chat(store)
    path = _export(store, [cid], tmp_path / "good.zip")
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    record = json.loads(members["Long chat.json"])
    record["compactions"] = compactions(record)
    members["Long chat.json"] = json.dumps(record).encode()
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return bad


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: [{"covered": [999999], "summary": "s", "active": True}], "999999"),
        (lambda r: [{"covered": [], "summary": "s", "active": True}], '"covered"'),
        (lambda r: [{"covered": [r["branch"][0]], "summary": " ", "active": True}], '"summary"'),
        (lambda r: [{"covered": [r["branch"][0]], "summary": "s", "active": "yes"}], '"active"'),
        (
            lambda r: [{"covered": [r["branch"][0]], "summary": "s", "active": True}] * 2,
            "more than one compaction is active",
        ),
        (lambda r: {"covered": []}, "not a list of objects"),
    ],
)
def test_a_bad_compaction_is_refused_by_name_and_nothing_is_imported(
    store, other, tmp_path, change, problem
):
    path = _with_compactions(tmp_path, store, change)
    before = len(other.list_conversations())
    with pytest.raises(ChatImportError, match="Long chat.json") as raised:
        read_archive(path)
    assert problem in str(raised.value)
    assert len(other.list_conversations()) == before


def test_an_archive_from_before_compactions_were_exported_still_imports(store, other, tmp_path):
    path = _with_compactions(tmp_path, store, lambda r: None)  # "compactions": null, as absent
    archive = read_archive(path)
    (new_cid,) = other.import_conversations(archive.chats, archive.projects, archive.compactions)
    assert other.compactions(new_cid) == [] and len(other.messages(new_cid)) == 6
