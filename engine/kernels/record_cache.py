"""An on-disk copy of a model's repacked weight records, so a warm load maps them instead of
repacking the whole file again.

Repacking a 7B Q4_K_M model (repack.py) rewrites 4.3 GiB on every load: measured on a 2-core
Xeon, 2.2 s wall and 4.4 CPU s, half of it the kernel zeroing the fresh huge pages the records
go into, which no faster repack can avoid. Mapped from this cache (warm page cache) the same
records cost nothing before the first forward pass, and decode runs at the same speed: the
kernel maps the file's 2 MiB page-cache folios with huge-page entries (FilePmdMapped), which
is why every record starts on a 2 MiB boundary of the file.

One file per model file and record layout, named by a key over everything the records depend
on: the model file's identity (resolved path, size, mtime, inode and the first bytes of every
packed tensor, read with pread so no mapping is touched), the list of packed tensors with their
shapes and types, and the records numpy's repack makes of a fixed probe weight of every type,
so a change to the record layout can never map stale records.

The file is written beside the first load, on a thread, once every weight has been repacked
(during the first forward pass; writing earlier stalled it): records at offsets fixed from the
header alone, then the index, then fsync and an atomic rename, so a reader sees no file or a
complete one. (A mixture-of-experts model repacks an expert
when a token is first routed to it, so its file is written only once every expert has been used
in one process; until then each load repacks what it uses.) Models whose records total less than
MIN_CACHED_BYTES are not cached (they repack in a fraction of a second); the directory is held
under MAX_CACHE_BYTES by removing the least recently used files, and a write that would leave
the disk with less than MIN_FREE_BYTES is not started. Every failure here is a cache miss that
is logged, never a failed load: the weights are repacked as without a cache.

LOCALCHAT_RECORD_CACHE=0 turns the cache off; unset or 1 is the default directory
(`platformdirs.user_cache_dir("LocalChat")/records`); any other value names the directory.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import logging
import mmap
import os
import queue
import shutil
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import platformdirs
from gguf import GGMLQuantizationType

from engine.file_pages import release_file_pages
from engine.kernels import repack
from engine.qtensor import QTensor

log = logging.getLogger(__name__)

RECORD_CACHE_ENV = "LOCALCHAT_RECORD_CACHE"
FORMAT = b"localchat-records-v1\n"
ALIGN = 1 << 21  # huge-page boundary: the file's folios can then be mapped as huge pages
MIN_CACHED_BYTES = 512 << 20
MAX_CACHE_BYTES = 24 << 30  # a few 7B-8B models
MIN_FREE_BYTES = 4 << 30  # a cache never takes the last of the user's disk
_SAMPLE_BYTES = 4096  # of every packed tensor, in the key
_WRITE_CHUNK = 64 << 20  # os.pwrite of at most this (the GIL is released during each)
SUFFIX = ".records"


@dataclass(frozen=True)
class Entry:
    """Where one weight's records live in the cache file."""

    name: str
    qname: str
    shape: tuple[int, int, int]  # (groups, blocks per row, record bytes)
    offset: int

    @property
    def nbytes(self) -> int:
        groups, blocks, size = self.shape
        return groups * blocks * size


def cache_dir() -> Path | None:
    """The cache's directory, or None when LOCALCHAT_RECORD_CACHE=0 turns it off."""
    value = os.environ.get(RECORD_CACHE_ENV, "").strip()
    if value == "0":
        return None
    if value and value != "1":
        return Path(value).expanduser()
    return Path(platformdirs.user_cache_dir("LocalChat")) / "records"


