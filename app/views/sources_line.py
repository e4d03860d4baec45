"""The compact "Sources: [1] pump-manual.md › Warranty · [2] …" line under a reply whose prompt
carried document passages (issue 34). Small models seldom write [n] markers, and without the line
such a reply showed nothing of its sources; every reply with passages gets it, markers or not.
Each entry is a cite:N link, opened the way a [n] marker in the text is (the Sources dialog at
that passage)."""

from __future__ import annotations

import html
from pathlib import PureWindowsPath

from app.views.sources_view import CITE_SCHEME

SEPARATOR = " · "


def entry_label(entry: dict) -> str:
    """'pump-manual.md p.3 › Warranty': the file's name, its page, and the innermost heading (the
    full path is in the Sources dialog; the line stays one glance long)."""
    # PureWindowsPath splits on both / and \: a collection indexed on Windows names its files so
    name = PureWindowsPath(str(entry.get("file") or "?")).name
    if entry.get("page") is not None:
        name += f" p.{entry['page']}"
    heading = [str(h) for h in entry.get("heading") or []]
    return f"{name} › {heading[-1]}" if heading else name


def sources_line_html(section: dict | None) -> str:
    """The line as rich text for a QLabel, or "" when the reply's prompt carried no passage."""
    entries = [s for s in (section or {}).get("sources") or [] if s.get("marker")]
    if not entries:
        return ""
    links = [
        f'<a href="{CITE_SCHEME}:{int(s["marker"])}">[{int(s["marker"])}] '
        f"{html.escape(entry_label(s))}</a>"
        for s in sorted(entries, key=lambda s: int(s["marker"]))
    ]
    return "Sources: " + SEPARATOR.join(links)
