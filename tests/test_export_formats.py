"""Export and share (issue 35): chats written as a zip of Markdown + JSON, as one self-contained
HTML page and as a PDF, checked as real files on disk: the zip's members and manifest, the page
parsed with html.parser (escaping, <details>, receipts as JSON data, no remote loads), the PDF's
text read back with QtPdf. The write is atomic: a cancel or a failure leaves no file."""

import json
import os
import threading
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from pypdf import PdfReader

from app.export_job import (
    ExportCancelled,
    ExportError,
    ExportFormat,
    ExportScope,
    cancellable_step,
    run_export,
    snapshot_chats,
)
from app.store import Store
from tests.test_app_import import RECEIPT, build_tree

HOSTILE = "<script>alert('x')</script> & </script><b>bold?</b>"


def no_progress(done, total):
    pass


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chats.db")
    yield s
    s.close()


def code_chat(store: Store) -> int:
    cid = store.create_conversation("Code & <things>", system_prompt="Answer in Python.")
    store.add_message(cid, "user", HOSTILE)
    store.add_message(
        cid,
        "assistant",
        "Here:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nDone.",
        reasoning="The user wants </script> a function.",
        receipt={**RECEIPT, "note": "</script><script>alert(1)</script>"},
    )
    return cid


# --- zip -------------------------------------------------------------------------------------------
def test_zip_holds_a_markdown_and_a_json_file_per_chat_and_a_manifest(store, tmp_path):
    first = build_tree(store)
    second = code_chat(store)
    third = store.create_conversation("Tree ✓")  # the same title as the first: numbered
    store.add_message(third, "user", "again")
    chats = snapshot_chats(store, [first, second, third], projects={second: "Work/secret"})
    out = tmp_path / "all.zip"
    steps = []
    written = run_export(
        out, ExportFormat.ZIP, ExportScope.EVERYTHING, chats, lambda d, t: steps.append((d, t))
    )
    assert written == out and steps == [(0, 3), (1, 3), (2, 3), (3, 3)]
    with zipfile.ZipFile(out) as archive:
        names = sorted(archive.namelist())
        assert names == sorted(
            [
                "manifest.json",
                "Tree _.md",  # "✓" is neither a letter nor a digit
                "Tree _.json",
                "Tree _ (2).md",
                "Tree _ (2).json",
                # the project's folder; "/" in its name is not a second folder
                "Work_secret/Code _ _things_.md",
                "Work_secret/Code _ _things_.json",
            ]
        )
        manifest = json.loads(archive.read("manifest.json"))
        tree_json = json.loads(archive.read("Tree _.json"))
        markdown = archive.read("Work_secret/Code _ _things_.md").decode("utf-8")
    assert manifest["format"] == "localchat-archive" and manifest["version"] == 1
    assert manifest["scope"] == "everything"
    # build_tree: 6 messages (every version), code_chat 2, the third 1
    assert manifest["counts"] == {"chats": 3, "messages": 9, "projects": 1}
    assert [c["project"] for c in manifest["chats"]] == [None, "Work/secret", None]
    assert manifest["chats"][1]["json"] == "Work_secret/Code _ _things_.json"
    # the JSON member is the full export: every version and each receipt
    assert len(tree_json["messages"]) == 6
    assert sum(1 for m in tree_json["messages"] if m["receipt"] is not None) == 3
    assert markdown.startswith("# Code & <things>\n") and "def add(a, b):" in markdown


