"""The window's layout at any size (issue 31): no chat card wider than the chat, a window that
never grows by itself nor opens past the screen, readable banners in both themes, an MCP form
that stays usable at a large font, side panels that collapse and stay so, message actions in a
"⋯" menu, code lines that scroll inside their message.

Fast tier: a scripted engine (tests/app_fakes.py), the offscreen platform, no model."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QEnterEvent, QFont, QPalette
from PySide6.QtWidgets import QAbstractButton, QApplication, QLabel, QMessageBox, QWidget

from app.settings import SettingsFile
from app.theme import apply_theme
from engine.errors import ContextOverflowError
from engine.types import MessageStatus
from tests.app_fakes import WAIT_MS, FakeEngine, ToolCallReply, close_window, make_window

LONG_ERROR = (
    "The prompt does not fit: 9,000 prompt tokens + max_tokens 256 > context 8,192 of "
    "/models/a-model-with-a-rather-long-file-name-Q4_K_M.gguf; shorten the chat or raise the "
    "context size in Settings"
)
# A JSON reply with one long line (a string value with no spaces): it cannot wrap.
JSON_REPLY = json.dumps({"city": "Paris", "country": "France", "note": "x" * 300})


@pytest.fixture
def look():
    """apply_theme(theme, font size) for one test; the application's look is restored after."""
    app = QApplication.instance()
    saved = (app.style().name(), QPalette(app.palette()), QFont(app.font()), app.styleSheet())
    yield lambda theme, size: apply_theme(app, theme, size)
    app.setStyle(saved[0])
    app.setPalette(saved[1])
    app.setFont(saved[2])
    app.setStyleSheet(saved[3])


@pytest.fixture
def dialogs(monkeypatch):
    shown = []
    monkeypatch.setattr(
        QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append((title, text))
    )
    return shown


def settle() -> None:
    """Let Qt run the layout requests the last change posted. Each level of nested layouts
    posts its request to its parent while the previous pass runs (a message's text is a column
    of views inside the card, inside the chat column, inside the scroll area), so a chain of
    passes is needed; ten is more than the deepest chain here."""
    for _ in range(10):
        QApplication.processEvents()


def layout_problems(window) -> list[str]:
    """Every way a chat card does not fit the chat: wider than the view, a visible part of it
    past the view's right edge, or wrapped text cut off at the bottom."""
    view = window.chat_view
    port = view.viewport()
    right = port.width()
    problems = []
    for card in view.widgets:
        name = f"{card.message.role} card {card.message.id} ({card.message.status})"
        if card.width() > right:
            problems.append(f"{name} is {card.width()} px wide in a {right} px chat")
        for part in [card, *card.findChildren(QWidget)]:
            if not part.isVisible():
                continue
            edge = part.mapTo(port, QPoint(part.width(), 0)).x()
            if edge > right:
                problems.append(
                    f"{name}: {type(part).__name__} {part.objectName()!r} ends at {edge} px, "
                    f"past the chat's {right} px"
                )
            if isinstance(part, QLabel) and part.wordWrap() and part.text():
                needed = part.heightForWidth(part.width())
                if part.height() < needed:
                    problems.append(f"{name}: {part.text()[:30]!r} cut off ({part.height()} px)")
            elif (
                isinstance(part, (QLabel, QAbstractButton))
                and part.text()
                and part.width() < part.minimumSizeHint().width()
            ):
                # a line that does not wrap, squeezed narrower than its text: cut off, or
                # drawn over its neighbour
                problems.append(
                    f"{name}: {part.text()[:30]!r} squeezed to {part.width()} px "
                    f"(needs {part.minimumSizeHint().width()})"
                )
    return problems


def send(qtbot, window, text: str) -> None:
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        window.input.setPlainText(text)
        window.send()


