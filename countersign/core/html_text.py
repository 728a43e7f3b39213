"""An email's HTML part as readable text, for the person who decides whether it is sent.

A mail program shows the HTML, not the text part, so a reviewer must read what the HTML says,
not what the text part claims it says. `readable(html)` lays the HTML out as text with the stdlib's
HTML parser (`html.parser`, lenient: it never raises on malformed input):

- every piece of text the HTML holds is in it, in order, whitespace collapsed as a browser would
  (kept in `<pre>`), blocks and `<br>` on their own lines, list items as `- `;
- a link is its text followed by its real target, `text [https://…]`, so "your bank" pointing
  elsewhere shows where it points; an image is `[image: alt src]`;
- text the recipient would not see (an element with `hidden`, `aria-hidden`, a style such as
  `display:none`, `visibility:hidden`, `font-size:0`, `opacity:0`; the content of `<head>`,
  `<title>`, `<style>`, `<script>`, `<template>`, `<noscript>`; a closed `<details>` beyond its
  summary) is shown all the same, between `[hidden: ` and `]`, and `hides` says there was some;
- a comment (and what a browser reads as one: `<![CDATA[…]]>`, `<?…>`) is shown as `[comment: …]`:
  some mail programs render conditional comments.

Marking is best effort (text coloured as its background is not detected); showing is not: every
piece of text is in `text`, marked or not.

Pure: no I/O, the same text wherever it is shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from html.parser import HTMLParser

# Elements that start and end a line of their own.
BLOCKS = frozenset(
    "address article aside blockquote caption center dd details div dl dt figcaption figure footer "
    "form h1 h2 h3 h4 h5 h6 header hgroup hr li main nav ol p pre section summary table tbody td tfoot "
    "th thead tr ul".split()
)
# Elements that never hold content (no end tag to wait for).
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
# Elements whose content a mail program does not show as text.
UNSEEN = frozenset("head title style script template noscript".split())
# Inline styles that hide an element's text: display:none, visibility:hidden/collapse, a zero font
# size, a zero opacity, a zero height or width with what overflows clipped.
HIDING_STYLE = re.compile(
    r"display\s*:\s*none|visibility\s*:\s*(hidden|collapse)|font-size\s*:\s*0(\.0*)?(px|pt|em|rem|%)?\s*(;|$)"
    r"|opacity\s*:\s*0(\.0*)?\s*(;|$)|(max-)?(height|width)\s*:\s*0(px)?\s*(;|$)",
    re.IGNORECASE,
)
SPACES = re.compile(r"[ \t\n\r\f]+")
HIDDEN_OPEN, HIDDEN_CLOSE = "[hidden: ", "]"


@dataclass(frozen=True)
class HtmlText:
    """An HTML part laid out as text (`text`), and whether it hides some of it from its reader."""

    text: str
    hides: bool


@dataclass
class _Open:
    tag: str
    href: str | None = None  # a link's target
    hides: bool = False  # its content is hidden from the reader (counted in `_Layout.hidden`)
    marks: bool = False  # it opened the hidden region (wrote `[hidden: `, writes its `]`)
    start: int = 0  # the output's chunk where its text starts (a link's text)
    length: int = 0  # how many characters were written before it


class _Layout(HTMLParser):
    """One pass over the HTML, each event in constant time (amortized) however deep the nesting:
    open elements are counted by tag, so no event searches the stack."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.length = 0  # characters written
        self.last = "\n"  # the last character written ("\n" before any)
        self.stack: list[_Open] = []
        self.open: dict[str, int] = {}  # open elements by tag
        self.details: list[_Open] = []  # the open <details>, innermost last
        self.hidden = 0  # how many open elements hide their content
        self.hides = False

    # --- output ---

    def _write(self, text: str) -> None:
        if text:
            self.out.append(text)
            self.length += len(text)
            self.last = text[-1]

    def _break(self) -> None:
        """End the current line (once: consecutive blocks make no empty lines of their own)."""
        if self.last != "\n":
            self._write("\n")

    def _hide(self, opened: _Open) -> None:
        opened.hides = True
        if not self.hidden:
            opened.marks = True
            self._write(HIDDEN_OPEN)
            self.hides = True
        self.hidden += 1

    # --- the parser's events ---

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag in BLOCKS:
            self._break()
        if tag == "br":
            self._write("\n")
        elif tag == "img":
            what = " ".join(v for v in (values.get("alt", "").strip(), values.get("src", "").strip()) if v)
            self._write(f"[image: {what}]" if what else "[image]")
        elif tag == "li":
            self._write("- ")
        if tag in VOID:
            return
        opened = _Open(tag, values.get("href") if tag == "a" else None)
        if (
            tag in UNSEEN
            or "hidden" in values
            or values.get("aria-hidden", "").strip().lower() == "true"
            or HIDING_STYLE.search(values.get("style", ""))
        ):
            self._hide(opened)
        opened.start, opened.length = len(self.out), self.length
        self.stack.append(opened)
        self.open[tag] = self.open.get(tag, 0) + 1
        if tag == "details":
            self.details.append(opened)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open.get(tag):
            return  # an end tag nothing opened: ignored, as a browser does
        while self.stack:
            opened = self.stack.pop()
            self._closed(opened)
            if opened.tag == tag:
                break
        # what follows a <details>' summary shows only once the reader opens it
        if tag == "summary" and self.details and not self.details[-1].hides:
            self._hide(self.details[-1])

    def _closed(self, opened: _Open) -> None:
        self.open[opened.tag] -= 1
        if opened.tag == "details":
            self.details.pop()
        if opened.href is not None:
            target = opened.href.strip()
            # the link's text, read only when it may be its target (a long text cannot be)
            near = self.length - opened.length <= 2 * len(target) + 16
            said = " ".join("".join(self.out[opened.start :]).split()) if near else None
            if target and target != said:
                self._write(f" [{target}]" if said else f"[{target}]")
        if opened.hides:
            self.hidden -= 1
        if opened.marks:
            self._write(HIDDEN_CLOSE)
        if opened.tag in BLOCKS:
            self._break()

    def handle_data(self, data: str) -> None:
        if self.open.get("pre"):
            self._write(data)
            return
        text = SPACES.sub(" ", data)
        if text.startswith(" ") and self.last in "\n ":
            text = text[1:]
        self._write(text)

    def handle_comment(self, data: str) -> None:
        if data.strip():
            self._write(f"[comment: {SPACES.sub(' ', data).strip()}]")

    # `<![CDATA[…]]>` and `<?…>` are comments to a browser: shown as such, not dropped
    unknown_decl = handle_comment
    handle_pi = handle_comment

    def laid_out(self) -> HtmlText:
        self.close()
        while self.stack:
            self._closed(self.stack.pop())
        kept: list[str] = []
        for line in "".join(self.out).split("\n"):
            line = line.rstrip(" ")
            if line or (kept and kept[-1]):  # no two empty lines in a row
                kept.append(line)
        return HtmlText("\n".join(kept).strip("\n"), self.hides)


@lru_cache(maxsize=256)  # a card's lines and its warnings read the same HTML; the inbox, every page
def readable(html: str) -> HtmlText:
    """`html` as the text a reviewer reads (module docstring): all of its text, links with their
    targets, hidden text shown and marked."""
    layout = _Layout()
    layout.feed(html)
    return layout.laid_out()