# --- HTML ------------------------------------------------------------------------------------------
class PageParser(HTMLParser):
    """Collects what the checks need: tags, <details> summaries, script blocks, text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self.summaries: list[str] = []
        self.text: list[str] = []
        self._open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._open.append(tag)
        if tag == "script":
            self.scripts.append((dict(attrs), ""))

    def handle_endtag(self, tag):
        if tag in self._open:
            while self._open and self._open.pop() != tag:
                pass

    def handle_data(self, data):
        if self._open and self._open[-1] == "script":
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        elif self._open and self._open[-1] == "summary":
            self.summaries.append(data)
        else:
            self.text.append(data)


def test_html_page_is_escaped_folded_highlighted_and_carries_receipts(store, tmp_path):
    cid = code_chat(store)
    out = tmp_path / "chat.html"
    run_export(out, ExportFormat.HTML, ExportScope.CHAT, snapshot_chats(store, [cid]), no_progress)
    page = out.read_text(encoding="utf-8")
    parser = PageParser()
    parser.feed(page)
    tags = [tag for tag, _ in parser.tags]
    # The only scripts are the receipt's data block: the message's <script> is text.
    assert [attrs.get("type") for attrs, _ in parser.scripts] == ["application/json"]
    assert "b" not in tags  # the message's <b> is text too
    text = "".join(parser.text)
    assert HOSTILE in text
    assert "<p>&lt;script&gt;alert('x')&lt;/script&gt; &amp; &lt;/script&gt;&lt;b&gt;" in page
    # The receipt is the stored receipt, "</script>" inside it included, as JSON data.
    attrs, data = parser.scripts[0]
    assert "</script>" not in data
    assert json.loads(data) == {**RECEIPT, "note": "</script><script>alert(1)</script>"}
    assert attrs["class"] == "receipt"
    # Reasoning and system prompt folded; reasoning text inside them.
    assert {"Reasoning", "System prompt"} <= set(parser.summaries)
    assert "The user wants </script> a function." in text
    # Pygments coloured the Python block: "def" is a keyword span with a class.
    assert any(tag == "span" and attrs.get("class") == "k" for tag, attrs in parser.tags)
    assert "def" in text and "return" in text
    # Self-contained: inline CSS, dark scheme, nothing loaded from anywhere.
    assert "prefers-color-scheme: dark" in page
    assert not any(
        attrs.get("src") or (tag == "link" and attrs.get("href")) for tag, attrs in parser.tags
    )
    assert "default-src 'none'" in page


def test_html_tool_calls_and_results_are_folded(store, tmp_path):
    cid = store.create_conversation("Tools")
    store.add_message(cid, "user", "What is 2+3?")
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'},
    }
    store.add_message(cid, "assistant", "", tool={"tool_calls": [call]})
    store.add_message(
        cid,
        "tool",
        "5",
        tool={"tool_call_id": "call_1", "name": "calculator", "approval": "allowed once"},
    )
    out = tmp_path / "tools.html"
    run_export(out, ExportFormat.HTML, ExportScope.CHAT, snapshot_chats(store, [cid]), no_progress)
    parser = PageParser()
    parser.feed(out.read_text(encoding="utf-8"))
    assert "Tool call calculator" in parser.summaries
    assert "Result of calculator (allowed once)" in parser.summaries
    detail_classes = [attrs.get("class") for tag, attrs in parser.tags if tag == "details"]
    assert detail_classes == ["tool-call", "tool-result"]
    assert '"expression": "2+3"' in "".join(parser.text)


def test_html_of_many_chats_has_a_contents_list(store, tmp_path):
    ids = [store.create_conversation(f"Chat {n}") for n in range(3)]
    for cid in ids:
        store.add_message(cid, "user", f"hello from {cid}")
    out = tmp_path / "all.html"
    chats = snapshot_chats(store, ids, projects={ids[1]: "Garden"})
    run_export(out, ExportFormat.HTML, ExportScope.EVERYTHING, chats, no_progress)
    parser = PageParser()
    parser.feed(out.read_text(encoding="utf-8"))
    links = [attrs["href"] for tag, attrs in parser.tags if tag == "a"]
    articles = [attrs["id"] for tag, attrs in parser.tags if tag == "article"]
    assert links == ["#chat-1", "#chat-2", "#chat-3"] and articles == ["chat-1", "chat-2", "chat-3"]
    assert "Project: Garden" in "".join(parser.text)


# --- PDF -------------------------------------------------------------------------------------------
def pdf_text(path: Path) -> tuple[int, str]:
    """Page count and text of the PDF, read by pypdf (not by Qt, which wrote it)."""
    reader = PdfReader(path)
    return len(reader.pages), "\n".join(page.extract_text() for page in reader.pages)


def test_pdf_holds_each_chat_on_its_own_pages(qapp, store, tmp_path):
    first = code_chat(store)
    second = store.create_conversation("Second chat")
    store.add_message(second, "user", "Where do moths go in winter?")
    out = tmp_path / "chats.pdf"
    steps = []
    run_export(
        out,
        ExportFormat.PDF,
        ExportScope.EVERYTHING,
        snapshot_chats(store, [first, second]),
        lambda d, t: steps.append(d),
    )
    assert out.read_bytes()[:5] == b"%PDF-"
    # chats printed, counted after each page: the first chat once page 1 is out, then both
    assert steps[-2:] == [1, 2] and steps == sorted(steps)
    pages, text = pdf_text(out)
    assert pages == 2  # a page break before the second chat
    # pypdf splits some words at kerning gaps ("C ode"): compare without spaces.
    flat = "".join(text.split())
    for expected in (
        "Code & <things>",
        HOSTILE,
        "def add(a, b):",
        "The user wants </script> a function.",  # reasoning is printed
        "Where do moths go in winter?",
        "1 / 2",  # page numbers
        "2 / 2",
    ):
        assert "".join(expected.split()) in flat


# --- writing safely --------------------------------------------------------------------------------
@pytest.mark.parametrize("export_format", list(ExportFormat))
def test_a_cancelled_export_leaves_no_file(qapp, store, tmp_path, export_format):
    ids = [store.create_conversation(f"Chat {n}") for n in range(4)]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    cancel = threading.Event()

    def cancel_after_two(done, total):
        if done == 2:
            cancel.set()  # the user pressed Cancel while the third chat was rendered

    step = cancellable_step(cancel, cancel_after_two)
    chats = snapshot_chats(store, ids)
    with pytest.raises(ExportCancelled):
        run_export(
            out_dir / f"x{export_format.extension}", export_format, ExportScope.CHAT, chats, step
        )
    assert list(out_dir.iterdir()) == []


def test_a_cancelled_export_keeps_an_older_file_of_that_name(store, tmp_path):
    cid = store.create_conversation("Chat")
    old = tmp_path / "chat.html"
    old.write_text("yesterday's export", encoding="utf-8")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ExportCancelled):
        run_export(
            old,
            ExportFormat.HTML,
            ExportScope.CHAT,
            snapshot_chats(store, [cid]),
            cancellable_step(cancel, no_progress),
        )
    assert old.read_text(encoding="utf-8") == "yesterday's export"
    assert list(tmp_path.glob("*.part")) == [] and list(tmp_path.glob(".*")) == []


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot create files in: chmod 555, or for root (which ignores
    permissions) Linux's /sys, which refuses new files to everyone."""
    if os.geteuid() != 0:
        folder = tmp_path / "locked"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
    elif Path("/sys/kernel").is_dir():
        yield Path("/sys")
    else:
        pytest.skip("running as root without a read-only folder")


