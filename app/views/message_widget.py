"""One chat message: role header with status, collapsible reasoning, markdown body, actions.

A card is never wider than the chat: its header text wraps, its actions sit in a "⋯" menu (and
show as buttons only while the pointer is over a card wide enough for them), prose wraps to the card's
width, and each code block is a view of its own whose long lines scroll sideways inside it
(MessageBody), so neither the prose nor the card ever scrolls or widens for a code line."""

from __future__ import annotations

import re

from PySide6.QtCore import QEvent, QSize, Qt, QUrl, Signal
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QPalette,
    QTextCursor,
    QTextOption,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QMessageBox,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.export import ROLE_TITLES
from app.finish_reasons import header_note
from app.json_reply import render_json_reply
from app.store import StoredMessage
from app.theme import text_color
from app.views.code_blocks import COPY_SCHEME, renumber_copy_links
from app.views.markdown_style import set_markdown
from app.views.sources_line import sources_line_html
from app.views.sources_view import CITE_SCHEME, link_citations, reply_sources
from engine.events import ToolCallStarted
from engine.types import JsonMode, MessageStatus, Role

LIVE_MARKDOWN_CHARS = 12_000  # beyond this a streaming reply is drawn as plain text until it ends
MARKDOWN_CHARS = 200_000  # beyond this even a finished reply stays plain text (render cost)
STATUS_NOTES = {
    MessageStatus.CANCELLED: "■ cancelled — partial reply kept",
    MessageStatus.ERROR: "⚠ failed",
    MessageStatus.INTERRUPTED: "⚠ interrupted (the app closed while this reply was streaming)",
    MessageStatus.STREAMING: "generating…",
}
# Model output is untrusted text: a link in it may name file:, a custom URL handler or a
# javascript: URL that some handler would run. Only web pages open, and only after the user has
# seen the full address.
OPENABLE_SCHEMES = ("http", "https")
MIN_BODY_WIDTH = 60  # px: below this a message body is clipped rather than widening its card
MENU_TEXT = "⋯"  # the actions menu every card has; its buttons show only on hover


def is_openable_link(url: QUrl) -> bool:
    return url.isValid() and url.scheme().lower() in OPENABLE_SCHEMES and bool(url.host())


def confirm_and_open_link(url: QUrl, parent: QWidget | None = None) -> bool:
    """Open a link from a message in the browser if it is http(s) and the user agrees."""
    address = url.toString()
    if not is_openable_link(url):
        QMessageBox.information(
            parent,
            "Link not opened",
            f"LocalChat only opens http and https links. This one was not opened:\n\n{address}",
        )
        return False
    answer = QMessageBox.question(
        parent,
        "Open link?",
        f"Open this address in your web browser?\n\n{address}",
        QMessageBox.Open | QMessageBox.Cancel,
        QMessageBox.Cancel,
    )
    if answer != QMessageBox.Open:
        return False
    return QDesktopServices.openUrl(url)


def follow_link(url: QUrl, code_texts: list[str], parent: QWidget) -> None:
    """A click on a link in a message: a copy link puts its code block (by number) on the
    clipboard; any other link is opened only after confirm_and_open_link asks."""
    if url.scheme() == COPY_SCHEME:
        number = url.path()
        if number.isdigit() and int(number) < len(code_texts):
            QGuiApplication.clipboard().setText(code_texts[int(number)])
        return
    if url.scheme() == CITE_SCHEME:  # a citation: the message card opens its source
        return
    confirm_and_open_link(url, parent)


