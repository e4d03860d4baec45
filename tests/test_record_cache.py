"""The record cache (engine/kernels/record_cache.py): a model's repacked weight records written
beside its first load and mapped by the next, on tiny Q8_0 / Q4_K models written to tmp_path.
The oracle for the mapped records is the repack itself (a load with the cache off): the same
bytes and bit-identical logits."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.kernels import record_cache, repack
from engine.kv_cache import KVCache
from engine.loader import load_model
from tests.data_dir_helpers import REPO, root_can_mount, run_python_in_mount
from tests.tiny_models import write_tiny_model

PROMPT = [5, 17, 42, 99, 3, 250, 8]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """The cache in tmp_path, for models of any size (the tiny ones are far below the minimum)."""
    directory = tmp_path / "records"
    monkeypatch.setenv(record_cache.RECORD_CACHE_ENV, str(directory))
    monkeypatch.setattr(record_cache, "MIN_CACHED_BYTES", 0)
    monkeypatch.setattr(record_cache, "MIN_FREE_BYTES", 0)
    return directory


def tiny(tmp_path, qtype=Q.Q8_0, name="m.gguf", seed=0):
    return write_tiny_model(
        tmp_path / name, "qwen2", qtype, seed, d_model=256, head_dim=64, d_ff=512,
        tie_embeddings=False,
    )  # fmt: skip


def logits(lm) -> np.ndarray:
    cache = KVCache.for_config(lm.config, 16)
    return lm.model.forward(PROMPT, cache, all_logits=True)


def records_of(lm) -> dict[str, bytes]:
    return {
        w.name: repack.packed_for(w).data.tobytes()
        for w in lm.model.matrices()
        if lm.backend.copies_weight(w)
    }


def mapping_path(address: int) -> str:
    """The file behind the mapping that holds `address` (/proc/self/maps), or ""."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else ""
    return ""


class Run(NamedTuple):
    logits: np.ndarray
    records: dict[str, bytes]
    status: str
    files: set[str]  # the files mapping the records ("" for anonymous memory)


def load_and_run(path) -> Run:
    """A load, its forward pass over PROMPT, and its records; waits for the cache writer."""
    with load_model(path, n_ctx=32, n_threads=1) as lm:
        packed = [w for w in lm.model.matrices() if lm.backend.copies_weight(w)]
        if not packed:
            pytest.skip(f"the {lm.backend.name} backend repacks nothing")
        files = {mapping_path(repack.packed_for(w).data.ctypes.data) for w in packed}
        run = Run(logits(lm), records_of(lm), lm.records.status, files)
        writer = lm.records.writer
    if writer is not None:
        assert writer.done.wait(60)
    return run


def cache_files(directory):
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K])
def test_second_load_maps_the_first_loads_records_bit_for_bit(tmp_path, cache_dir, qtype):
    path = tiny(tmp_path, qtype)
    first = load_and_run(path)
    assert first.status == "repacked; writing the record cache"
    files = cache_files(cache_dir)
    assert len(files) == 1 and files[0].endswith(record_cache.SUFFIX)  # no temporary left

    assert not any(f.startswith("/") for f in first.files)  # anonymous memory ("", [heap])

    second = load_and_run(path)
    assert second.status.startswith("records mapped from the cache")
    assert second.files == {str(cache_dir / files[0])}  # the file itself, not a copy
    assert second.records == first.records
    np.testing.assert_array_equal(second.logits, first.logits)


def test_cache_off_writes_nothing_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(record_cache.RECORD_CACHE_ENV, "0")
    monkeypatch.setattr(record_cache, "MIN_CACHED_BYTES", 0)
    status = load_and_run(tiny(tmp_path)).status
    assert status == f"repacked ({record_cache.RECORD_CACHE_ENV}=0)"


def test_a_small_model_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(record_cache.RECORD_CACHE_ENV, str(tmp_path / "records"))
    status = load_and_run(tiny(tmp_path)).status  # far below MIN_CACHED_BYTES
    assert status == "repacked"
    assert cache_files(tmp_path / "records") == []


@pytest.mark.parametrize("damage", ["truncate", "index", "magic"])
def test_a_damaged_cache_file_is_a_miss_and_is_written_again(tmp_path, cache_dir, damage):
    path = tiny(tmp_path)
    good = load_and_run(path)
    (name,) = cache_files(cache_dir)
    file = cache_dir / name
    if damage == "truncate":
        os.truncate(file, file.stat().st_size - 4096)
    else:
        with open(file, "r+b") as fh:
            at = len(record_cache.FORMAT) + 8 + 10 if damage == "index" else 0
            fh.seek(at)
            fh.write(b"\xff\xfe")
    again = load_and_run(path)
    assert again.status == "repacked; writing the record cache"
    assert again.records == good.records
    np.testing.assert_array_equal(again.logits, good.logits)
    status = load_and_run(path).status  # and the rewritten file maps again
    assert status.startswith("records mapped from the cache")