def layout(weights: Iterable[QTensor]) -> list[Entry]:
    """The records' places in a cache file: in the given order, each on an ALIGN boundary
    after the first ALIGN bytes (the index)."""
    entries = []
    at = ALIGN
    for w in weights:
        entry = Entry(w.name, w.qtype.name, repack.record_shape(w), at)
        entries.append(entry)
        at += -(-entry.nbytes // ALIGN) * ALIGN
    return entries


def _probe_records() -> bytes:
    """The records numpy's repack makes of a fixed weight of every record type (two blocks
    wide, one row more than a group, so block order and padding show too): the key changes
    with any change to the layout (a bumped version number could be forgotten)."""
    rng = np.random.default_rng(1234)
    out = []
    for qname in sorted({**repack.RECORD_BYTES, **repack.LEGACY_RECORD_BYTES}):
        rows, cols = repack.GROUP_ROWS + 1, 2 * repack.block_values(qname)
        data = rng.integers(0, 256, (rows, 2 * repack.source_block_bytes(qname)), dtype=np.uint8)
        w = QTensor(f"probe.{qname}", GGMLQuantizationType[qname], (rows, cols), data)
        out.append(repack.repack(w).data.tobytes())
    return b"".join(out)


@functools.cache
def _probe() -> bytes:
    return _probe_records()


def cache_key(path: Path, offsets: dict[str, int], entries: list[Entry]) -> str:
    """sha256 hex over the model file's identity, the tensors' first bytes, the entries and the
    probe records (module docstring). Raises OSError if the file cannot be read."""
    h = hashlib.sha256(FORMAT)
    st = os.stat(path)
    identity = [str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino]
    h.update(json.dumps(identity).encode("utf-8", "surrogatepass"))
    h.update(json.dumps([(e.name, e.qname, e.shape) for e in entries]).encode())
    with open(path, "rb") as fh:
        fd = fh.fileno()
        for e in entries:
            h.update(os.pread(fd, _SAMPLE_BYTES, offsets[e.name]))
    h.update(_probe())
    return h.hexdigest()


def _index_body(key: str, entries: list[Entry]) -> dict:
    """The index as JSON data: what a writer stores and a reader must find."""
    return {"key": key, "entries": [[e.name, e.qname, list(e.shape), e.offset] for e in entries]}


def _file_end(entries: list[Entry]) -> int:
    return max((e.offset + e.nbytes for e in entries), default=ALIGN)


def _index(key: str, entries: list[Entry]) -> bytes:
    body = json.dumps(_index_body(key, entries)).encode()
    index = FORMAT + len(body).to_bytes(8, "little") + body
    if len(index) > ALIGN:
        raise ValueError("record index larger than its 2 MiB slot")
    return index


class CacheMismatch(Exception):
    """A cache file that is not the one its name promises (damaged, truncated, other layout)."""


def map_records(path: Path, key: str, entries: list[Entry]) -> dict[str, np.ndarray]:
    """The records of every entry as read-only views of the mapped cache file. Raises OSError
    or CacheMismatch."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(len(FORMAT) + 8)
        if not head.startswith(FORMAT):
            raise CacheMismatch("not a record cache file")
        length = int.from_bytes(head[len(FORMAT) :], "little")
        if length > ALIGN:
            raise CacheMismatch("index length out of range")
        try:
            index = json.loads(fh.read(length))
        except ValueError as exc:
            raise CacheMismatch(f"unreadable index: {exc}") from None
        if index != _index_body(key, entries):
            raise CacheMismatch("index does not match the model's records")
        end = _file_end(entries)
        if size < end:
            raise CacheMismatch(f"truncated: {size} bytes, the records end at {end}")
        mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return {
        e.name: np.frombuffer(mapping, np.uint8, e.nbytes, e.offset).reshape(e.shape)
        for e in entries
    }


class RecordCacheWriter:
    """Collects a model's records as they are repacked (add) and, once the last has arrived,
    writes them to a temporary file on its own thread, then the index, fsync and the rename to
    the final name. On any OSError the temporary file is removed and the rest ignored (logged
    once)."""

    def __init__(self, path: Path, key: str, entries: list[Entry]):
        self.path = path
        self._key = key
        self._entries = {e.name: e for e in entries}
        self._tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        self._queue: queue.SimpleQueue[tuple[str, np.ndarray] | None] = queue.SimpleQueue()
        self._added: set[str] = set()
        self.done = threading.Event()
        self.ok = False
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self._tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(self._fd, _file_end(entries))  # sparse: the alignment gaps take no disk
        except OSError:
            self._abandon()
            raise
        self._thread = threading.Thread(
            target=self._run, name="localchat-record-cache", daemon=True
        )
        self._thread.start()
        with _writers_lock:
            _writers.add(self)

    def add(self, name: str, records: np.ndarray) -> None:
        with _writers_lock:
            self._added.add(name)
        self._queue.put((name, records))

    @property
    def has_everything(self) -> bool:
        """Whether every weight's records were handed over (what is left is disk I/O)."""
        with _writers_lock:
            return self._added >= self._entries.keys()

    def close(self) -> None:
        """The model is closing: a writer with every record finishes on its own (and the
        process waits for it at exit); one still missing some stops, its file removed."""
        self._queue.put(None)

    def _run(self) -> None:
        _lower_priority()
        try:
            # Nothing is written until every weight's records are here: they arrive during the
            # first forward pass, whose kernel threads wait for each other at every step, so
            # any core this thread took then delayed the first token (measured on the 7B with
            # 2 cores, at the lowest priority even: 6.0 s instead of 4.4 s). After it, the copy
            # overlaps the decoding of the next tokens instead.
            arrived: dict[str, np.ndarray] = {}
            while len(arrived) < len(self._entries):
                item = self._queue.get()
                if item is None:
                    self._abandon()
                    return
                name, records = item
                entry = self._entries.get(name)
                if entry is not None and records.shape == entry.shape:
                    arrived[name] = records
            for name, records in arrived.items():
                flat = np.ascontiguousarray(records).reshape(-1)
                self._write(memoryview(flat.data), self._entries[name].offset)
            del arrived
            self._write(memoryview(_index(self._key, list(self._entries.values()))), 0)
            os.fsync(self._fd)  # before the rename: a crash must not leave a named torn file
            os.close(self._fd)
            self._fd = -1
            os.replace(self._tmp, self.path)
            self.ok = True
            log.info("wrote the record cache %s", self.path)
        except OSError as exc:
            log.warning(
                "cannot write the record cache %s (%s); weights repack next time", self.path, exc
            )
            self._abandon()
        finally:
            self.done.set()
            with _writers_lock:
                _writers.discard(self)

    def _write(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done : done + _WRITE_CHUNK], offset + done)

    def _abandon(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self._tmp)


