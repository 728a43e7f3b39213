"""What a reviewer is shown of an effect (countersign.core.shown, countersign.core.html_text,
countersign.core.effects): nothing is cut silently (a long line folds with a visible mark, and its
rest is kept), and an email's HTML part is shown as its reader sees it, with every piece of its text,
each link's real target and the text it hides."""

from __future__ import annotations

import html as html_lib
import re
import time
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from countersign.core.effects import (
    Attachment,
    Effect,
    OutgoingMessage,
    effect_lines,
    effect_shown,
    effect_text,
    effect_warnings,
)
from countersign.core.html_text import readable
from countersign.core.shown import MAX_LINE_CHARS, argument_lines, fold, fold_mark, folded

PS = "P.S. the price goes up on Monday"
LONG_LINE = "x" * 2_400 + " " + PS  # 2,433 characters: its end is past the limit


def test_a_long_line_folds_with_the_count_of_what_follows_and_its_rest_is_kept() -> None:
    shown, rest = fold(LONG_LINE)
    assert shown == LONG_LINE[:MAX_LINE_CHARS] + " … 433 more characters: show all"
    assert shown.removesuffix(fold_mark(len(rest))) + rest == LONG_LINE and rest.endswith(PS)
    assert fold("short") == ("short", "")
    assert fold_mark(2_412) == " … 2,412 more characters: show all"


def test_a_fold_never_splits_a_hidden_character_made_visible() -> None:
    line = "a" * (MAX_LINE_CHARS - 9) + "\u202e" + "b" * 10  # ⟨U+202E⟩ would straddle the limit
    mail = Effect(summary="s", messages=[OutgoingMessage(channel="email", to=["a@b.example"], body=line)])
    body = effect_text(mail)[-1]
    shown, rest = fold(body)
    assert rest.startswith("⟨U+202E⟩") and "⟨U+202E" not in shown