def test_a_model_file_rewritten_in_place_never_maps_the_old_records(
    tmp_path, cache_dir, monkeypatch
):
    path = tiny(tmp_path, seed=0)
    load_and_run(path)
    stat = path.stat()
    other = tiny(tmp_path, name="other.gguf", seed=1).read_bytes()
    assert len(other) == stat.st_size
    with open(path, "r+b") as fh:  # same inode, same size, other weights...
        fh.write(other)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ...and even the same mtime
    assert path.stat().st_ino == stat.st_ino
    with load_model(path, n_ctx=32, n_threads=1) as lm:
        assert lm.records.status == "repacked; writing the record cache"
        expected = logits(lm)
    monkeypatch.setenv(record_cache.RECORD_CACHE_ENV, "0")
    with load_model(path, n_ctx=32, n_threads=1) as fresh:
        np.testing.assert_array_equal(logits(fresh), expected)


def test_the_key_follows_the_record_layout(tmp_path, monkeypatch, request):
    # A change to how records are laid out must change the key, without anyone bumping a
    # version: the key holds the records of a probe weight of every type.
    path = tiny(tmp_path)
    from engine.gguf import open_gguf

    g = open_gguf(path)
    weights = [t for t in g.tensors.values() if repack.packable(t)]
    entries = record_cache.layout(weights)
    offsets = {w.name: g.tensor_offsets[w.name] for w in weights}
    before = record_cache.cache_key(path, offsets, entries)
    original = repack._RECORDS["Q8_0"]
    monkeypatch.setitem(repack._RECORDS, "Q8_0", lambda blocks: original(blocks)[..., ::-1])
    record_cache._probe.cache_clear()
    request.addfinalizer(record_cache._probe.cache_clear)  # no altered probe for later tests
    assert record_cache.cache_key(path, offsets, entries) != before


def test_a_model_closed_before_every_weight_was_repacked_leaves_no_file(tmp_path, cache_dir):
    path = tiny(tmp_path)
    with load_model(path, n_ctx=32, n_threads=1) as lm:
        writer = lm.records.writer
        assert writer is not None
        w = next(w for w in lm.model.matrices() if lm.backend.copies_weight(w))
        repack.packed_for(w)  # one weight of many
    assert writer.done.wait(60)
    assert not writer.ok
    assert cache_files(cache_dir) == []


def test_least_recently_used_files_make_room_under_the_cap(tmp_path, monkeypatch):
    directory = tmp_path / "records"
    directory.mkdir()
    monkeypatch.setattr(record_cache, "MIN_FREE_BYTES", 0)
    monkeypatch.setattr(record_cache, "MAX_CACHE_BYTES", 3 << 20)
    for i, age in enumerate([300, 100, 200]):  # seconds old
        f = directory / f"{i}{record_cache.SUFFIX}"
        f.write_bytes(os.urandom(1 << 20))
        t = f.stat().st_mtime - age
        os.utime(f, (t, t))
    stale = directory / f"9{record_cache.SUFFIX}.999999999.1.tmp"  # a writer that is gone
    stale.write_bytes(b"x")
    keep = directory / f"new{record_cache.SUFFIX}"
    assert record_cache.make_room(directory, 2 << 20, keep)
    # 1 MiB more than the cap allows would stay: the oldest (0, 300 s) goes, then 2 (200 s)
    assert cache_files(directory) == [f"1{record_cache.SUFFIX}"]
    assert not record_cache.make_room(directory, 8 << 20, keep)  # more than the whole cap


def test_no_cache_is_started_when_the_disk_would_be_left_too_full(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(record_cache, "MIN_FREE_BYTES", 1 << 60)
    status = load_and_run(tiny(tmp_path)).status
    assert status == "repacked (no disk room for the record cache)"
    assert cache_files(cache_dir) == []


FULL_DISK_CHILD = """
import sys
sys.path.insert(0, {repo!r})
import numpy as np
from engine.kernels import record_cache
record_cache.MIN_CACHED_BYTES = 0
record_cache.MIN_FREE_BYTES = 0
# the disk fills after the room check (another program writing): the write itself hits ENOSPC
record_cache.make_room = lambda *args: True
from engine.kv_cache import KVCache
from engine.loader import load_model
with load_model(sys.argv[1], n_ctx=32, n_threads=1) as lm:
    print("STATUS", lm.records.status)
    cache = KVCache.for_config(lm.config, 16)
    out = lm.model.forward([5, 17, 42], cache, all_logits=True)
    print("FINITE", bool(np.isfinite(out).all()))
    writer = lm.records.writer
writer.done.wait(60)
print("OK", writer.ok)
import os
print("LEFT", sorted(os.listdir(sys.argv[2])))
"""


@pytest.mark.skipif(not root_can_mount(), reason="needs root and unshare for a tiny tmpfs")
def test_a_full_disk_while_writing_removes_the_partial_file_and_the_load_goes_on(tmp_path):
    path = tiny(tmp_path)  # its records are several MiB; the disk holds 1 MiB
    directory = tmp_path / "records"
    directory.mkdir()
    env_script = f"import os; os.environ['{record_cache.RECORD_CACHE_ENV}'] = {str(directory)!r}\n"
    run = run_python_in_mount(
        directory,
        env_script + FULL_DISK_CHILD.format(repo=str(REPO)),
        str(path),
        str(directory),
        size="1m",
    )
    assert "STATUS repacked; writing the record cache" in run.stdout, run.stderr[-3000:]
    assert "FINITE True" in run.stdout
    assert "OK False" in run.stdout
    assert "LEFT []" in run.stdout, run.stdout
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
