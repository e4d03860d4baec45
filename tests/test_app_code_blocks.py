"""Code blocks in messages: Pygments colours (checked against Pygments' own style table) and a
copy link per block that copies exactly that block."""

from PySide6.QtCore import QUrl
from PySide6.QtGui import QColor, QGuiApplication, QPalette, QTextDocument

from app.store import StoredMessage
from app.views.code_blocks import COPY_SCHEME, find_code_blocks
from app.views.markdown_style import set_markdown
from app.views.message_widget import MessageWidget
from tests.app_fakes import close_window  # noqa: F401  (sets QT_QPA_PLATFORM)

REPLY = (
    "Two ways:\n\n```python\ndef greet(name):\n    return f'Hi {name}'\n```\n\n"
    "and in a shell:\n\n```bash\necho hi | tr a-z A-Z\n```\n\nand plain:\n\n```\nno language\n```\n"
)


def style_color(style, token):
    from pygments.styles import get_style_by_name

    return "#" + get_style_by_name(style).style_for_token(token)["color"].lower()


def layout_colors(document, needle):
    """(text, colour) of each coloured range in the block containing `needle`."""
    block = document.find(needle).block()
    text = block.text()
    return [
        (text[r.start : r.start + r.length], r.format.foreground().color().name())
        for r in block.layout().formats()
    ]


def test_python_keywords_and_strings_get_the_pygments_style_colours(qapp):
    from pygments.token import Keyword, String

    doc = QTextDocument()
    codes = set_markdown(doc, REPLY, qapp.palette())
    assert codes == [
        "def greet(name):\n    return f'Hi {name}'",
        "echo hi | tr a-z A-Z",
        "no language",
    ]
    colors = dict(layout_colors(doc, "def greet"))
    assert colors["def"] == style_color("default", Keyword)
    returned = dict(layout_colors(doc, "return"))
    assert returned["return"] == style_color("default", Keyword)
    assert returned["'Hi "] == style_color("default", String.Single)
    assert "name" not in returned  # plain names keep the text colour
    assert layout_colors(doc, "no language") == []  # no language named: left plain


def test_a_dark_palette_uses_the_dark_style(qapp):
    from pygments.token import Keyword

    palette = QPalette(qapp.palette())
    palette.setColor(QPalette.Base, QColor("#202020"))
    doc = QTextDocument()
    set_markdown(doc, REPLY, palette)
    assert dict(layout_colors(doc, "def greet"))["def"] == style_color("monokai", Keyword)


def test_every_code_block_has_a_copy_link_that_copies_exactly_it(qtbot):
    message = StoredMessage(id=1, conversation_id=1, position=1, role="assistant", content=REPLY)
    widget = MessageWidget(message)
    qtbot.addWidget(widget)
    text = widget.body.toPlainText()
    assert text.count("Copy ") == 3 and "Copy python code\ndef greet" in text
    # each code block is a view of its own (it scrolls sideways by itself), with its copy link
    assert [part.toPlainText().split("\n")[0] for part in widget.body.code_views()] == [
        "Copy python code",
        "Copy bash code",
        "Copy code",
    ]
    links = []
    for part in widget.body.parts:  # numbered across the message, top to bottom
        block = part.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                if it.fragment().charFormat().anchorHref():
                    links.append(it.fragment().charFormat().anchorHref())
                it += 1
            block = block.next()
    assert links == [f"{COPY_SCHEME}:0", f"{COPY_SCHEME}:1", f"{COPY_SCHEME}:2"]
    widget.body.anchorClicked.emit(QUrl(f"{COPY_SCHEME}:1"))
    assert QGuiApplication.clipboard().text() == "echo hi | tr a-z A-Z"
    widget.body.anchorClicked.emit(QUrl(f"{COPY_SCHEME}:0"))
    assert QGuiApplication.clipboard().text() == "def greet(name):\n    return f'Hi {name}'"
    widget.body.anchorClicked.emit(QUrl(f"{COPY_SCHEME}:7"))  # no such block: nothing happens
    assert QGuiApplication.clipboard().text() == "def greet(name):\n    return f'Hi {name}'"
    widget.copy_button.click()  # the message's own Copy keeps the text as written
    assert QGuiApplication.clipboard().text() == REPLY
    # a click on a copy link in the message copies its block (the link in the bash block's view)
    bash_view = widget.body.code_views()[1]
    bash_view.anchorClicked.emit(QUrl(f"{COPY_SCHEME}:1"))
    assert QGuiApplication.clipboard().text() == "echo hi | tr a-z A-Z"


def test_the_copy_links_stay_out_of_the_code_itself(qapp):
    doc = QTextDocument()
    set_markdown(doc, REPLY, qapp.palette())
    assert [b.text for b in find_code_blocks(doc)] == [
        "def greet(name):\n    return f'Hi {name}'",
        "echo hi | tr a-z A-Z",
        "no language",
    ]
