"""Read a LocalChat zip export (app/export_zip.py) back: its manifest.json names each chat's JSON
member and project; each member is read as a JSON export (app/chat_import.py: every version of
every message and each reply's receipt) with its compactions (summaries, each covering messages
by their ids in that file) and the store imports them all in one transaction
(Store.import_conversations, which gives the messages new ids and maps the summaries to them),
so a bad archive adds nothing.

The archive is hostile input. Before a byte is unpacked: its size, its number of members, the
sizes its members declare (one and all together: a zip bomb) and every member's name (no
absolute paths, no "..", no backslashes or drive letters: nothing that could escape a folder if
unpacked, and no name twice) are checked; each member is then read no further than its declared
size, so a header that lies is caught too. The manifest is type-checked like the chats. Any
problem raises ChatImportError naming the archive and the problem."""

from __future__ import annotations

import json
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import NoReturn

from app.chat_import import MAX_IMPORT_BYTES, MAX_IMPORT_MESSAGES, ImportedChat, parse_chat_export
from app.export_zip import ARCHIVE_FORMAT, ARCHIVE_VERSION, MANIFEST_NAME
from app.names import InvalidNameError, clean_name
from engine.errors import ChatImportError

READABLE_ARCHIVE_VERSIONS = (ARCHIVE_VERSION,)
# The zip itself: exports of a few hundred long chats are tens of MB compressed.
MAX_ARCHIVE_BYTES = 512 * 2**20
# What all members together may unpack to, and how many chats and messages one import may add
# (the window must still open with them: app/chat_import.py says what 150,000 messages did).
MAX_UNPACKED_BYTES = 1024 * 2**20
MAX_ARCHIVE_CHATS = 5_000
MAX_ARCHIVE_MESSAGES = 5 * MAX_IMPORT_MESSAGES
MAX_MEMBERS = 2 * MAX_ARCHIVE_CHATS + 1  # a .md and a .json per chat, and the manifest
MAX_MANIFEST_BYTES = 8 * 2**20


@dataclass(frozen=True)
class ImportedCompaction:
    """A summary as the file has it: `covered` are message keys of its chat's file (checked to
    be there), not database ids."""

    covered: tuple[int, ...]
    summary: str
    active: bool
    receipt: dict | None
    created_at: float


@dataclass(frozen=True)
class ImportedArchive:
    chats: tuple[ImportedChat, ...]
    projects: tuple[str | None, ...]  # chats[i]'s project name, None for none
    # chats[i]'s compactions, oldest first (an archive written before they were exported: none)
    compactions: tuple[tuple[ImportedCompaction, ...], ...] = ()