def check_fits(window, state: str) -> None:
    settle()
    problems = layout_problems(window)
    for card in window.chat_view.widgets:  # and with each card's hover buttons showing
        if hasattr(card, "show_hover_actions"):
            card.show_hover_actions(True)
            settle()
            problems += [f"(hovered) {p}" for p in layout_problems(window)]
            card.show_hover_actions(False)
    assert not problems, f"after {state}:\n" + "\n".join(problems)


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("font_size", [10, 16])
@pytest.mark.parametrize("width", [None, 1280])  # as opened (fitted to the screen), and 1280
def test_no_card_is_wider_than_the_chat(qtbot, tmp_path, look, dialogs, theme, font_size, width):
    look(theme, font_size)
    engine = FakeEngine(
        replies=[
            "The story of a lighthouse keeper is a tale of resilience, sacrifice, and hope.",
            "(never sent: this request fails)",
            ToolCallReply(calls=(("calculator", {"expression": "6*7"}),)),
            "It is 42.",
            JSON_REPLY,
        ],
        pause_after=3,
    )
    window = make_window(qtbot, tmp_path, engine)
    if width is not None:
        window.resize(width, 800)
    try:
        # 1. a cancelled reply: its header says so ("■ cancelled — partial reply kept")
        window.input.setPlainText("Tell me a long story about a lighthouse keeper.")
        window.send()
        qtbot.waitUntil(
            lambda: (
                window.chat_view.streaming_widget is not None
                and len(window.chat_view.streaming_widget.text.split()) == 3
            ),
            timeout=WAIT_MS,
        )
        with qtbot.waitSignal(window.session.busyChanged, timeout=WAIT_MS):
            window.cancel()
            engine.gate.set()
        assert window.chat_view.widgets[-1].message.status == MessageStatus.CANCELLED
        check_fits(window, "a cancelled reply")

        # 2. a failed reply, with a long error
        engine.fail_generate_with = ContextOverflowError(LONG_ERROR)
        send(qtbot, window, "And another one, please.")
        engine.fail_generate_with = None
        failed = window.chat_view.widgets[-1]
        assert dialogs and failed.message.status == MessageStatus.ERROR
        assert not failed.body.isVisible()  # no text: no empty band above the error line
        check_fits(window, "a failed reply")

        # 3. a reply that calls a tool (the built-in calculator) and then answers
        from app.tool_registry import builtin_key

        window.session.set_tool_enabled(builtin_key("calculator"), True)
        send(qtbot, window, "What is 6*7?")
        qtbot.waitUntil(lambda: len(engine.requests) == 4 and not window.session.busy)
        assert [w.message.role for w in window.chat_view.widgets][-3:] == [
            "assistant",
            "tool",
            "assistant",
        ]
        check_fits(window, "a tool-calling reply")

        # 4. a JSON reply with a line too long to wrap
        window.json_bar.combo.setCurrentIndex(1)  # any JSON object
        send(qtbot, window, "Paris as JSON, please.")
        json_card = window.chat_view.widgets[-1]
        assert json_card.json_status.isVisible() and json_card.message.json_mode != "off"
        check_fits(window, "a JSON reply")
        # the long line scrolls inside its code block instead
        assert json_card.body.code_views()[0].horizontalScrollBar().maximum() > 0

        # its versions ("‹ 2/2 ›") in the header too
        with qtbot.waitSignal(
            window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda b: b is False
        ):
            window.session.regenerate_last()
        assert window.chat_view.widgets[-1].version_label.text() == "2/2"
        check_fits(window, "a regenerated reply")

        # and again when the chat is opened anew
        cid, shown = window.session.conversation_id, len(window.chat_view.widgets)
        window.session.new_conversation()
        window.session.open_conversation(cid)
        assert len(window.chat_view.widgets) == shown
        check_fits(window, "reopening the chat")
    finally:
        close_window(window)


def test_choosing_json_schema_mode_does_not_widen_the_window(qtbot, tmp_path, look):
    look("light", 14)
    window = make_window(qtbot, tmp_path, FakeEngine())
    try:
        window.resize(1280, 800)
        settle()
        before = (window.width(), window.minimumWidth())
        schema = {
            "type": "object",
            "properties": {name: {"type": "string"} for name in ("city", "country", "region")},
        }
        window.json_bar.set_schema(json.dumps(schema), schema)
        window.json_bar.combo.setCurrentIndex(2)  # JSON schema…
        settle()
        assert window.json_bar.edit_button.isVisible()
        assert window.json_bar.schema_label.text() == "fields: city, country, region"
        assert (window.width(), window.minimumWidth()) == before
        # nor does a long status line
        window.state_label.setText("Replaying a reply from its receipt… (Esc to stop) " * 4)
        settle()
        assert (window.width(), window.minimumWidth()) == before
    finally:
        close_window(window)


