"""One export of many chats (File > Export and share…): what to export and in which format, the
chats read from the store, and the write itself, made safe for the destination.

The chats are read on the GUI thread into ChatSnapshot records (the store's connection belongs
to that thread, and a snapshot cannot see a write half done); rendering and writing run on a
worker thread (app/features/export.py) and report `step(done, total)` after each chat, which
raises ExportCancelled once the user has cancelled.

The destination never holds a partial file: the export is written to a hidden temporary file
beside it and renamed over it only when complete, so a cancel, a full disk or a crash leaves the
folder as it was. Failures become ExportError naming the path and the problem."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from app.store import Conversation, Store, StoredCompaction, StoredMessage

# Called after each chat with (chats done, chats in all); raises ExportCancelled when cancelled.
Step = Callable[[int, int], None]


class ExportScope(StrEnum):
    CHAT = "chat"
    PROJECT = "project"
    EVERYTHING = "everything"


class ExportFormat(StrEnum):
    ZIP = "zip"  # one .md and one .json per chat, folders per project, manifest.json
    HTML = "html"  # one self-contained page
    PDF = "pdf"  # Qt's own printing

    @property
    def extension(self) -> str:
        return "." + self.value

    @property
    def file_filter(self) -> str:
        return {
            ExportFormat.ZIP: "Markdown + JSON archive (*.zip)",
            ExportFormat.HTML: "Web page (*.html)",
            ExportFormat.PDF: "PDF document (*.pdf)",
        }[self]


@dataclass(frozen=True)
class ChatSnapshot:
    """One chat as exported: `branch` the visible messages, `tree` every version of every
    message (parents before children), `project` the name of its project (None: no project),
    `compactions` its summaries, active or not, oldest first."""

    conversation: Conversation
    branch: list[StoredMessage]
    tree: list[StoredMessage]
    project: str | None = None
    compactions: tuple[StoredCompaction, ...] = ()


class ExportError(Exception):
    """An export could not be written: carries the destination and the problem in words."""

    def __init__(self, path: Path | str, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path}: {problem}")


class ExportCancelled(Exception):
    """The user cancelled the export; nothing was written to the destination."""


def snapshot_chats(
    store: Store, conversation_ids: Sequence[int], projects: dict[int, str] | None = None
) -> list[ChatSnapshot]:
    """The chats `conversation_ids` as they are now (chats deleted meanwhile are skipped);
    `projects` maps a chat id to its project's name."""
    chats = []
    for cid in conversation_ids:
        conversation = store.conversation(cid)
        if conversation is None:
            continue
        # The tree holds the receipts (the branch reader without tokens leaves them out).
        tree = store.tree(cid)
        by_id = {m.id: m for m in tree}
        branch = [by_id[m.id] for m in store.messages(cid, with_tokens=False)]
        chats.append(
            ChatSnapshot(
                conversation,
                branch,
                tree,
                (projects or {}).get(cid),
                tuple(store.compactions(cid)),
            )
        )
    return chats


def exported(chats: list[ChatSnapshot], scope: ExportScope) -> list[ChatSnapshot]:
    """The chats an export of `scope` writes: exporting everything leaves out chats without a
    message (each "New chat" opened and never used is not worth sharing); one chat or a
    project's chats are written as asked."""
    if scope != ExportScope.EVERYTHING:
        return chats
    return [c for c in chats if c.tree]


def cancellable_step(cancel: threading.Event, report: Step) -> Step:
    """A Step that reports progress and raises ExportCancelled once `cancel` is set."""

    def step(done: int, total: int) -> None:
        if cancel.is_set():
            raise ExportCancelled()
        report(done, total)

    return step


def describe_os_error(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "the folder cannot be written to (no permission, or it is read-only)"
    if exc.errno == errno.ENOENT:
        return "the folder does not exist"
    return exc.strerror or str(exc)


def write_atomically(destination: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(temporary_path)`, then rename the temporary file onto `destination`. Any
    failure or cancel removes the temporary file and leaves `destination` as it was."""
    destination = Path(destination)
    try:
        fd, temp_name = tempfile.mkstemp(
            prefix="." + destination.name[:64] + ".", suffix=".part", dir=destination.parent
        )
    except OSError as exc:
        raise ExportError(destination.parent, describe_os_error(exc)) from None
    os.close(fd)
    temp = Path(temp_name)
    try:
        write(temp)
        # mkstemp makes the file private (0600); a file written to share gets the mode any new
        # file of this user gets (0666 less the umask), as a plain open() would have given it.
        os.chmod(temp, 0o666 & ~_umask())
        os.replace(temp, destination)
    except OSError as exc:
        _remove(temp)
        raise ExportError(destination, describe_os_error(exc)) from None
    except BaseException:
        _remove(temp)
        raise
    return destination


def _umask() -> int:
    """This process's umask, read without os.umask (setting it to read it would race with other
    threads creating files). Linux says it in /proc; elsewhere the usual 022."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def run_export(
    destination: Path,
    export_format: ExportFormat,
    scope: ExportScope,
    chats: list[ChatSnapshot],
    step: Step,
) -> Path:
    """Write `chats` to `destination` in `export_format`; returns the path written. Only the
    chats `exported` keeps are written; a zip's manifest says how many empty ones were not."""
    kept = exported(chats, scope)
    empty, chats = len(chats) - len(kept), kept
    # Imported here: the PDF writer pulls in QtGui, which the zip and HTML exports do not need.
    if export_format == ExportFormat.ZIP:
        from app.export_zip import write_zip

        return write_atomically(
            destination, lambda temp: write_zip(temp, chats, scope, step, left_out_empty=empty)
        )
    if export_format == ExportFormat.HTML:
        from app.export_html import render_html

        def write_html(temp: Path) -> None:
            temp.write_text(render_html(chats, step), encoding="utf-8")

        return write_atomically(destination, write_html)
    from app.export_pdf import write_pdf

    return write_atomically(destination, lambda temp: write_pdf(temp, chats, step))