def test_export_to_a_read_only_folder_names_the_folder(store, read_only_folder):
    cid = store.create_conversation("Chat")
    before = sorted(read_only_folder.iterdir())
    with pytest.raises(ExportError) as caught:
        run_export(
            read_only_folder / "chat.zip",
            ExportFormat.ZIP,
            ExportScope.CHAT,
            snapshot_chats(store, [cid]),
            no_progress,
        )
    assert caught.value.path == read_only_folder
    assert "cannot be written" in caught.value.problem
    assert str(read_only_folder) in str(caught.value)
    assert sorted(read_only_folder.iterdir()) == before


def test_a_full_disk_is_named_and_leaves_no_file(store, tmp_path, monkeypatch):
    cid = store.create_conversation("Chat")
    store.add_message(cid, "user", "hi")
    real_write_text = Path.write_text

    def disk_full(self, *args, **kwargs):
        real_write_text(self, "partial", encoding="utf-8")  # some bytes got out first
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    out = tmp_path / "chat.html"
    with pytest.raises(ExportError) as caught:
        run_export(
            out, ExportFormat.HTML, ExportScope.CHAT, snapshot_chats(store, [cid]), no_progress
        )
    assert caught.value.path == out and caught.value.problem == "the disk is full"
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("chats.db")] == []


def test_an_exported_file_gets_the_users_usual_mode_not_a_private_temp_files(tmp_path):
    # Written through a temp file (mkstemp: 0600) and renamed: a shared export must not stay
    # private to this user while every other new file of theirs is readable by the group.
    import os
    import stat

    from app.export_job import write_atomically

    old = os.umask(0o022)
    try:
        target = write_atomically(tmp_path / "chat.html", lambda p: p.write_text("<p>hi</p>"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