@pytest.mark.parametrize("font_size", [14, 20])
def test_a_large_font_window_opens_inside_the_screen(qtbot, tmp_path, look, font_size):
    look("light", font_size)
    window = make_window(qtbot, tmp_path, FakeEngine())
    try:
        settle()
        free = window.screen().availableGeometry()
        assert window.width() <= free.width() and window.height() <= free.height()
        # Settings, at the far right of the model bar, is inside the window
        button = window.model_bar.settings_button
        assert button.isVisible()
        assert button.mapTo(window, QPoint(button.width(), 0)).x() <= window.width()
    finally:
        close_window(window)


def test_a_larger_font_chosen_later_does_not_grow_the_window(qtbot, tmp_path, look):
    look("light", 10)
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["Paris."]))
    try:
        send(qtbot, window, "Capital of France?")
        settle()
        before = window.size()
        look("light", 20)  # Settings > Font size, applied to the running window
        settle()
        assert window.size() == before
        assert not layout_problems(window)
    finally:
        close_window(window)


def _contrast(first: QColor, second: QColor) -> float:
    """WCAG 2 contrast ratio of two colours (https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio)."""

    def luminance(color: QColor) -> float:
        channels = []
        for value in (color.red(), color.green(), color.blue()):
            c = value / 255
            channels.append(c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4)
        return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]

    high, low = sorted((luminance(first), luminance(second)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def painted_contrast(widget: QWidget) -> float:
    """The contrast between the most common colour painted where a widget is (its background)
    and the colour furthest from it (the core of its text's glyphs). Grabbed from the parent:
    the label alone would be painted on its own palette's background, not the banner's."""
    parent = widget.parentWidget()
    image = parent.grab(widget.geometry()).toImage()
    counts: dict[int, int] = {}
    for y in range(image.height()):
        for x in range(image.width()):
            rgb = image.pixel(x, y)
            counts[rgb] = counts.get(rgb, 0) + 1
    background = QColor.fromRgb(max(counts, key=counts.get))
    return max(_contrast(background, QColor.fromRgb(rgb)) for rgb in counts)


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("kind", ["warning", "error", "info"])
def test_banners_are_readable_in_both_themes(qtbot, tmp_path, look, theme, kind):
    look(theme, 11)
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        window.notice_banner.show_notice(
            "startup-0", "The data directory is read-only: nothing you do here is saved.", kind
        )
        settle()
        assert window.notice_banner.isVisible()
        assert painted_contrast(window.notice_banner.label) >= 4.5  # WCAG AA for body text
    finally:
        close_window(window)


@pytest.mark.parametrize("where", ["tools", "sampling"])
def test_error_text_is_readable_in_the_dark_theme(qtbot, tmp_path, look, where):
    look("dark", 11)
    window = make_window(qtbot, tmp_path, FakeEngine())
    try:
        if where == "tools":
            window.tabs.setCurrentWidget(window.tools_panel)
            window.tools_panel.show_add_error("A server named files is already added")
            label = window.tools_panel.add_error
        else:
            window.tabs.setCurrentWidget(window.preset_panel)
            window.preset_panel.show_error("top_p=1.5 is invalid: must be a number in (0, 1]")
            label = window.preset_panel.error_label
        settle()
        assert label.isVisible()
        assert painted_contrast(label) >= 4.5
    finally:
        close_window(window)


def test_banner_follows_a_theme_change(qtbot, tmp_path, look):
    look("light", 11)
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        window.notice_banner.show_notice("storage", "The disk is full.", "error")
        settle()
        look("dark", 11)  # Settings > Theme, while the banner shows
        settle()
        assert painted_contrast(window.notice_banner.label) >= 4.5
    finally:
        close_window(window)


def test_mcp_form_is_usable_at_a_large_font(qtbot, tmp_path, look):
    look("light", 14)
    window = make_window(qtbot, tmp_path, FakeEngine())
    try:
        window.tabs.setCurrentWidget(window.tools_panel)
        panel = window.tools_panel
        settle()
        panel.scroll_area.ensureWidgetVisible(panel.add_button)
        settle()
        fields = (panel.name_edit, panel.target_edit, panel.add_button)
        for field in fields:
            hint = field.minimumSizeHint()
            assert field.isVisible()
            assert field.height() >= hint.height() and field.width() >= hint.width(), (
                f"{type(field).__name__} squeezed to {field.size()} (needs {hint})"
            )
        # one above the other, none overlapping another
        tops = [f.mapTo(panel, QPoint(0, 0)).y() for f in fields]
        assert all(a + f.height() <= b for a, f, b in zip(tops, fields, tops[1:], strict=False))
        # the field for a command or URL has room for a typical one
        sample = "uvx mcp-server-fetch"
        assert panel.target_edit.width() >= panel.target_edit.fontMetrics().horizontalAdvance(
            sample
        )
    finally:
        close_window(window)


def test_side_panels_collapse_and_are_remembered(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine())
    try:
        window.resize(1280, 800)
        settle()
        assert window.sidebar.isVisible() and window.side_panel.isVisible()
        chat_width = window.chat_view.width()
        # the conversation is the widest thing on screen
        assert chat_width > max(window.sidebar.width(), window.side_panel.width())
        window.chats_panel_action.trigger()
        window.model_bar.side_toggle.click()  # the bar's button does the same as the menu
        settle()
        assert not window.sidebar.isVisible() and not window.side_panel.isVisible()
        assert not window.side_panel_action.isChecked()
        assert window.chat_view.width() > chat_width
        assert SettingsFile(tmp_path / "settings.json").load().collapsed_panels == [
            "chats",
            "side",
        ]
    finally:
        close_window(window)
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        settle()
        assert not window.sidebar.isVisible() and not window.side_panel.isVisible()
        assert not window.chats_panel_action.isChecked()
        window.side_panel_action.trigger()
        settle()
        assert window.side_panel.isVisible() and window.splitter.sizes()[2] > 0
        assert SettingsFile(tmp_path / "settings.json").load().collapsed_panels == ["chats"]
    finally:
        close_window(window)


def test_a_panel_dragged_shut_counts_as_hidden_and_opens_again(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        window.resize(1280, 800)
        settle()
        # the handle between the chat and the side panel, dragged all the way right
        handle = window.splitter.handle(2)
        grip = QPoint(handle.width() // 2, handle.height() // 2)
        qtbot.mousePress(handle, Qt.LeftButton, pos=grip)
        qtbot.mouseMove(handle, grip + QPoint(window.width(), 0))
        qtbot.mouseRelease(handle, Qt.LeftButton, pos=grip + QPoint(window.width(), 0))
        settle()
        assert window.splitter.sizes()[2] == 0
        assert not window.side_panel.isVisible() and not window.side_panel_action.isChecked()
        assert window.settings.collapsed_panels == ["side"]
        window.side_panel_action.trigger()
        settle()
        # its share of the splitter, not 0 px (its widget keeps an old width: ask the splitter)
        assert window.side_panel.isVisible() and window.splitter.sizes()[2] > 100
    finally:
        close_window(window)


def test_message_actions_are_in_a_menu_and_show_on_hover(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["Paris."]))
    try:
        window.resize(1280, 800)
        send(qtbot, window, "Capital of France?")
        user, reply = window.chat_view.widgets
        assert reply.menu_entries() == ["Copy", "Regenerate", "Details", "Branch"]
        assert user.menu_entries() == ["Copy", "Edit", "Compare answers", "Branch"]
        # no card shows its action buttons until the pointer is over it
        assert not reply.hover_actions.isVisible() and reply.menu_button.isVisible()
        inside = QPointF(10, 10)
        QApplication.sendEvent(reply, QEnterEvent(inside, inside, reply.mapToGlobal(inside)))
        assert reply.hover_actions.isVisible() and reply.details_button.isVisible()
        assert not user.hover_actions.isVisible()
        QApplication.sendEvent(reply, QEvent(QEvent.Leave))
        assert not reply.hover_actions.isVisible()
        # a menu entry does what its button does
        with qtbot.waitSignal(window.chat_view.detailsRequested, timeout=WAIT_MS) as details:
            next(a for a in reply.actions_menu.actions() if a.text() == "Details").trigger()
        assert details.args == [reply.message.id]
        window.details_dialog.close()
    finally:
        close_window(window)


def test_hover_buttons_stay_hidden_on_a_card_too_narrow_for_them(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["Paris."]))
    try:
        send(qtbot, window, "Capital of France?")
        reply = window.chat_view.widgets[-1]
        window.splitter.setSizes([400, 300, 400])  # a narrow chat column
        settle()
        reply.show_hover_actions(True)
        settle()
        assert reply.width() <= window.chat_view.viewport().width()
        if reply.hover_actions.isVisible():  # shown only where they fit
            assert reply.minimumSizeHint().width() <= reply.width()
        assert not layout_problems(window)
    finally:
        close_window(window)


def test_streaming_reply_offers_no_regenerate(qtbot, tmp_path):
    engine = FakeEngine(replies=["one two three four five"], pause_after=2)
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.input.setPlainText("count")
        window.send()
        qtbot.waitUntil(lambda: window.chat_view.streaming_widget is not None, timeout=WAIT_MS)
        assert window.chat_view.streaming_widget.menu_entries() == ["Copy"]
        with qtbot.waitSignal(window.session.busyChanged, timeout=WAIT_MS):
            engine.gate.set()
        assert "Regenerate" in window.chat_view.widgets[-1].menu_entries()
    finally:
        close_window(window)


def test_a_long_unbroken_word_wraps_instead_of_widening(qtbot, tmp_path):
    url = "https://example.com/" + "a" * 400
    window = make_window(qtbot, tmp_path, FakeEngine(replies=[f"See {url} for more."]))
    try:
        send(qtbot, window, f"What is at {url}?")
        settle()
        assert not layout_problems(window)
        for card in window.chat_view.widgets:  # wrapped anywhere: no sideways scrolling
            for part in card.body.parts:
                assert part.horizontalScrollBar().maximum() == 0
                assert part.document().size().width() <= part.viewport().width() + 1
    finally:
        close_window(window)


def test_a_long_code_line_scrolls_inside_its_code_block(qtbot, tmp_path):
    code = "```python\nvalues = [" + ", ".join(str(i) for i in range(200)) + "]\n```"
    prose = "A list of numbers, written out in full so that you can copy it. " * 4
    window = make_window(qtbot, tmp_path, FakeEngine(replies=[prose + "\n\n" + code]))
    try:
        send(qtbot, window, "numbers")
        settle()
        reply = window.chat_view.widgets[-1]
        assert not layout_problems(window)
        (prose_view,) = reply.body.prose_views()
        (code_view,) = reply.body.code_views()
        bar = code_view.horizontalScrollBar()
        assert bar.isVisible() and bar.maximum() > 0
        # the prose wraps at the view's width and does not scroll: its first line ends before
        # the edge
        assert prose_view.horizontalScrollBar().maximum() == 0
        first_line = prose_view.document().firstBlock().layout().lineAt(0)
        assert first_line.naturalTextWidth() <= prose_view.viewport().width()
        # and the last line of the code is not hidden under the scroll bar
        assert code_view.height() >= code_view.document().size().height() + bar.height()
    finally:
        close_window(window)


@pytest.mark.parametrize("font_size", [10, 16])
def test_a_code_block_scrolls_by_itself_while_the_paragraph_wraps(qtbot, tmp_path, look, font_size):
    """A 400-character code line: only its own block scrolls sideways; the paragraph above it
    wraps within the card, and the card is no wider than the chat."""
    look("light", font_size)
    paragraph = "This paragraph explains the line below in plain words. " * 6
    line = "x = '" + "abcdefghij" * 40 + "'"  # 406 characters, no space to wrap at
    assert len(line) == 406
    reply = paragraph + "\n\n```python\n" + line + "\n```\n\nAnd a last sentence."
    window = make_window(qtbot, tmp_path, FakeEngine(replies=[reply]))
    try:
        window.resize(1280, 800)
        send(qtbot, window, "explain")
        settle()
        card = window.chat_view.widgets[-1]
        port = window.chat_view.viewport()
        assert card.width() <= port.width()
        assert not layout_problems(window)
        (code_view,) = card.body.code_views()
        assert code_view.toPlainText().endswith(line)
        assert code_view.horizontalScrollBar().maximum() > 0
        # no other part of the message scrolls sideways: the paragraphs wrap to the card
        prose = card.body.prose_views()
        assert [p.toPlainText() for p in prose] == [paragraph.strip(), "And a last sentence."]
        for part in prose:
            assert part.horizontalScrollBar().maximum() == 0
            assert part.width() <= card.contentsRect().width()
        assert prose[0].document().firstBlock().layout().lineCount() > 1  # it wrapped
    finally:
        close_window(window)


def test_the_side_panel_fits_at_16_pt_without_sideways_scrolling(qtbot, tmp_path, look):
    """At 16 pt and the default width the right panel is at its narrowest (180 px); the usage
    panel ("Usage — selected reply", "Prefill speed  24,550.5 tok/s") asked for 368 px and
    made it scroll sideways. Now it asks for no more than the panel has, and shows every value
    whole (wrapped, speeds written compactly) at that width."""
    from app.views.usage_panel import UsagePanel

    look("light", 16)
    usage = {
        "prompt_tokens": 12345,
        "completion_tokens": 678,
        "prompt_tok_s": 24550.5,
        "decode_tok_s": 1234.5,
        "context_used": 13023,
        "context_limit": 32768,
    }
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["Paris."]))
    try:
        window.resize(1280, 800)
        send(qtbot, window, "Capital of France?")
        window.usage_panel.show_usage(usage, "length")
        settle()
        side = window.side_panel
        room = side.viewport().width()
        assert side.isVisible() and room < 200  # the panel at its narrowest
        assert window.usage_panel.minimumSizeHint().width() <= room
        # nor does anything else in it (the TTFT title, the Sampling tab's buttons) need more
        for tab in range(window.tabs.count()):
            window.tabs.setCurrentIndex(tab)
            settle()
            assert side.horizontalScrollBar().maximum() == 0, (
                f"with the {window.tabs.tabText(tab)} tab the side panel's contents need "
                f"{side.widget().minimumSizeHint().width()} px in {room} px"
            )
    finally:
        close_window(window)
    # laid out at that width, nothing in it is cut or past its edge
    holder = QWidget()  # as in the side panel: a child, laid out at the width it is given
    qtbot.addWidget(holder)
    panel = UsagePanel(holder)
    panel.show_usage(usage, "length")
    holder.resize(room, 800)
    panel.setGeometry(0, 0, room, 800)
    holder.show()
    qtbot.waitExposed(holder)
    settle()
    assert panel.width() == room
    assert panel.text_of("prompt_tok_s") == "24.6k tok/s"
    assert panel.text_of("decode_tok_s") == "1.2k tok/s"
    assert "24,550.5 tokens per second" in panel.fields["prompt_tok_s"].toolTip()
    assert panel.title() == "Usage — selected reply"  # the whole title, elided only when drawn
    labels = [w for w in panel.findChildren(QLabel) if w.isVisible()]
    assert len(labels) >= 2 * len(panel.fields)
    for label in labels:
        right_edge = label.mapTo(panel, QPoint(label.width(), 0)).x()
        assert right_edge <= room, f"{label.text()!r} ends at {right_edge} px of {room}"
        assert label.width() >= label.minimumSizeHint().width(), f"{label.text()!r} squeezed"
        if label.wordWrap():
            assert label.height() >= label.heightForWidth(label.width()), f"{label.text()!r} cut"
    bar = panel.context_bar
    assert bar.mapTo(panel, QPoint(bar.width(), 0)).x() <= room
    # its numbers shown whole, inside the bar (the word "tokens" goes first when short of
    # room, then the digits: 13,023 is 13.0k)
    assert bar.text() in ("13,023 / 32,768", "13.0k / 32.8k"), bar.text()
    assert bar.fontMetrics().horizontalAdvance(bar.text()) <= bar.width(), bar.text()
    assert bar.toolTip().endswith(": 13,023 of 32,768 tokens")  # exact in the tooltip