def is_archive(path: Path | str) -> bool:
    """Whether `path` looks like a zip (by its first bytes, not its name)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def read_archive(path: Path | str) -> ImportedArchive:
    """Read and validate the zip export at `path`; raises ChatImportError naming the problem."""
    path = Path(path)
    try:
        if not path.is_file():
            raise ChatImportError(path, "not a regular file")
        size = path.stat().st_size
        if size > MAX_ARCHIVE_BYTES:
            raise ChatImportError(
                path, f"the archive is {size:,} bytes; the limit is {MAX_ARCHIVE_BYTES:,}"
            )
        with zipfile.ZipFile(path) as archive:
            return _ArchiveReader(path, archive).read()
    except zipfile.BadZipFile as exc:
        raise ChatImportError(path, f"not a readable zip archive ({exc})") from None
    except OSError as exc:
        raise ChatImportError(path, f"cannot be read ({exc.strerror or exc})") from None


class _ArchiveReader:
    def __init__(self, path: Path, archive: zipfile.ZipFile):
        self.path, self.archive = path, archive

    def fail(self, problem: str) -> NoReturn:
        raise ChatImportError(self.path, problem)

    def read(self) -> ImportedArchive:
        members = self.check_members()
        manifest = self.manifest(members)
        entries = manifest["chats"]
        chats, projects, compactions = [], [], []
        messages = 0
        for index, entry in enumerate(entries):
            member = self.member_name(entry, index, members)
            project = self.project_name(entry, index)
            raw = self.unpack(members[member], MAX_IMPORT_BYTES)
            try:
                chat = parse_chat_export(raw, member)
            except ChatImportError as exc:
                self.fail(f"{member}: {exc.problem}")
            compactions.append(self.compactions(raw, chat, member))
            messages += len(chat.messages)
            if messages > MAX_ARCHIVE_MESSAGES:
                self.fail(
                    f"the archive holds more than {MAX_ARCHIVE_MESSAGES:,} messages, the limit "
                    "for one import"
                )
            chats.append(chat)
            projects.append(project)
        return ImportedArchive(tuple(chats), tuple(projects), tuple(compactions))

    # --- compactions --------------------------------------------------------------------------
    def compactions(
        self, raw: bytes, chat: ImportedChat, member: str
    ) -> tuple[ImportedCompaction, ...]:
        """The chat's "compactions" (absent: none). parse_chat_export has already checked the
        member is UTF-8 JSON no deeper than the limit."""
        items = json.loads(raw.decode("utf-8")).get("compactions")
        if items is None:
            return ()
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            self.fail(f'{member}: "compactions" is not a list of objects')
        keys = {m.key for m in chat.messages}
        result = []
        for n, item in enumerate(items, start=1):
            where = f"{member}: compaction {n}"
            covered = item.get("covered")
            if (
                not isinstance(covered, list)
                or not covered
                or not all(type(k) is int for k in covered)
            ):
                self.fail(f'{where}: "covered" is not a list of message ids')
            missing = [k for k in covered if k not in keys]
            if missing:
                self.fail(f"{where} covers message {missing[0]}, which is not in the chat")
            summary = item.get("summary")
            if not isinstance(summary, str) or not summary.strip():
                self.fail(f'{where}: "summary" is not a non-empty text')
            active = item.get("active", False)
            if not isinstance(active, bool):
                self.fail(f'{where}: "active" is not true or false')
            receipt = item.get("receipt")
            if receipt is not None and not isinstance(receipt, dict):
                self.fail(f'{where}: "receipt" is not an object')
            created_at = item.get("created_at", 0.0)
            if type(created_at) not in (int, float):
                self.fail(f'{where}: "created_at" is not a number')
            result.append(
                ImportedCompaction(tuple(covered), summary, active, receipt, float(created_at))
            )
        if sum(c.active for c in result) > 1:
            # The chat would show two summaries standing in for overlapping messages.
            self.fail(f"{member}: more than one compaction is active")
        return tuple(result)

    # --- members ------------------------------------------------------------------------------
    def check_members(self) -> dict[str, zipfile.ZipInfo]:
        infos = self.archive.infolist()
        if len(infos) > MAX_MEMBERS:
            self.fail(f"the archive has {len(infos):,} members; the limit is {MAX_MEMBERS:,}")
        members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            problem = unsafe_member_name(info.filename)
            if problem:
                self.fail(f"member {info.filename!r} {problem}")
            if info.filename in members:
                self.fail(f"member {info.filename!r} appears twice")
            if info.flag_bits & 0x1:
                self.fail(f"member {info.filename!r} is encrypted")
            members[info.filename] = info
        unpacked = sum(info.file_size for info in infos)
        if unpacked > MAX_UNPACKED_BYTES:
            self.fail(
                f"the archive unpacks to {unpacked:,} bytes; the limit is "
                f"{MAX_UNPACKED_BYTES:,} (a zip bomb?)"
            )
        return members

    def unpack(self, info: zipfile.ZipInfo, limit: int) -> bytes:
        if info.file_size > limit:
            self.fail(
                f"member {info.filename!r} unpacks to {info.file_size:,} bytes; the limit is "
                f"{limit:,}"
            )
        try:
            with self.archive.open(info) as f:
                data = f.read(info.file_size + 1)
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            self.fail(f"member {info.filename!r} is damaged ({exc})")
        except (NotImplementedError, RuntimeError) as exc:  # unknown compression, encryption
            self.fail(f"member {info.filename!r} cannot be unpacked ({exc})")
        if len(data) > info.file_size:
            self.fail(f"member {info.filename!r} unpacks to more than its header says")
        return data

    # --- the manifest -------------------------------------------------------------------------
    def manifest(self, members: dict[str, zipfile.ZipInfo]) -> dict:
        if MANIFEST_NAME not in members:
            self.fail(f"no {MANIFEST_NAME}: not a LocalChat archive")
        raw = self.unpack(members[MANIFEST_NAME], MAX_MANIFEST_BYTES)
        try:
            data = json.loads(raw.decode("utf-8"))
        except RecursionError:
            self.fail(f"{MANIFEST_NAME} is nested too deeply")
        except (UnicodeDecodeError, ValueError) as exc:
            self.fail(f"{MANIFEST_NAME} is not valid JSON ({exc})")
        if not isinstance(data, dict):
            self.fail(f"{MANIFEST_NAME}: the top level is not a JSON object")
        if data.get("format") != ARCHIVE_FORMAT:
            self.fail(
                f'{MANIFEST_NAME}: "format" is {data.get("format")!r}, not {ARCHIVE_FORMAT!r}'
            )
        version = data.get("version")
        if type(version) is not int or version not in READABLE_ARCHIVE_VERSIONS:
            self.fail(
                f'{MANIFEST_NAME}: "version" is {version!r}; this app reads archive versions '
                + ", ".join(str(v) for v in READABLE_ARCHIVE_VERSIONS)
            )
        entries = data.get("chats")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            self.fail(f'{MANIFEST_NAME}: "chats" is not a list of objects')
        if not entries:
            self.fail(f"{MANIFEST_NAME} lists no chats: there is nothing to import")
        if len(entries) > MAX_ARCHIVE_CHATS:
            self.fail(
                f"the archive lists {len(entries):,} chats; the limit is {MAX_ARCHIVE_CHATS:,}"
            )
        counts = data.get("counts")
        declared = counts.get("chats") if isinstance(counts, dict) else None
        if type(declared) is not int or declared != len(entries):
            self.fail(
                f'{MANIFEST_NAME}: "counts.chats" is {declared!r} but "chats" lists {len(entries)}'
            )
        return data

    def project_name(self, entry: dict, index: int) -> str | None:
        """The chat's project as a name the app accepts (app/names.py), None for no project."""
        project = entry.get("project")
        if project is None:
            return None
        if not isinstance(project, str):
            self.fail(f'manifest chat {index + 1}: "project" is {type(project).__name__}, not text')
        try:
            return clean_name(project, "project name")
        except InvalidNameError as exc:
            self.fail(f"manifest chat {index + 1}: {exc}")

    def member_name(self, entry: dict, index: int, members: dict[str, zipfile.ZipInfo]) -> str:
        member = entry.get("json")
        if not isinstance(member, str):
            self.fail(f'manifest chat {index + 1}: "json" is not a member name')
        if member not in members:
            self.fail(f"manifest chat {index + 1}: member {member!r} is not in the archive")
        return member


def unsafe_member_name(name: str) -> str:
    """Why `name` could escape the folder it is unpacked into ("" when it cannot)."""
    if not name or "\x00" in name:
        return "has an empty name or a NUL character"
    if "\\" in name:
        return "has a backslash (a Windows path)"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "is an absolute path"
    if ".." in PurePosixPath(name).parts:
        return 'climbs out of the archive with ".."'
    return ""