class AutoHeightBrowser(QTextBrowser):
    """A QTextBrowser as tall as its document, so the chat scrolls as one column."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        # Neither Qt's own navigation (it would load a file: link into this view) nor direct
        # opening: every click goes through confirm_and_open_link.
        self.setOpenExternalLinks(False)
        self.setOpenLinks(False)
        self.code_texts: list[str] = []  # the code blocks shown, for their copy links
        self.anchorClicked.connect(self._on_link)
        self.setFrameShape(QFrame.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        # Prose wraps at the view's width; a code line that cannot wrap scrolls here, inside
        # this view, instead of making the card wider than the chat.
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAsNeeded)
        # A word longer than the line (a URL, a hash) breaks anywhere rather than widening it.
        self.setWordWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def _on_link(self, url: QUrl) -> None:
        follow_link(url, self.code_texts, self)

    def minimumSizeHint(self) -> QSize:
        # QAbstractScrollArea's hint counts both scroll bars; the chat only needs a sliver.
        return QSize(MIN_BODY_WIDTH, super().minimumSizeHint().height())

    def needs_horizontal_scroll(self) -> bool:
        return self.document().size().width() > self.viewport().width() + 1

    def _fit(self, *_):
        height = int(self.document().size().height()) + 2 * self.frameWidth() + 2
        if self.needs_horizontal_scroll():  # room for the bar under the last line
            height += self.horizontalScrollBar().sizeHint().height()
        if height != self.height():
            self.setFixedHeight(height)

    def resizeEvent(self, event):
        super().resizeEvent(event)
        self._fit()


# A fence line (CommonMark): three or more backticks or tildes; a backtick fence's info string
# has no backtick. Indented fences count too (a code block in a list item is indented).
_FENCE = re.compile(r"^([ \t]*)(`{3,}(?=[^`]*$)|~{3,})(.*)$")


def split_code_fences(text: str) -> list[tuple[bool, str]]:
    """`text` cut into (is_code, markdown) pieces: each fenced code block on its own (its fence
    lines kept, dedented by the fence's indent so that it is still a fence alone) and the prose
    between. A fence that is never closed runs to the end, as markdown reads it."""
    pieces: list[tuple[bool, list[str]]] = []
    fence: tuple[str, int, int] | None = None  # (character, length, indent) of the open fence
    for line in text.split("\n"):
        match = _FENCE.match(line)
        if fence is None:
            if match:
                indent = len(match.group(1).expandtabs(4))
                fence = (match.group(2)[0], len(match.group(2)), indent)
                pieces.append((True, [line.lstrip(" \t")]))
                continue
            if not pieces or pieces[-1][0]:
                pieces.append((False, []))
            pieces[-1][1].append(line)
            continue
        char, length, indent = fence
        closing = match and match.group(2)[0] == char and len(match.group(2)) >= length
        if closing and not match.group(3).strip():
            pieces[-1][1].append(line.lstrip(" \t"))
            fence = None
            pieces.append((False, []))  # what follows is prose, even if empty
            continue
        # content: the fence's indent is not part of the code (up to that many spaces)
        stripped = len(line) - len(line.lstrip(" "))
        pieces[-1][1].append(line[min(indent, stripped) :])
    return [(code, "\n".join(lines)) for code, lines in pieces if code or "".join(lines).strip()]


class MessageBody(QWidget):
    """A message's text as a column of views: prose wraps to the card's width, and each fenced
    code block is a view of its own whose long lines scroll sideways inside it, so a code line
    never makes the prose (or the card) scroll. The views are reused from one render to the
    next (a streaming reply renders every frame) and one whose markdown did not change is not
    rendered again."""

    anchorClicked = Signal(QUrl)  # a link in any part (copy links are numbered message-wide)
    pressed = Signal()  # the mouse went down on the text

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("message_body")
        self._column = QVBoxLayout(self)
        self._column.setContentsMargins(0, 0, 0, 0)
        self._column.setSpacing(0)
        self.parts: list[AutoHeightBrowser] = []  # the views in use, top to bottom
        self._spare: list[AutoHeightBrowser] = []
        self._rendered: list[tuple] = []  # what each part in use shows (to skip re-renders)
        self.code_texts: list[str] = []  # every code block's text, by copy-link number
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.anchorClicked.connect(self._on_link)

    def _part(self, index: int) -> AutoHeightBrowser:
        while len(self.parts) <= index:
            part = self._spare.pop() if self._spare else self._new_part()
            self._column.addWidget(part)
            part.setVisible(True)
            self.parts.append(part)
            self._rendered.append(())
        return self.parts[index]

    def _new_part(self) -> AutoHeightBrowser:
        part = AutoHeightBrowser(self)
        part.anchorClicked.disconnect()  # links go through the body (message-wide numbers)
        part.anchorClicked.connect(self.anchorClicked)
        part.viewport().installEventFilter(self)
        return part

    def _keep(self, count: int) -> None:
        """Put the parts past the first `count` aside (hidden, kept for the next render)."""
        while len(self.parts) > count:
            part = self.parts.pop()
            self._rendered.pop()
            self._column.removeWidget(part)
            part.setVisible(False)
            self._spare.append(part)

    def set_markdown(self, text: str, palette: QPalette, streaming: bool = False) -> None:
        pieces = split_code_fences(text) or [(False, "")]
        self._keep(len(pieces))
        self.code_texts = []
        for index, (is_code, markdown) in enumerate(pieces):
            part = self._part(index)
            key = (
                "md",
                markdown,
                streaming,
                palette.color(QPalette.Base).rgba(),
                len(self.code_texts),
            )
            if self._rendered[index] != key:
                part.code_texts = set_markdown(part.document(), markdown, palette, streaming)
                renumber_copy_links(part.document(), len(self.code_texts))
                self._rendered[index] = key
            part.setObjectName("code_block" if is_code else "prose")
            self.code_texts += part.code_texts

    def set_plain_text(self, text: str) -> None:
        self._keep(1)
        part = self._part(0)
        part.setPlainText(text)
        part.setObjectName("prose")
        part.code_texts = self.code_texts = []
        self._rendered[0] = ("plain",)

    def append_plain_text(self, text: str) -> None:
        """Add to the text set by set_plain_text (a long reply still streaming)."""
        cursor = QTextCursor(self._part(0).document())
        cursor.movePosition(QTextCursor.End)
        cursor.insertText(text)

    def toPlainText(self) -> str:
        return "\n".join(part.toPlainText() for part in self.parts)

    def code_views(self) -> list[AutoHeightBrowser]:
        return [part for part in self.parts if part.objectName() == "code_block"]

    def prose_views(self) -> list[AutoHeightBrowser]:
        return [part for part in self.parts if part.objectName() == "prose"]

    def _on_link(self, url: QUrl) -> None:
        follow_link(url, self.code_texts, self)

    def eventFilter(self, obj, event):
        if event.type() == QEvent.MouseButtonPress:
            self.pressed.emit()
        return False


class MessageWidget(QFrame):
    editRequested = Signal(int)  # message id (user messages)
    regenerateRequested = Signal(int)  # message id (assistant messages)
    selected = Signal(int)  # message id: show its usage and tokens in the side panels
    detailsRequested = Signal(int)  # message id: show the reply's receipt (Details)
    versionRequested = Signal(int)  # the id of the version of this message to show instead
    branchRequested = Signal(int)  # message id: copy the chat up to here into a new chat
    compareRequested = Signal(int)  # message id (user messages): answer it in the compare view
    sourcesRequested = Signal(int, int)  # message id, citation marker (0: the whole list)

    def __init__(self, message: StoredMessage, parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.text = message.content
        self.reasoning = message.reasoning
        self._plain_streaming = False
        self.setObjectName("message_" + message.role)
        self.setProperty("role", message.role)
        self.setFrameShape(QFrame.StyledPanel)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)

        header = QHBoxLayout()
        self.role_label = QLabel(f"<b>{ROLE_TITLES.get(message.role, message.role)}</b>")
        self.status_label = QLabel()
        self.status_label.setObjectName("status")
        # Wraps rather than widening the card ("■ cancelled — partial reply kept", long finish
        # reasons): one wide header once made every card in the chat wider than the view.
        self.status_label.setWordWrap(True)
        header.addWidget(self.role_label)
        # "< 2/3 >": this message's versions (regenerated replies, edited messages). Made only
        # for a message that has versions: every widget in a header costs a little on each
        # re-layout of a long chat while a reply streams.
        self._header = header
        self.previous_version: QToolButton | None = None
        self.version_label: QLabel | None = None
        self.next_version: QToolButton | None = None
        header.addWidget(self.status_label, 1)
        # The actions: each is a button in `hover_actions` (shown while the pointer is over a
        # card wide enough for them) and an entry of the "⋯" menu (always there).
        self.hover_actions = QWidget()
        self.hover_actions.setObjectName("hover_actions")
        self._hover_layout = QHBoxLayout(self.hover_actions)
        self._hover_layout.setContentsMargins(0, 0, 0, 0)
        self._hover_layout.setSpacing(0)
        self.hover_actions.setVisible(False)
        self.actions_menu = QMenu(self)
        self.menu_button = QToolButton()
        self.menu_button.setObjectName("message_menu")
        self.menu_button.setText(MENU_TEXT)
        self.menu_button.setToolTip("Actions for this message")
        self.menu_button.setAutoRaise(True)
        self.menu_button.setPopupMode(QToolButton.InstantPopup)
        self.menu_button.setMenu(self.actions_menu)
        self._menu_actions: dict[QToolButton, object] = {}
        self.copy_button = self._action("Copy", "Copy this message as plain text", self._copy)
        if message.role == Role.USER:
            self.edit_button = self._action(
                "Edit",
                "Edit this message and regenerate the reply from here",
                lambda: self.editRequested.emit(self.message.id),
            )
            self.compare_button = self._action(
                "Compare answers",
                "Answer this message with two presets side by side (Compare…)",
                lambda: self.compareRequested.emit(self.message.id),
            )
        if message.role == Role.ASSISTANT:
            self.regenerate_button = self._action(
                "Regenerate",
                "Generate this reply again (Ctrl+R)",
                lambda: self.regenerateRequested.emit(self.message.id),
            )
            self.details_button = self._action(
                "Details",
                "Show this reply's receipt (model, template, preset, seed) and replay it; its "
                "usage and tokens go to the side panels",
                self._details,
            )
        self.branch_button = self._action(
            "Branch",
            "Branch from here: copy the chat up to this message into a new chat",
            lambda: self.branchRequested.emit(self.message.id),
        )
        header.addWidget(self.hover_actions)
        header.addWidget(self.menu_button, 0, Qt.AlignTop)
        layout.addLayout(header)

        self.reasoning_toggle = QToolButton()
        self.reasoning_toggle.setCheckable(True)
        self.reasoning_toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.reasoning_toggle.setArrowType(Qt.RightArrow)
        self.reasoning_toggle.setText("Reasoning")
        self.reasoning_toggle.toggled.connect(self._toggle_reasoning)
        self.reasoning_view = AutoHeightBrowser()
        self.reasoning_view.setObjectName("reasoning")
        self.reasoning_view.setVisible(False)
        layout.addWidget(self.reasoning_toggle)
        layout.addWidget(self.reasoning_view)

        self.body = MessageBody()
        self.body.pressed.connect(self._pressed)
        self.body.anchorClicked.connect(self._on_citation)
        self.sources_button: QToolButton | None = None  # made when the reply has sources
        self.sources: dict | None = None  # the receipt's "sources" section (set_sources)
        layout.addWidget(self.body)
        # "Sources: [1] manual.md › Warranty · [2] …" under a reply with passages, cited or not
        self.sources_line = QLabel()
        self.sources_line.setObjectName("sources_line")
        self.sources_line.setWordWrap(True)
        self.sources_line.setTextFormat(Qt.RichText)
        self.sources_line.linkActivated.connect(lambda link: self._on_citation(QUrl(link)))
        self.sources_line.setVisible(False)
        layout.addWidget(self.sources_line)

        self.json_status = QLabel()
        self.json_status.setObjectName("json_status")
        self.json_status.setWordWrap(True)  # a parse error names line and column: it can be long
        layout.addWidget(self.json_status)

        # The tool calls this reply made (each one's block follows the reply) and any it wrote
        # that cannot run (malformed: shown, never executed).
        self.tool_calls_label = QLabel()
        self.tool_calls_label.setObjectName("tool_calls_line")
        self.tool_calls_label.setWordWrap(True)
        self.tool_calls_label.setTextFormat(Qt.PlainText)
        layout.addWidget(self.tool_calls_label)
        self._live_calls: list[str] = []

        self.usage_label = QLabel()
        self.usage_label.setObjectName("usage_line")
        self.usage_label.setWordWrap(True)
        layout.addWidget(self.usage_label)
        self.refresh()

    def _action(self, text: str, tip: str, slot) -> QToolButton:
        """A hover button and the same entry in the "⋯" menu."""
        button = self._tool_button(text, tip, slot)
        self._hover_layout.addWidget(button)
        entry = self.actions_menu.addAction(text)
        entry.setToolTip(tip)
        entry.triggered.connect(button.click)
        self._menu_actions[button] = entry
        return button

    def _tool_button(self, text: str, tip: str, slot) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.clicked.connect(slot)
        return button

    def _offer(self, button: QToolButton | None, available: bool) -> None:
        """Offer an action (hover button and menu entry) or take it away (while streaming)."""
        if button is None:
            return
        button.setVisible(available)
        self._menu_actions[button].setVisible(available)

    def menu_entries(self) -> list[str]:
        """The "⋯" menu's entries as offered now."""
        return [a.text() for a in self.actions_menu.actions() if a.isVisible()]

    # --- hover: the action buttons show while the pointer is over the card ----------------------
    def enterEvent(self, event):
        super().enterEvent(event)
        self.show_hover_actions(True)

    def leaveEvent(self, event):
        super().leaveEvent(event)
        self.show_hover_actions(False)

    def show_hover_actions(self, shown: bool) -> None:
        """Show the action buttons, but only if the card is wide enough for them: they are a
        shortcut to the "⋯" menu and must never make the card wider than the chat."""
        self.hover_actions.setVisible(shown)
        if shown:
            # Room for the header at its natural width (the status on one line, the buttons'
            # whole words), not merely at its minimum: squeezed, the status wraps into a
            # column and the buttons' labels are cut ("Re…te").
            margins = self.layout().contentsMargins()
            natural = self._header.sizeHint().width() + margins.left() + margins.right()
            if natural > self.contentsRect().width():
                self.hover_actions.setVisible(False)

    # --- content --------------------------------------------------------------------------------
    @property
    def live_markdown(self) -> bool:
        """Whether streaming re-renders the whole reply as markdown (cost grows with length)."""
        return len(self.text) <= LIVE_MARKDOWN_CHARS

    def append_stream(self, text: str = "", reasoning: str = "") -> None:
        self.text += text
        self.reasoning += reasoning
        if len(self.text) <= LIVE_MARKDOWN_CHARS:
            self.refresh(streaming=True)
            return
        # Long reply: re-rendering all the markdown every frame would grow without bound, so
        # append the new characters as plain text; the final markdown render happens once.
        if not self._plain_streaming:
            self._plain_streaming = True
            self.body.set_plain_text(self.text)
        elif text:
            self.body.append_plain_text(text)
        if reasoning:
            self.reasoning_view.setPlainText(self.reasoning)
            self.reasoning_toggle.setVisible(True)

    def set_message(self, message: StoredMessage) -> None:
        if message.id != self.message.id:  # another version: its own sources, if any
            self.sources = None
        self.message = message
        self.text, self.reasoning = message.content, message.reasoning
        self.refresh()

    def refresh(self, streaming: bool = False) -> None:
        self._plain_streaming = False
        m = self.message
        json_mode = m.role == Role.ASSISTANT and m.json_mode != JsonMode.OFF
        if json_mode and (self.text or not streaming):
            view = render_json_reply(self.text, streaming=streaming)
            self.body.set_markdown(view.markdown, self.palette(), streaming)
            self.json_status.setText(
                ("✔ " if view.ok else "✖ " if not streaming else "") + view.status
            )
            # Direct colour: a dynamic-property selector would need a re-polish on every change.
            meaning = "good" if view.ok else "bad" if not streaming else ""
            color = text_color(self.palette(), meaning) if meaning else "gray"
            self.json_status.setStyleSheet(f"color: {color};")
            self.json_status.setVisible(True)
        elif len(self.text) > MARKDOWN_CHARS:
            self.body.set_plain_text(self.text)
            self.json_status.setVisible(False)
        else:
            self.body.set_markdown(
                self._with_citations(self.text) if self.text else ("…" if streaming else ""),
                self.palette(),
                streaming,
            )
            self.json_status.setVisible(False)
        has_reasoning = bool(self.reasoning)
        self.reasoning_toggle.setVisible(has_reasoning)
        if has_reasoning:
            self.reasoning_view.setPlainText(self.reasoning)
            words = len(self.reasoning.split())
            self.reasoning_toggle.setText(f"Reasoning ({words} words)")
        status = MessageStatus.STREAMING if streaming else m.status
        for button in (
            getattr(self, "regenerate_button", None),
            getattr(self, "details_button", None),
        ):
            self._offer(button, not streaming)
        self._show_versions(streaming)
        # how the reply ended, in app/finish_reasons.py's words (a server's own finish reason too)
        self.status_label.setText(header_note(status, m.finish_reason, m.usage))
        self.status_label.setProperty("status", status)
        self._show_tool_calls(streaming)
        # A reply that is only tool calls has no text to frame.
        # A reply with no text (only tool calls, or failed before its first token) has nothing
        # to frame: an empty body left a blank band in the card.
        self.body.setVisible(bool(self.text) or streaming)
        self.usage_label.setText(_usage_line(m.usage) if not streaming else "")
        self.usage_label.setVisible(bool(self.usage_label.text()))
        assistant = m.role == Role.ASSISTANT and not streaming
        line = sources_line_html(self.sources or reply_sources(m.receipt)) if assistant else ""
        self.sources_line.setText(line)
        self.sources_line.setVisible(bool(line))

    def _with_citations(self, text: str) -> str:
        """The reply's [n] markers as links to its sources (issue 34), when its receipt has them;
        the Sources action is offered from then on."""
        sources = self.sources or reply_sources(self.message.receipt)
        if sources is None or self.message.role != Role.ASSISTANT:
            return text
        if self.sources_button is None:
            self.sources_button = self._action(
                "Sources",
                "The document passages this reply's prompt carried, and those left out",
                lambda: self.sourcesRequested.emit(self.message.id, 0),
            )
        markers = {int(s["marker"]) for s in sources.get("sources") or [] if s.get("marker")}
        return link_citations(text, markers)

    def set_sources(self, section: dict | None) -> None:
        """The reply's sources, read from its receipt by the documents feature (a chat opened
        from the store holds no receipts in memory)."""
        if section != self.sources:
            self.sources = section
            self.refresh()

    def _on_citation(self, url: QUrl) -> None:
        if url.scheme() == CITE_SCHEME and url.path().isdigit():
            self.sourcesRequested.emit(self.message.id, int(url.path()))

    def note_tool_events(self, events: list) -> None:
        for event in events:
            if isinstance(event, ToolCallStarted):
                self._live_calls.append(event.name)
        self._show_tool_calls(streaming=True)

    def _show_tool_calls(self, streaming: bool) -> None:
        tool = self.message.tool or {}
        lines = []
        if streaming and self._live_calls:
            lines.append("Calling " + ", ".join(self._live_calls) + "…")
        elif not streaming:
            names = [c.get("function", {}).get("name", "?") for c in tool.get("tool_calls") or []]
            if names:
                lines.append("Called " + ", ".join(names))
            for bad in tool.get("malformed") or []:
                lines.append(
                    f"✖ Malformed tool call {bad.get('name') or '(no name)'}: "
                    f"{bad.get('problem', '')} — not run"
                )
            if tool.get("empty_reason"):  # an answer with no text says why (app/tool_runner.py)
                lines.append(str(tool["empty_reason"]))
        self.tool_calls_label.setText("\n".join(lines))
        self.tool_calls_label.setVisible(bool(lines))

    def _details(self) -> None:
        self.selected.emit(self.message.id)
        self.detailsRequested.emit(self.message.id)

    def _show_versions(self, streaming: bool) -> None:
        m = self.message
        self._offer(self.branch_button, not streaming)
        if m.version_count < 2:
            return
        if self.version_label is None:
            self.previous_version = self._tool_button(
                "‹", "Show the previous version of this message", lambda: self._step_version(-1)
            )
            self.version_label = QLabel()
            self.version_label.setObjectName("version_label")
            self.next_version = self._tool_button(
                "›", "Show the next version of this message", lambda: self._step_version(1)
            )
            for offset, item in enumerate(
                (self.previous_version, self.version_label, self.next_version)
            ):
                self._header.insertWidget(1 + offset, item)
        self.version_label.setText(f"{m.version_number}/{m.version_count}")
        self.previous_version.setEnabled(not streaming and m.version_number > 1)
        self.next_version.setEnabled(not streaming and m.version_number < m.version_count)

    def _step_version(self, step: int) -> None:
        index = self.message.version_number - 1 + step
        if 0 <= index < len(self.message.version_ids):
            self.versionRequested.emit(self.message.version_ids[index])

    def _toggle_reasoning(self, shown: bool) -> None:
        self.reasoning_toggle.setArrowType(Qt.DownArrow if shown else Qt.RightArrow)
        self.reasoning_view.setVisible(shown)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)

    def _pressed(self) -> None:
        if self.message.role == Role.ASSISTANT:
            self.selected.emit(self.message.id)


def _usage_line(usage: dict | None) -> str:
    if not usage:
        return ""
    if "error" in usage:
        return f"error: {usage['error']}"
    parts = [f"{usage.get('completion_tokens', 0)} tokens"]
    if usage.get("ttft_ms") is not None:
        parts.append(f"first token {usage['ttft_ms']:.0f} ms")
    if usage.get("decode_tok_s"):
        parts.append(f"{usage['decode_tok_s']:.1f} tok/s")
    return " · ".join(parts)
