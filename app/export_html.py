"""Chats as one self-contained web page to share: inline CSS (light and dark through
prefers-color-scheme), code coloured by Pygments, reasoning, tool calls and tool results folded
in <details>, and each reply's receipt as data in a <script type="application/json"> block.

The page loads nothing from the network and runs nothing: every text from the chat is
HTML-escaped (markdown-it with raw HTML off escapes it; everything else goes through
html.escape), receipt JSON has "<", ">" and "&" written as \\u escapes so no "</script>" can end
its block, and a Content-Security-Policy forbids scripts and remote loads in case a browser ever
saw one.

ChatHtml(print_mode=True) renders the same chats for Qt's rich text (app/export_pdf.py): no
<details> (Qt shows no disclosure triangles, so reasoning is a quoted block), no receipts, and
code colours as inline styles, which Qt reads where it ignores most CSS classes."""

from __future__ import annotations

import datetime
import json
from html import escape

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from app.export import ROLE_TITLES
from app.export_job import ChatSnapshot, Step
from app.finish_reasons import end_note
from app.store import StoredMessage
from engine.types import MessageStatus, Role

# The chat view's code colours (app/views/code_blocks.py), so a shared page looks like the app.
LIGHT_STYLE, DARK_STYLE = "default", "monokai"
CODE_CLASS = "code"

PAGE_CSS = """
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1d1d1f; --muted: #6b6b70;
  --card: #f5f5f7; --user: #e8f0fe; --border: #d9d9de; --accent: #2f6fdf; --code-bg: #f6f8fa; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #1c1c1e; --fg: #ececf0; --muted: #a0a0a8; --card: #26262a; --user: #243350;
    --border: #3a3a40; --accent: #7aa7ff; --code-bg: #272822; }
}
body { background: var(--bg); color: var(--fg); margin: 0 auto; max-width: 52rem;
  padding: 1.5rem; font: 16px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif; }
a { color: var(--accent); }
header h1 { margin-bottom: .2rem; }
.meta { color: var(--muted); font-size: .875rem; margin-top: 0; }
nav ol { padding-left: 1.4rem; }
article.chat { border-top: 1px solid var(--border); margin-top: 2rem; padding-top: .5rem; }
.message { background: var(--card); border: 1px solid var(--border); border-radius: 10px;
  margin: .8rem 0; padding: .6rem 1rem; overflow-wrap: anywhere; }
.message.user { background: var(--user); }
.role { font-weight: 600; font-size: .9rem; }
.role .note { color: var(--muted); font-weight: 400; }
details { margin: .4rem 0; }
details > summary { cursor: pointer; color: var(--muted); }
.reasoning .body { border-left: 3px solid var(--border); padding-left: .8rem; color: var(--muted); }
pre { background: var(--code-bg); border-radius: 6px; padding: .6rem .8rem; overflow-x: auto; }
code { font-family: ui-monospace, "SF Mono", Menlo, Consolas, monospace; font-size: .9em; }
table { border-collapse: collapse; } th, td { border: 1px solid var(--border); padding: .2rem .5rem; }
"""


def render_html(chats: list[ChatSnapshot], step: Step) -> str:
    """The whole page; `step(done, total)` after each chat."""
    renderer = ChatHtml()
    total = len(chats)
    step(0, total)
    title = chats[0].conversation.title if len(chats) == 1 else f"{total} chats"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">",
        f"<title>{escape(title)}</title>",
        f"<style>{PAGE_CSS}{code_css()}</style>",
        "</head>",
        "<body>",
        "<header>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="meta">Exported from LocalChat on {escape(_date(None))}'
        f" · {total} chat{'s' if total != 1 else ''}</p>",
        "</header>",
    ]
    if total > 1:
        parts.append("<nav><ol>")
        parts += [
            f'<li><a href="#chat-{i}">{escape(c.conversation.title)}</a>'
            + (f' <span class="meta">({escape(c.project)})</span>' if c.project else "")
            + "</li>"
            for i, c in enumerate(chats, start=1)
        ]
        parts.append("</ol></nav>")
    for done, chat in enumerate(chats, start=1):
        parts.append(renderer.chat(chat, f"chat-{done}"))
        step(done, total)
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def code_css() -> str:
    light = HtmlFormatter(style=LIGHT_STYLE).get_style_defs(f".{CODE_CLASS}")
    dark = HtmlFormatter(style=DARK_STYLE).get_style_defs(f".{CODE_CLASS}")
    return f"\n{light}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"


def receipt_json(receipt: dict) -> str:
    """`receipt` as JSON safe inside a <script> element: "<", ">" and "&" as \\u escapes
    (JSON.parse and json.loads read them back unchanged)."""
    text = json.dumps(receipt, ensure_ascii=False, sort_keys=True)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _date(timestamp: float | None) -> str:
    moment = (
        datetime.datetime.now() if timestamp is None else datetime.datetime.fromtimestamp(timestamp)
    )
    return moment.strftime("%Y-%m-%d %H:%M")


