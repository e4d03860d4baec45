"""Readable text from an HTML page, with the standard library's html.parser.

Why html.parser: it is in every Python, never raises on broken markup (it reads what a browser
would show from tag soup), and a page's readable text needs only a few rules: leave out what
is never shown (script, style, template, svg, head apart from the title, hidden elements),
start a new line at block elements, mark headings with '#' so the model sees the outline, keep
list items as '- ' lines and table cells apart. Navigation and footers are left out too: they
repeat on every page and crowd the text a small model can take.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

# Elements whose content is never readable text.
_SKIP = {"script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "head"}
# Page furniture: the same on every page of a site.
_FURNITURE = {"nav", "footer", "aside"}
_BLOCK = {
    "p", "div", "section", "article", "main", "header", "br", "hr", "blockquote", "pre",
    "ul", "ol", "dl", "dt", "dd", "table", "tr", "form", "fieldset", "figure", "figcaption",
    "address", "details", "summary",
}  # fmt: skip
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_VOID = {"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "source",
         "track", "wbr", "param"}  # fmt: skip


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self._skip_stack: list[str] = []  # open elements whose content is left out
        self._in_title = False
        self._pre = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        attributes = dict(attrs)
        if tag == "title":  # inside <head>, which is otherwise left out
            self._in_title = True
            return
        if self._skip_stack:
            if tag not in _VOID:
                self._skip_stack.append(tag)
            return
        hidden = "hidden" in attributes or attributes.get("aria-hidden") == "true"
        style = (attributes.get("style") or "").replace(" ", "").lower()
        if tag in _SKIP or tag in _FURNITURE or hidden or "display:none" in style:
            if tag not in _VOID:
                self._skip_stack.append(tag)
            return
        if tag in _HEADINGS:
            self.parts.append("\n\n" + "#" * _HEADINGS[tag] + " ")
        elif tag == "li":
            self.parts.append("\n- ")
        elif tag in ("td", "th"):
            self.parts.append(" | ")
        elif tag in _BLOCK:
            self.parts.append("\n")
        if tag == "pre":
            self._pre += 1
        if tag == "img" and attributes.get("alt"):
            self.parts.append(f"[image: {attributes['alt']}]")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
            return
        if self._skip_stack:
            # Close up to the matching open element: unclosed children (<li>, <p>) are common.
            if tag in self._skip_stack:
                while self._skip_stack and self._skip_stack.pop() != tag:
                    pass
            return
        if tag in _HEADINGS or tag in _BLOCK:
            self.parts.append("\n")
        if tag == "pre" and self._pre:
            self._pre -= 1

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
            return
        if self._skip_stack:
            return
        self.parts.append(data if self._pre else re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> tuple[str, str]:
    """(title, readable text) of an HTML document; never raises on malformed markup."""
    reader = _Reader()
    reader.feed(html)
    reader.close()
    title = " ".join("".join(reader.title).split())
    lines = [line.strip() for line in "".join(reader.parts).splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return title, text
