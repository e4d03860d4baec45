"""Links in model output (issue 17): a click opens http(s) only, and only after the user confirms
a dialog naming the address. Opening is observed through QDesktopServices URL handlers, which
catch Qt's own openUrl calls as well as ours."""

import pytest
from PySide6.QtCore import QObject, QPoint, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices, QTextCursor
from PySide6.QtWidgets import QMessageBox

from app.store import StoredMessage
from app.views.message_widget import MessageWidget

SCHEMES = ("http", "https", "file", "javascript", "ftp", "smb")


class UrlRecorder(QObject):
    def __init__(self):
        super().__init__()
        self.opened: list[str] = []

    @Slot(QUrl)
    def record(self, url: QUrl) -> None:
        self.opened.append(url.toString())


@pytest.fixture
def opened():
    recorder = UrlRecorder()
    for scheme in SCHEMES:
        QDesktopServices.setUrlHandler(scheme, recorder, "record")
    yield recorder.opened
    for scheme in SCHEMES:
        QDesktopServices.unsetUrlHandler(scheme)


@pytest.fixture
def questions(monkeypatch):
    asked = []

    def answer(choice):
        def question(parent, title, text, *args, **kwargs):
            asked.append(text)
            return choice

        monkeypatch.setattr(QMessageBox, "question", question)

    monkeypatch.setattr(QMessageBox, "information", lambda *a, **k: asked.append(a[2]))
    answer(QMessageBox.Open)
    return asked, answer


def click_link(qtbot, widget: MessageWidget, href: str) -> None:
    """Press and release the mouse on the anchor `href` in the message body (in whichever of
    its views, prose or code block, shows it)."""
    for body in widget.body.parts:
        block = body.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                if fragment.charFormat().anchorHref() == href:
                    cursor = QTextCursor(body.document())
                    cursor.setPosition(fragment.position() + 1)
                    rect = body.cursorRect(cursor)
                    point = QPoint(rect.left(), rect.center().y())
                    qtbot.mouseClick(body.viewport(), Qt.LeftButton, pos=point)
                    return
                it += 1
            block = block.next()
    raise AssertionError(f"no anchor {href} in the message")


def reply_with_links(qtbot, *links: str) -> MessageWidget:
    content = "\n\n".join(f"[link number {i}]({href})" for i, href in enumerate(links))
    widget = MessageWidget(StoredMessage(1, 1, 0, "assistant", content))
    qtbot.addWidget(widget)
    widget.resize(600, 400)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


@pytest.mark.parametrize(
    "href",
    ["file:///etc/passwd", "javascript:alert(1)", "smb://server/share", "ftp://example.com/x"],
)
def test_non_web_link_is_never_opened(qtbot, opened, questions, href):
    widget = reply_with_links(qtbot, href)
    click_link(qtbot, widget, href)
    assert opened == []
    # Nor loaded into the message itself (Qt's own navigation shows a file: link's contents).
    assert "link number 0" in widget.body.toPlainText()
    assert all(part.source().isEmpty() for part in widget.body.parts)


def test_web_link_opens_only_after_the_user_confirms(qtbot, opened, questions):
    asked, answer = questions
    href = "https://example.com/page?q=1"
    widget = reply_with_links(qtbot, href)
    answer(QMessageBox.Cancel)
    click_link(qtbot, widget, href)
    assert opened == [] and len(asked) == 1 and href in asked[0]
    answer(QMessageBox.Open)
    click_link(qtbot, widget, href)
    assert opened == [href] and href in asked[1]


def test_links_after_a_code_block_open_too_and_a_press_selects_the_reply(qtbot, opened, questions):
    # The prose after a code block is a view of its own: its links work the same way.
    first, second = "https://example.com/a", "https://example.com/b"
    content = f"See [the first]({first}).\n\n```\ncode\n```\n\nThen [the second]({second})."
    widget = MessageWidget(StoredMessage(1, 1, 0, "assistant", content))
    qtbot.addWidget(widget)
    widget.resize(600, 400)
    widget.show()
    qtbot.waitExposed(widget)
    assert [p.objectName() for p in widget.body.parts] == ["prose", "code_block", "prose"]
    click_link(qtbot, widget, second)
    assert opened == [second]
    # a press on any part of the text (here the code block) selects the reply, as on the prose
    with qtbot.waitSignal(widget.selected, timeout=1000) as selected:
        qtbot.mouseClick(widget.body.code_views()[0].viewport(), Qt.LeftButton, pos=QPoint(5, 5))
    assert selected.args == [1]