def test_the_tool_approval_buttons_wrap_in_a_narrow_chat(qtbot, look):
    from app.store import StoredMessage
    from app.views.chat_view import ChatView
    from engine.types import Role, ToolApproval

    look("light", 16)
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(320, 600)  # a narrow chat column (side panels open on a small screen)
    view.show()
    qtbot.waitExposed(view)
    tool = {"name": "add", "server": "test", "arguments": {"a": 2, "b": 3}}
    message = StoredMessage(
        7, 1, 2, Role.TOOL, "", status=MessageStatus.STREAMING,
        tool={**tool, "approval": ToolApproval.PENDING},
    )  # fmt: skip
    card = view.add_message(message)
    settle()
    assert card.approval_row.isVisible()
    port = view.viewport()
    assert card.width() <= port.width()
    buttons = (card.allow_once_button, card.allow_always_button, card.deny_button)
    area = card.contentsRect()
    for button in buttons:
        name = button.accessibleName() or button.text()
        assert button.isVisible()
        box = button.geometry().translated(button.parentWidget().mapTo(card, QPoint(0, 0)))
        assert area.contains(box), f"{name!r} at {box} outside the card {area}"
        # not squeezed below what its words need (a push button's text would be cut)
        assert button.width() >= button.minimumSizeHint().width(), f"{name!r} squeezed"
        assert button.height() >= button.minimumSizeHint().height(), f"{name!r} squeezed"
    for button in buttons:  # and its words all shown: wrapped, not cut
        label = button.label
        assert label.height() >= label.heightForWidth(label.width())
    # no two buttons overlap
    boxes = [b.geometry() for b in buttons]
    assert not any(a.intersects(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert not layout_problems(type("Window", (), {"chat_view": view})())
    # and a button still answers
    with qtbot.waitSignal(card.approvalGiven, timeout=WAIT_MS) as given:
        qtbot.mouseClick(card.allow_always_button, Qt.LeftButton)
    assert given.args == [7, ToolApproval.ALWAYS]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_an_unchecked_checkbox_is_visible(qtbot, look, theme):
    """The edge of an unchecked box stands out from the window (WCAG 2.1 1.4.11: 3:1 for a
    control's boundary); in the dark theme Fusion's own box was 1.2:1. Read from the pixels
    painted inside the box's rectangle, against the window colour painted beside it."""
    from PySide6.QtWidgets import QCheckBox, QStyle, QStyleOptionButton, QVBoxLayout

    look(theme, 11)
    holder = QWidget()
    qtbot.addWidget(holder)
    column = QVBoxLayout(holder)
    unchecked, checked = QCheckBox("Calculator"), QCheckBox("Web fetch")
    checked.setChecked(True)
    column.addWidget(unchecked)
    column.addWidget(checked)
    holder.show()
    qtbot.waitExposed(holder)
    settle()

    def box_colors(box: QCheckBox) -> tuple[QColor, list[QColor]]:
        option = QStyleOptionButton()
        box.initStyleOption(option)
        rect = box.style().subElementRect(QStyle.SE_CheckBoxIndicator, option, box)
        image = holder.grab().toImage()
        origin = box.mapTo(holder, rect.topLeft())
        window = QColor.fromRgb(image.pixel(2, 2))  # the holder's corner: the window colour
        inside = [
            QColor.fromRgb(image.pixel(origin.x() + x, origin.y() + y))
            for x in range(rect.width())
            for y in range(rect.height())
        ]
        return window, inside

    window, inside = box_colors(unchecked)
    assert window == holder.palette().color(QPalette.Window)
    edge = max(_contrast(window, color) for color in inside)
    assert edge >= 3.0, f"the unchecked box's edge is {edge:.2f}:1 against the window"
    # and a ticked box still looks ticked: its inside differs from the unticked one
    _, ticked = box_colors(checked)
    assert {c.rgb() for c in ticked} != {c.rgb() for c in inside}