def _lower_priority() -> None:
    """Run this thread at the lowest CPU priority (Linux: nice is per thread), so the copy into
    the page cache yields the cores to the decoding it overlaps. (It did not save the first
    token when the copy overlapped the first forward pass, measured on the 7B: waiting for the
    last record did; see _run.)"""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


_writers_lock = threading.Lock()
_writers: set[RecordCacheWriter] = set()


@atexit.register
def _finish_writers() -> None:
    """At exit, let a writer that has every record finish (a one-shot CLI run that ends right
    after its reply still leaves a complete cache); the others are dropped with their files."""
    with _writers_lock:
        writers = list(_writers)
    for writer in writers:
        if writer.has_everything:
            writer.done.wait()
        else:
            writer.close()
            writer.done.wait(5)


def make_room(directory: Path, need: int, keep: Path) -> bool:
    """Remove the least recently used cache files (and stale temporaries) until `need` more
    bytes fit under MAX_CACHE_BYTES; whether the disk then still has MIN_FREE_BYTES free after
    them."""
    files = []
    for p in directory.glob(f"*{SUFFIX}*"):
        try:
            st = p.stat()
        except OSError:
            continue
        if p.name.endswith(".tmp"):
            if _stale_tmp(p):
                p.unlink(missing_ok=True)
            continue
        if p != keep:
            files.append((st.st_mtime, st.st_blocks * 512, p))
    files.sort()
    total = sum(size for _, size, _ in files)
    while files and total + need > MAX_CACHE_BYTES:
        _, size, p = files.pop(0)
        try:
            p.unlink()
            total -= size
        except OSError:
            pass
    if total + need > MAX_CACHE_BYTES:
        return False
    return shutil.disk_usage(directory).free - need >= MIN_FREE_BYTES