class ChatHtml:
    """One chat as an HTML fragment (module docstring: the page, or Qt rich text to print)."""

    def __init__(self, print_mode: bool = False):
        self.print_mode = print_mode
        self.formatter = HtmlFormatter(
            style=LIGHT_STYLE, nowrap=True, noclasses=print_mode, cssclass=CODE_CLASS
        )
        # commonmark with raw HTML off: a "<script>" in a message becomes text; tables and
        # strikethrough as in GitHub's Markdown, which models write.
        self.markdown = MarkdownIt(
            "commonmark", {"html": False, "highlight": self.code, "breaks": False}
        ).enable(["table", "strikethrough"])

    def code(self, text: str, language: str, _attributes: str) -> str:
        try:
            lexer = get_lexer_by_name(language.strip()) if language.strip() else None
        except ClassNotFound:
            lexer = None
        body = escape(text) if lexer is None else highlight(text, lexer, self.formatter)
        style = ' style="background:#f6f8fa;"' if self.print_mode else ""
        return f'<pre class="{CODE_CLASS}"{style}><code>{body}</code></pre>\n'

    def chat(self, chat: ChatSnapshot, anchor: str) -> str:
        conversation = chat.conversation
        meta = [f"Started {_date(conversation.created_at)}"] if conversation.created_at else []
        if chat.project:
            meta.insert(0, f"Project: {chat.project}")
        meta.append(f"{len(chat.branch)} message{'s' if len(chat.branch) != 1 else ''}")
        parts = [
            f'<article class="chat" id="{anchor}">',
            f"<h2>{escape(conversation.title)}</h2>",
            f'<p class="meta">{escape(" · ".join(meta))}</p>',
        ]
        if conversation.system_prompt:
            parts.append(
                self.fold(
                    "system", "System prompt", self.markdown.render(conversation.system_prompt)
                )
            )
        parts += [self.message(m) for m in chat.branch]
        parts.append("</article>")
        return "\n".join(parts)

    def message(self, m: StoredMessage) -> str:
        role = m.role if m.role in {r.value for r in Role} else "message"
        heading = escape(ROLE_TITLES.get(m.role, m.role))
        note = (
            end_note(m.status, m.finish_reason, m.usage)
            if m.role == Role.ASSISTANT
            else ("" if m.status == MessageStatus.COMPLETE else str(m.status))
        )
        if m.version_count > 1:
            note = ", ".join(
                filter(None, [f"version {m.version_number} of {m.version_count}", note])
            )
        if note:
            heading += f' <span class="note">({escape(note)})</span>'
        parts = [
            f'<section class="message {role}" data-message-id="{m.id}">',
            f'<div class="role">{heading}</div>',
        ]
        if m.reasoning:
            parts.append(self.fold("reasoning", "Reasoning", self.markdown.render(m.reasoning)))
        if m.role == Role.TOOL and m.tool:
            tool = m.tool
            summary = f"Result of {tool.get('name')} ({tool.get('approval')}"
            summary += f", {tool['error']})" if tool.get("error") else ")"
            parts.append(self.fold("tool-result", summary, f"<pre>{escape(m.content)}</pre>"))
        else:
            parts.append(f'<div class="body">{self.markdown.render(m.content)}</div>')
        for call in m.tool_calls:
            function = call.get("function", {})
            parts.append(
                self.fold(
                    "tool-call",
                    f"Tool call {function.get('name')}",
                    f"<pre>{escape(_pretty_arguments(function.get('arguments')))}</pre>",
                )
            )
        for bad in (m.tool or {}).get("malformed") or []:
            parts.append(
                f'<p class="meta">Malformed tool call {escape(str(bad.get("name")))} (not run):'
                f" {escape(str(bad.get('problem')))}</p>"
            )
        if m.receipt is not None and not self.print_mode:
            parts.append(
                f'<script type="application/json" class="receipt" data-message-id="{m.id}">'
                f"{receipt_json(m.receipt)}</script>"
            )
        parts.append("</section>")
        return "\n".join(parts)

    def fold(self, kind: str, summary: str, body_html: str) -> str:
        """A folded block: <details> on the page, a quoted block when printed."""
        if self.print_mode:
            return (
                f"<p><i>{escape(summary)}</i></p>"
                f'<blockquote class="{kind}">{body_html}</blockquote>'
            )
        return (
            f'<details class="{kind}"><summary>{escape(summary)}</summary>'
            f'<div class="body">{body_html}</div></details>'
        )


def _pretty_arguments(arguments) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(arguments)
