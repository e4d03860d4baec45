"""Documents in a chat (issue 34): the wiring between the Documents panel, the chat session and
engine/documents (index, retrieve, context, record).

- A chat can use one collection (app/chat_documents.py remembers which, with its source budget
  and top-k). Attaching files or folders (the paperclip, drag and drop, the panel) indexes them
  into the chat's collection, made on first use and named after what was attached; any
  existing collection can be picked instead, so one collection serves many chats. Collections
  live in <data dir>/collections, where `python -m engine index` writes them too.
- Indexing runs on its own thread (app/features/index_runner.py) with progress and cancel.
- Each reply of a chat with documents carries the top passages for the user's question within
  the chat's token budget, in the system message with numbered markers ([1] file p.3 >
  Heading); the session calls `apply` when it starts a reply (a tool round's continuation
  reuses the turn's sources, so every request of a turn sees the same prompt). Finding them
  embeds the question, so it runs on a thread of its own while the reply row is already open
  ("Finding sources…"); Stop meanwhile ends the reply as cancelled (`cancel_retrieval`).
- The passages, their chunk ids, text hashes and texts, what was left out and the retrieval
  settings go into the reply's receipt (engine.receipt.with_sources). A replay runs the recorded
  prompt (which holds the recorded texts) and `replay_note` says whether the collection still
  holds those passages unchanged; a reply's Details check the same on a thread
  (`check_passages`).
- engine.documents loads numpy and the window opens before numpy is loaded, so its modules are
  imported inside the functions that use them, most of which run on those threads.

Token counts for the budget come from the embedding model's tokenizer: the chat model lives on
the engine's worker thread, and a count made here must not wait for a generation. WordPiece
counts are close to a chat model's BPE counts for prose; the panel says the budget is
approximate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QWidget

from app.chat_documents import ChatDocumentSettings, ChatDocumentsFile
from app.features.index_runner import EmbedderCache, IndexRunner
from app.features.prefill_progress import GENERATING
from engine.errors import EngineError
from engine.types import GenerationRequest, Role

if TYPE_CHECKING:
    # engine.documents loads numpy, and the window opens before numpy is loaded: its modules
    # are imported inside the functions that use them (most run on a thread).
    from engine.documents.collection import FileRecord
    from engine.documents.embedder import TextEmbedder
    from engine.documents.index import IndexProgress, IndexReport

COLLECTIONS_DIR = "collections"
FINDING_SOURCES = "Finding sources… (Esc to stop)"

# What `apply` hands back when the request is ready: the request (with the passages in its system
# message) and the receipt section recording them (None: no sources).
SourcesReady = Callable[[GenerationRequest, "dict | None"], None]


class DocumentsController(QObject):
    changed = Signal()  # the open chat's collection, its files or its settings changed
    progress = Signal(object)  # IndexProgress of the running index
    indexingChanged = Signal(bool)
    reportReady = Signal(str, list, list)  # summary line, problems (each naming its file), paths
    problem = Signal(str)  # something the user must know (no embedding model, a bad name...)
    statusText = Signal(str)  # the chat's status line while a reply's sources are found
    # from the retrieval thread (queued to the GUI thread): job, sources text, section, error
    _retrieved = Signal(int, object, object, str)
    _checked = Signal(object, object, str)  # check_passages: its callback, states, note

    def __init__(
        self,
        session,
        data_dir: Path,
        loader: Callable[[str | None], TextEmbedder] | None = None,  # None: the GGUF files
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.session, self.store = session, session.store
        self.root = Path(data_dir) / COLLECTIONS_DIR
        self.chats = ChatDocumentsFile(Path(data_dir) / "chat_documents.json")
        # Two caches: indexing holds its model's lock for a whole batch (seconds on a busy
        # machine), and the question's embedding at send time must not wait behind it.
        self.embedders = EmbedderCache(loader)
        self.query_embedders = EmbedderCache(loader)
        self.runner = IndexRunner(self.embedders, self)
        self.runner.progress.connect(self.progress)
        self.runner.finished.connect(self._on_index_finished)
        self.last_report: IndexReport | None = None
        self._indexing: str | None = None  # the collection being indexed
        self._turn: tuple[int, str, dict] | None = None  # cid, sources text, receipt section
        # the retrieval a reply waits for: job number, cid, the request, where it goes when ready
        self._pending: tuple[int, int, GenerationRequest, SourcesReady] | None = None
        self._jobs = 0
        self._retrieved.connect(self._on_retrieved)
        self._checked.connect(self._on_checked)
        self._panel = self._chat_view = self._window = None  # set by attach_views
        self.sources_dialog: QWidget | None = None  # the last Sources dialog opened
        session.documents = self  # the session asks `apply` and `replay_note` (duck-typed)
        session.conversationOpened.connect(lambda *_: self.changed.emit())
        session.conversationOpened.connect(lambda *_: self._preload())

    def use_loader(self, loader: Callable[[str | None], TextEmbedder]) -> None:
        """Load embedding models another way (tests: a small deterministic one)."""
        self.embedders = EmbedderCache(loader)
        self.query_embedders = EmbedderCache(loader)
        self.runner.embedders = self.embedders

    # --- the open chat ---------------------------------------------------------------------------
    def _key(self, cid: int | None) -> str | None:
        conv = self.store.conversation(cid) if cid is not None else None
        return None if conv is None else ChatDocumentsFile.key(conv.id, conv.created_at)

    def settings_for(self, cid: int | None) -> ChatDocumentSettings | None:
        key = self._key(cid)
        return None if key is None else self.chats.get(key)

    def current(self) -> ChatDocumentSettings | None:
        return self.settings_for(self.session.conversation_id)

    def _set_current(self, settings: ChatDocumentSettings | None, cid: int | None = None) -> None:
        key = self._key(cid if cid is not None else self.session.conversation_id)
        if key is None:
            return
        if not self.chats.set(key, settings):
            self.problem.emit(self.chats.problem or "The chat's documents could not be saved.")
        self.changed.emit()

    @property
    def indexing(self) -> bool:
        return self.runner.running

    @property
    def indexing_collection(self) -> str | None:
        return self._indexing

    def collection_names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.sqlite3"))

    def files(self) -> list[FileRecord]:
        """The open chat's collection's files with their status and problems."""
        settings = self.current()
        if settings is None or settings.collection not in self.collection_names():
            return []
        from engine.documents.collection import Collection

        try:
            with Collection.open(settings.collection, self.root, create=False) as collection:
                return collection.files()
        except EngineError as exc:
            self.problem.emit(str(exc))
            return []

    # --- what the user does ----------------------------------------------------------------------
    def attach(self, paths: list[str]) -> bool:
        """Index files or folders into the open chat's collection (made on first use, named
        after the first path). False, with `problem`, when it cannot start."""
        paths = [str(p) for p in paths if str(p).strip()]
        if not paths:
            return False
        if self.indexing:
            self.problem.emit("Indexing is already running; wait for it or cancel it first.")
            return False
        cid = self.session.ensure_conversation()
        settings = self.settings_for(cid)
        if settings is None:
            settings = ChatDocumentSettings(self._new_name(Path(paths[0]).name))
            self._set_current(settings, cid)
        return self._start(settings.collection, paths)

    def reindex(self) -> bool:
        """Bring the open chat's collection up to date with its files on disk (changed files
        only; files removed from disk are dropped)."""
        settings = self.current()
        if settings is None or self.indexing:
            return False
        return self._start(settings.collection, [f.path for f in self.files()])

    def _start(self, name: str, paths: list[str]) -> bool:
        if not self.runner.start(self.root, name, paths):
            return False
        self._indexing = name
        if self._panel is not None:
            self._panel.show_report("", [])  # the last run's report and problems go
        self.indexingChanged.emit(True)
        return True

    def use_collection(self, name: str) -> bool:
        """Make an existing collection (or a new empty one) the open chat's."""
        from engine.documents.collection import check_name

        try:
            check_name(name)
        except EngineError as exc:
            self.problem.emit(str(exc))
            return False
        self.session.ensure_conversation()
        old = self.current()
        base = old if old is not None else ChatDocumentSettings(name)
        self._set_current(dataclasses.replace(base, collection=name))
        return True

    def detach(self) -> None:
        """The chat stops using documents (the collection itself is kept for other chats)."""
        self._set_current(None)

    def set_budget(self, tokens: int) -> None:
        settings = self.current()
        if settings is not None and settings.budget_tokens != tokens:
            self._set_current(dataclasses.replace(settings, budget_tokens=tokens))

    def set_top_k(self, k: int) -> None:
        settings = self.current()
        if settings is not None and settings.top_k != k:
            self._set_current(dataclasses.replace(settings, top_k=k))

    def cancel_indexing(self) -> None:
        self.runner.cancel()

    def _new_name(self, hint: str) -> str:
        """A collection name from a file or folder name: the characters a name allows, and a
        number after it when that name is taken."""
        base = re.sub(r"[^\w .-]+", " ", Path(hint).stem or hint).strip(" .-")[:56].strip()
        if not base or not re.match(r"\w", base):
            base = "Documents"
        taken = set(self.collection_names())
        name, n = base, 2
        while name in taken:
            name, n = f"{base} {n}", n + 1
        return name

    def _on_index_finished(self, name: str, report: IndexReport | None, error: str) -> None:
        self._indexing = None
        self.last_report = report
        self.indexingChanged.emit(False)
        if error:
            self.problem.emit(error)
        if report is not None:
            from app.features.index_runner import describe_report, problem_lines

            self.reportReady.emit(
                describe_report(report), problem_lines(report), [p.path for p in report.problems]
            )
        self.changed.emit()

    def _preload(self) -> None:
        """Load the open chat's embedding model on a thread, so the first question does not
        wait for it on the GUI thread."""
        settings = self.current()
        if settings is None or settings.collection not in self.collection_names():
            return

        def load() -> None:
            # a failure is said when a question needs the model (apply), not here
            with contextlib.suppress(Exception):
                from engine.documents.collection import Collection

                with Collection.open(settings.collection, self.root, create=False) as collection:
                    path = collection.embed_model_path
                if not self.query_embedders.loaded(path):
                    self.query_embedders.get(path)

        threading.Thread(target=load, name="embedder-preload", daemon=True).start()

    # --- the session's hooks ---------------------------------------------------------------------
    def apply(
        self, cid: int, request: GenerationRequest, continuing: bool, done: SourcesReady
    ) -> None:
        """Give `done` the request with the chat's sources in its system message and the receipt
        section that records them; the request as it was when the chat has no documents.

        Finding the sources embeds the question (a forward pass of the encoder, and its model
        load when the preload has not finished) and searches the collection, so it runs on a
        thread and `done` is called later, on the GUI thread; the status line says "Finding
        sources…" meanwhile and `cancel_retrieval` drops it. A chat without documents and a
        tool round's continuation (which reuses the turn's sources, so every request of a turn
        sees the same prompt) call `done` at once."""
        settings = self.settings_for(cid)
        if settings is None or request.messages is None:
            self._turn = None
            done(request, None)
            return
        if continuing and self._turn is not None and self._turn[0] == cid:
            _, text, section = self._turn
            done(with_sources_text(request, text), section)
            return
        question = next(
            (m.get("content") or "" for m in reversed(request.messages) if m["role"] == Role.USER),
            "",
        )
        self._jobs += 1
        job = self._jobs
        self._pending = (job, cid, request, done)
        self.statusText.emit(FINDING_SOURCES)

        def run() -> None:
            try:
                text, section = self.retrieve(settings, question)
            except (EngineError, OSError, ValueError) as exc:
                self._tell(job, None, None, f"No sources were added to this reply: {exc}")
            except Exception as exc:  # a bug must reach the user, not leave the reply waiting
                self._tell(
                    job,
                    None,
                    None,
                    f"No sources were added to this reply: {type(exc).__name__}: {exc}",
                )
            else:
                self._tell(job, text, section, "")

        threading.Thread(target=run, name="retrieve-sources", daemon=True).start()

    def _tell(self, job: int, text: str | None, section: dict | None, error: str) -> None:
        # the window may have closed (this object deleted) while the thread worked
        with contextlib.suppress(RuntimeError):
            self._retrieved.emit(job, text, section, error)

    def _on_retrieved(self, job: int, text: str | None, section: dict | None, error: str) -> None:
        pending = self._pending
        if pending is None or pending[0] != job:
            return  # its reply was stopped while the sources were found
        self._pending = None
        _, cid, request, done = pending
        self.statusText.emit(GENERATING)
        if error or text is None or section is None:
            self._turn = None
            self.problem.emit(error)
            done(request, None)  # the reply goes on without sources
            return
        self._turn = (cid, text, section)
        done(with_sources_text(request, text), section)

    @property
    def retrieving(self) -> bool:
        """Whether a reply waits for its sources."""
        return self._pending is not None

    def cancel_retrieval(self) -> bool:
        """Drop the sources a reply waits for (Stop): its `done` is never called and the thread's
        result, when it comes, is ignored. True when one was waiting."""
        if self._pending is None:
            return False
        self._pending = None
        self._turn = None
        self.statusText.emit("")
        return True

    def retrieve(self, settings: ChatDocumentSettings, question: str) -> tuple[str, dict]:
        """(the sources block, the receipt section) for `question` from the chat's collection.
        Runs on the retrieval thread (`apply`)."""
        from engine.documents.collection import Collection
        from engine.documents.context import build_context
        from engine.documents.record import sources_record
        from engine.documents.retrieve import CANDIDATES_PER_LIST, RetrievalSettings, retrieve

        with Collection.open(settings.collection, self.root, create=False) as collection:
            embedder = self.query_embedders.get(collection.embed_model_path)
            retrieval = retrieve(
                collection,
                embedder,
                question,
                RetrievalSettings(
                    top_k=settings.top_k,
                    candidates=max(settings.top_k, 8) * CANDIDATES_PER_LIST,
                ),
            )
            block = build_context(retrieval.results, embedder.count_tokens, settings.budget_tokens)
            section = sources_record(collection, retrieval, block)
        # The texts too: the Sources view and a citation show the passage as the model saw it,
        # even after the file changed or the collection was deleted.
        for entry, source in zip(section["sources"], block.included, strict=True):
            entry["text"] = source.item.chunk.text
        for entry, source in zip(section["left_out"], block.left_out, strict=True):
            entry["text"] = source.item.chunk.text
        section["token_counter"] = "embedding model"
        return block.text, section

    def replay_note(self, receipt: dict | None) -> str | None:
        """What a replay of a reply with sources says about them, among the receipt's
        differences: None while the collection holds every recorded passage unchanged."""
        section = (receipt or {}).get("sources")
        if not isinstance(section, dict) or not section.get("sources"):
            return None
        n = len(section["sources"])
        used = f"The replay used the {n} recorded passage{'s' if n != 1 else ''}"
        name = str(section.get("collection") or "")
        from engine.documents.collection import Collection
        from engine.documents.record import changed_since

        try:
            with Collection.open(name, self.root, create=False) as collection:
                changed = changed_since(collection, section)
        except EngineError:
            return f"{used}; the collection {name!r} is gone, so they were not checked against it."
        if not changed:
            return None
        what = ", ".join(
            f"[{c.marker}] {Path(c.file).name} ({'changed' if c.why == 'changed' else 'no longer indexed'})"
            for c in changed
        )
        return (
            f"{used}, as they were; the documents changed since: {what}. A new reply would "
            "retrieve from the current text."
        )

    def check_passages(
        self, section: dict, done: Callable[[dict[int, str] | None, str], None]
    ) -> None:
        """Give `done` how each passage a receipt's sources section records stands in its
        collection now (chunk id -> "unchanged", "changed" or "removed"), or None and why when
        the collection is gone. Reads the collection on a thread (it loads numpy and the index);
        `done` runs on the GUI thread, and not at all when its dialog was closed meanwhile."""
        name = str(section.get("collection") or "")
        root = self.root

        def run() -> None:
            states: dict[int, str] | None = None
            note = ""
            try:
                from engine.documents.collection import Collection
                from engine.documents.record import changed_since

                with Collection.open(name, root, create=False) as collection:
                    changed = {c.chunk_id: c.why for c in changed_since(collection, section)}
                states = {
                    int(s["chunk_id"]): changed.get(int(s["chunk_id"]), "unchanged")
                    for s in section.get("sources") or []
                }
            except (EngineError, OSError, ValueError, KeyError, TypeError) as exc:
                note = (
                    f"The passages could not be checked: the collection {name!r} is gone ({exc})."
                )
            with contextlib.suppress(RuntimeError):  # the window closed meanwhile
                self._checked.emit(done, states, note)

        threading.Thread(target=run, name="check-passages", daemon=True).start()

    def _on_checked(self, done: Callable, states: dict[int, str] | None, note: str) -> None:
        with contextlib.suppress(RuntimeError):  # its dialog was closed (and deleted) meanwhile
            done(states, note)

    def shutdown(self) -> None:
        self.runner.cancel()
        self.runner.wait(10)

    # --- the window ------------------------------------------------------------------------------
    def attach_views(self, panel, chat_view, attach_button, window) -> None:
        """Wire the Documents panel, the paperclip, drops on the chat and the replies' citations
        (MainWindow calls this once)."""
        from app.chat_documents import BUDGET_RANGE, TOP_K_RANGE
        from app.features.index_runner import describe_progress
        from app.views.documents_panel import FileDropFilter

        self._panel, self._chat_view, self._window = panel, chat_view, window
        panel.set_ranges(BUDGET_RANGE, TOP_K_RANGE)
        panel.filesChosen.connect(self.attach)
        attach_button.filesChosen.connect(self._attach_and_show)
        panel.collectionChosen.connect(self.use_collection)
        panel.detachRequested.connect(self.detach)
        panel.reindexRequested.connect(self.reindex)
        panel.cancelRequested.connect(self.cancel_indexing)
        panel.budgetChanged.connect(self.set_budget)
        panel.topKChanged.connect(self.set_top_k)
        self.changed.connect(self.refresh_panel)
        self.indexingChanged.connect(lambda _running: self.refresh_panel())
        self.progress.connect(lambda p: panel.show_progress(p, describe_progress(p)))
        self.indexingChanged.connect(
            lambda running: panel.show_starting() if running else panel.show_progress(None)
        )
        self.reportReady.connect(panel.show_report)
        self.problem.connect(panel.show_problem)
        self._drops = FileDropFilter(self)
        self._drops.watch(chat_view)
        self._drops.watch(chat_view.viewport())
        self._drops.dropped.connect(self._attach_and_show)
        chat_view.sourcesRequested.connect(self.show_sources)
        self.session.conversationOpened.connect(lambda *_: self.show_citations())
        self.session.replyFinished.connect(lambda *_: self.show_citations())
        self.session.replyFinished.connect(self._show_last_use)
        self.session.conversationOpened.connect(lambda *_: panel.show_last_use(None))
        self.refresh_panel()

    def _attach_and_show(self, paths: list[str]) -> None:
        """From the paperclip or a drop: index, and bring the panel forward to show progress."""
        if self.attach(paths) and self._panel is not None:
            show = getattr(self._window, "show_documents_panel", None)
            if show is not None:
                show()

    def refresh_panel(self) -> None:
        if self._panel is None:
            return
        if self.chats.problem:
            self._panel.show_problem(self.chats.problem)
        self._panel.show_state(self.current(), self.collection_names(), self.files(), self.indexing)

    def _show_last_use(self, message) -> None:
        """The panel says what the reply's sources took of the budget."""
        if self._panel is None or self.current() is None:
            return
        from app.views.sources_view import reply_sources

        self._panel.show_last_use(reply_sources(message.receipt or self.store.receipt(message.id)))

    def show_citations(self) -> None:
        """Give each reply of the open chat its sources (read from its receipt), so its [n]
        markers link to the passages. Only in a chat with documents: receipts are read from the
        store one by one, which a chat without them need not pay for."""
        if self._chat_view is None or self.current() is None:
            return
        from app.views.sources_view import reply_sources

        for widget in self._chat_view.widgets:
            if widget.message.role == Role.ASSISTANT and widget.sources is None:
                receipt = widget.message.receipt or self.store.receipt(widget.message.id)
                widget.set_sources(reply_sources(receipt))

    def show_sources(self, message_id: int, marker: int) -> None:
        """The Sources dialog of a reply, on the passage of `marker` (0: the first)."""
        from app.views.sources_view import SourcesDialog, reply_sources

        section = reply_sources(self.store.receipt(message_id))
        if section is None:
            self.problem.emit("This reply has no sources recorded in its receipt.")
            return
        dialog = SourcesDialog(section, marker or None, self._window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.sources_dialog = dialog  # kept for tests and so it is not collected while open
        dialog.show()


def with_sources_text(request: GenerationRequest, text: str) -> GenerationRequest:
    """`request` with the sources block at the end of its system message (one made for it when
    it has none); as it is for an empty block."""
    if not text or request.messages is None:
        return request
    messages = list(request.messages)
    if messages and messages[0]["role"] == Role.SYSTEM:
        messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
    else:
        messages.insert(0, {"role": Role.SYSTEM, "content": text})
    return dataclasses.replace(request, messages=tuple(messages))


def attached_count(files: list[FileRecord]) -> tuple[int, int]:
    """(indexed files, files with a problem) for the panel's title."""
    return (
        sum(1 for f in files if f.status == "indexed"),
        sum(1 for f in files if f.problem),
    )


def progress_fraction(p: IndexProgress) -> float:
    return p.files_done / p.files_total if p.files_total else 1.0