def _stale_tmp(p: Path) -> bool:
    """A temporary file whose writing process is gone."""
    parts = p.name.split(".")
    try:
        pid = int(parts[-3])
    except (IndexError, ValueError):
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


@dataclass
class RecordCacheUse:
    """How a load got its records: `status` for the load line, the writer when one is filling
    the cache beside this load (its `done` event is set when it has finished or given up)."""

    status: str
    writer: RecordCacheWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def attach(gguf_file, weights: list[QTensor]) -> RecordCacheUse:
    """Map `weights`' records (the ones the backend repacks, in forward order) from the cache
    when it holds them, else arrange for them to be written there as they are repacked."""
    entries = layout(weights)
    total = sum(e.nbytes for e in entries)
    directory = cache_dir()
    if directory is None:
        return RecordCacheUse(f"repacked ({RECORD_CACHE_ENV}=0)" if entries else "")
    if total < MIN_CACHED_BYTES:
        return RecordCacheUse("repacked" if entries else "")
    try:
        key = cache_key(gguf_file.path, _file_offsets(gguf_file, weights), entries)
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("record cache unavailable (%s); repacking the weights", exc)
        return RecordCacheUse("repacked (record cache unavailable)")
    path = directory / f"{key[:40]}{SUFFIX}"
    try:
        views = map_records(path, key, entries)
    except FileNotFoundError:
        views = None
    except (OSError, CacheMismatch) as exc:
        log.warning("ignoring the record cache file %s (%s); it will be written again", path, exc)
        path.unlink(missing_ok=True)
        views = None
    if views is not None:
        for w in weights:
            repack.adopt(w, views[w.name])
            # the file's pages the load mapped around the model's vectors (2 MiB folios
            # straddle them and these matrices) are never read now: not counted twice
            release_file_pages(w.data)
        with contextlib.suppress(OSError):
            os.utime(path)  # recency, for make_room's least recently used
        return RecordCacheUse(f"records mapped from the cache ({total / 2**30:.1f} GiB)")
    try:
        if not make_room(directory, total, path):
            log.info("no room for a %.1f GiB record cache in %s", total / 2**30, directory)
            return RecordCacheUse("repacked (no disk room for the record cache)")
        writer = RecordCacheWriter(path, key, entries)
    except OSError as exc:
        log.warning("cannot start the record cache %s (%s); repacking the weights", path, exc)
        return RecordCacheUse("repacked (record cache unavailable)")
    for w in weights:
        repack.on_packed(w, _handing_to(writer, w.name))
    return RecordCacheUse("repacked; writing the record cache", writer)


def _handing_to(writer: RecordCacheWriter, name: str) -> Callable[[repack.PackedWeight], None]:
    return lambda packed: writer.add(name, packed.data)


def _file_offsets(gguf_file, weights: list[QTensor]) -> dict[str, int]:
    """Each weight's offset in the model file, from its address in the file's mapping (derived
    weights, e.g. the rows of a fused QKV matrix, are views with no tensor entry of their own)."""
    name, first = next(iter(gguf_file.tensors.items()))
    base = first.data.ctypes.data - gguf_file.tensor_offsets[name]
    offsets = {}
    for w in weights:
        at = w.data.ctypes.data - base
        if not 0 <= at < gguf_file.file_size:
            raise OSError(f"{w.name} is not inside the model file's mapping")
        offsets[w.name] = at
    return offsets