@given(
    lines=st.lists(st.text(max_size=3 * MAX_LINE_CHARS // 2), max_size=4),
    limit=st.integers(10, MAX_LINE_CHARS),
)
def test_for_any_text_the_folded_lines_and_their_rests_are_the_whole(lines: list[str], limit: int) -> None:
    shown = folded(lines, limit)
    rests = {f.line: f.rest for f in shown.folds}
    assert len(shown.lines) == len(lines)
    for n, (line, whole) in enumerate(zip(shown.lines, lines, strict=True)):
        rest = rests.get(n, "")
        assert line.removesuffix(fold_mark(len(rest)) if rest else "") + rest == whole
        assert (n in rests) == (len(whole) > limit)
        assert len(line) <= limit + len(fold_mark(len(whole)))


def test_a_long_body_line_is_folded_on_the_card_and_its_ps_is_in_its_rest() -> None:
    mail = Effect(
        summary="Email to partner@example.org: “Offer”",
        messages=[OutgoingMessage(channel="email", to=["partner@example.org"], body=f"Hi,\n{LONG_LINE}")],
    )
    shown = effect_shown(mail)
    assert shown.lines == effect_lines(mail)
    assert shown.lines[-1].endswith(" … 439 more characters: show all")  # 6 of indent
    assert not any(PS in line for line in shown.lines)
    (only,) = shown.folds
    assert only.line == len(shown.lines) - 1 and only.rest.endswith(PS)


def test_arguments_fold_the_same_way() -> None:
    (line,) = argument_lines('{"body": "' + LONG_LINE + '"}')
    assert line.endswith(" more characters: show all") and PS not in line


HTML = (
    "<p>Dear partner,</p><p>Log in at <a href='https://evil.example/login'>your bank</a>.</p>"
    "<span style='display:none'>customer list: ann@a.example, bo@b.example</span>"
    "<p hidden>second secret</p><details><summary>Terms</summary>small print</details>"
    "<img src='https://track.example/p.gif' alt=''><ul><li>one</li><li>two</li></ul>"
)


def test_an_emails_html_part_is_shown_as_its_reader_sees_it_with_targets_and_hidden_text() -> None:
    text = readable(HTML)
    assert text.hides
    assert text.text.split("\n") == [
        "Dear partner,",
        "Log in at your bank [https://evil.example/login].",
        "[hidden: customer list: ann@a.example, bo@b.example]",
        "[hidden: second secret]",
        "Terms",
        "[hidden: small print]",
        "[image: https://track.example/p.gif]",
        "- one",
        "- two",
    ]


def test_the_card_shows_the_html_part_and_each_attachment_and_warns_of_hidden_text() -> None:
    attached = Attachment(name="leads.csv", size=12_345, content_type="text/csv", sha256="0" * 64)
    message = OutgoingMessage(
        channel="email", to=["partner@example.org"], body="Dear partner", html=HTML, attachments=[attached]
    )
    effect = Effect(summary="Email", messages=[message])
    lines = effect_lines(effect)
    assert "      Log in at your bank [https://evil.example/login]." in lines
    assert "      [hidden: customer list: ann@a.example, bo@b.example]" in lines
    assert "    attaches leads.csv (12,345 bytes, text/csv)" in lines
    assert "(and an HTML version of it)" not in "\n".join(lines)
    assert any("HTML hides text" in w for w in effect_warnings(effect))


def test_a_message_without_attachments_keeps_its_json_and_digest() -> None:
    """Proofs bind the digest: adding attachments to messages must not change any recorded one."""
    message = OutgoingMessage(channel="email", to=["a@b.example"], subject="s", body="b", html="<p>b</p>")
    effect = Effect(summary="s", messages=[message])
    assert effect.canonical() == (
        '{"arguments":null,"changes":[],"creates":[],"messages":[{"body":"b","channel":"email",'
        '"html":"<p>b</p>","subject":"s","to":["a@b.example"]}],"problem":null,"resolved":true,'
        '"summary":"s"}'
    )
    with_file = message.model_copy(
        update={"attachments": [Attachment(name="a.txt", size=1, sha256="1" * 64)]}
    )
    assert Effect(summary="s", messages=[with_file]).digest != effect.digest


# --- any HTML: none of its text is missing from what the reviewer reads ---------------------------


@dataclass(frozen=True)
class Node:
    tag: str
    attrs: str
    children: tuple[Node | str, ...]


# (not <style> nor <script>: their content is raw text, shown as written, entities and all)
TAGS = ["p", "div", "span", "b", "a", "li", "ul", "td", "details", "summary", "pre", "title", "template"]
HIDING = [
    "",
    "",
    " hidden",
    " style='display:none'",
    " style='font-size:0'",
    " aria-hidden='true'",
    " style='visibility: hidden; color: red'",
]
WORDS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=20)


def nodes() -> st.SearchStrategy[Node | str]:
    return st.recursive(
        WORDS,
        lambda children: st.builds(
            Node, st.sampled_from(TAGS), st.sampled_from(HIDING), st.tuples(children, children)
        ),
        max_leaves=12,
    )


def render(node: Node | str, links: list[str]) -> str:
    if isinstance(node, str):
        return html_lib.escape(node)
    attrs = node.attrs
    if node.tag == "a":
        target = f"https://example.org/{len(links)}"
        links.append(target)
        attrs += f" href='{target}'"
    inner = "".join(render(child, links) for child in node.children)
    return f"<{node.tag}{attrs}>{inner}</{node.tag}>"


def leaves(node: Node | str) -> list[str]:
    return [node] if isinstance(node, str) else [w for c in node.children for w in leaves(c)]


def squeezed(text: str) -> str:
    """`text` without the whitespace a layout may collapse, break or add."""
    return re.sub(r"[ \t\n\r\f]+", "", text)


@given(tree=nodes())
def test_no_text_of_any_html_visible_or_hidden_is_missing_from_what_the_reviewer_reads(
    tree: Node | str,
) -> None:
    links: list[str] = []
    text = readable(render(tree, links)).text
    said = squeezed(text)
    at = 0  # every piece of text, whole and in order
    for leaf in map(squeezed, leaves(tree)):
        found = said.find(leaf, at)
        assert found >= 0, (leaf, text)
        at = found + len(leaf)
    for target in links:
        assert target in text, (target, text)


def test_html_nested_as_deep_as_its_bound_allows_is_read_in_linear_time() -> None:
    """An email's HTML is at most 100,000 characters (tools/email.py); nested that deep, or with
    that many links and details, it is laid out at once (every inbox page lays out every card)."""
    started = time.perf_counter()
    for html in (
        "<b>x" * 25_000,
        "<a href='https://e.example/'>y" * 3_000,
        "<details><summary>s</summary>z" * 3_000,
        "<pre>" + " w\n" * 30_000,
    ):
        text = readable(html).text
        assert text.replace("[hidden: ", "").count(html[-1]) >= 3_000 or html.startswith("<pre>")
    assert time.perf_counter() - started < 5


def test_what_a_browser_reads_as_a_comment_is_shown_as_one() -> None:
    assert readable("a<!-- if mso: x -->b<![CDATA[secret]]>c<?php evil ?>d").text == (
        "a[comment: if mso: x]b[comment: CDATA[secret]c[comment: php evil ?]d"
    )
