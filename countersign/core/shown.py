"""How a call's arguments are shown to a person who decides on them (inbox card, notices, CLI).

A reviewer reads the *parsed* arguments, one key per line, in the one spelling the tool receives
(a key twice is refused before anyone is asked: `bounds.loads_strict`), with what could deceive a
reader made visible:

- invisible and direction-changing characters (zero-width, bidi overrides and isolates, soft
  hyphen, other format and control characters) are written as `⟨U+202E⟩` and flagged;
- an email address, URL or identifier (a value with no spaces and a digit or one of `@./:_+-`) that
  holds non-ASCII characters is flagged, naming each such character (`U+0430 CYRILLIC SMALL LETTER
  A`), and one word written in two scripts (Latin and Cyrillic, ...) is flagged wherever it is.

Nothing is cut silently: a line longer than `MAX_LINE_CHARS` is *folded*, its first
`MAX_LINE_CHARS` characters followed by the fold mark, ` … 2,412 more characters: show all` (the
count of what follows, with thousands separators), and the rest of it kept beside the lines as a
`Fold`, one click away on a page (the mark's "show all"), one command away in the CLI (`approvals
show`), one link away in a notice (the card). The shown part and the fold's rest are the whole line.

Pure: the same lines and warnings wherever they are shown.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from pydantic import BaseModel, ConfigDict

from countersign.core.bounds import loads_bounded

MAX_LINE_CHARS = 2_000
MAX_WARNINGS = 20
# What changes how text reads without showing itself: format (Cf: zero-width, bidi controls, soft
# hyphen), control (Cc, newline and tab included: a value's lines are its own), surrogates (Cs),
# private use (Co), line and paragraph separators.
HIDDEN_CATEGORIES = frozenset({"Cf", "Cc", "Cs", "Co", "Zl", "Zp"})
# A value with no spaces and one of these names something (an address, a domain, a file, an id).
NAMES_SOMETHING = re.compile(r"[0-9@./:_+-]")
ADDRESS = re.compile(r"^[^\s@]+@[^\s@]+$|^[a-zA-Z][a-zA-Z0-9+.-]*://|^www\.", re.IGNORECASE)


class Fold(BaseModel):
    """The rest of a folded line: what follows its shown part (`line`: the line's index)."""

    model_config = ConfigDict(frozen=True)

    line: int
    rest: str


class Folded(BaseModel):
    """Lines as shown (each long one cut, with the fold mark) and the rests of those folded."""

    model_config = ConfigDict(frozen=True)

    lines: list[str]
    folds: list[Fold] = []


def fold_mark(more: int) -> str:
    """What ends a folded line: ` … 2,412 more characters: show all`."""
    return f" … {more:,} more characters: show all"


def fold_at(line: str, limit: int) -> int:
    """Where a line longer than `limit` is cut: at `limit`, or before a `⟨U+…⟩` the cut would split
    (a hidden character is shown whole or not at all)."""
    opened = line.rfind("⟨", max(0, limit - len("⟨U+10FFFF⟩") + 1), limit)
    return opened if opened > 0 and line.find("⟩", opened) >= limit else limit


def fold(line: str, limit: int = MAX_LINE_CHARS) -> tuple[str, str]:
    """`line` as shown (cut with the fold mark when longer than `limit`) and its rest ("" if whole)."""
    if len(line) <= limit:
        return line, ""
    cut = fold_at(line, limit)
    return line[:cut] + fold_mark(len(line) - cut), line[cut:]


def folded(lines: list[str], limit: int = MAX_LINE_CHARS) -> Folded:
    """Every line folded at `limit`, with the rests of those that were."""
    shown: list[str] = []
    folds: list[Fold] = []
    for n, line in enumerate(lines):
        head, rest = fold(line, limit)
        shown.append(head)
        if rest:
            folds.append(Fold(line=n, rest=rest))
    return Folded(lines=shown, folds=folds)


def capped(warnings: list[str]) -> list[str]:
    """At most `MAX_WARNINGS` distinct warnings, and how many more there were."""
    unique = list(dict.fromkeys(warnings))
    more = len(unique) - MAX_WARNINGS
    return unique[:MAX_WARNINGS] + ([f"... and {more} more"] if more > 0 else [])


def is_hidden(char: str) -> bool:
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def plain(text: str) -> bool:
    """Printable ASCII (newlines and tabs aside): nothing in it hides, looks alike or mixes scripts."""
    return text.isascii() and text.replace("\n", "").replace("\t", "").isprintable()


def visible(text: str) -> str:
    """`text` with each hidden character written as `⟨U+XXXX⟩`."""
    if text.isascii() and text.isprintable():  # the common case, read at once
        return text
    return "".join(f"⟨U+{ord(c):04X}⟩" if is_hidden(c) else c for c in text)


def script_of(char: str) -> str | None:
    """The script of a letter, from its Unicode name (LATIN, CYRILLIC, GREEK, ...), else None."""
    if not char.isalpha():
        return None
    name = unicodedata.name(char, "")
    return name.split(" ", 1)[0] if name else None


def described(char: str) -> str:
    return f"{char} U+{ord(char):04X} {unicodedata.name(char, 'UNNAMED')}"


def string_warnings(where: str, text: str) -> list[str]:
    """What in one string (a key or a value) could deceive its reader."""
    if plain(text):
        return []
    warnings: list[str] = []
    hidden = sorted({f"U+{ord(c):04X}" for c in text if is_hidden(c) and c not in "\n\t"})
    if hidden:
        warnings.append(f"{where}: invisible or direction-changing characters {', '.join(hidden[:5])}")
    odd = [c for c in dict.fromkeys(text) if not c.isascii() and not is_hidden(c)]
    stripped = text.strip()
    if odd and stripped and not any(c.isspace() for c in stripped) and NAMES_SOMETHING.search(stripped):
        kind = (
            "an email address"
            if "@" in stripped
            else "a URL"
            if ADDRESS.search(stripped)
            else "an identifier"
        )
        warnings.append(f"{where}: non-ASCII characters in {kind}: {'; '.join(map(described, odd[:3]))}")
    for word in re.findall(r"\w+", text):
        scripts = sorted({s for s in map(script_of, word) if s is not None})
        if len(scripts) > 1:
            warnings.append(f"{where}: {visible(word)[:60]!r} mixes scripts ({', '.join(scripts)})")
            break
    return warnings


def _walk(where: str, value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.extend(string_warnings(where, value))
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            out.extend(string_warnings(f"key {visible(path)!r}", str(key)))
            _walk(visible(path), item, out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(f"{where}[{i}]", item, out)


def argument_warnings(arguments: str) -> list[str]:
    """What a reviewer must be told about `arguments` (JSON text) before deciding."""
    value, refusal = loads_bounded(arguments or "{}")
    if refusal is not None:
        return [f"the arguments are refused: {refusal}"]
    found: list[str] = []
    _walk("", value, found)
    return capped(found)


def argument_text(arguments: str) -> list[str]:
    """The parsed arguments, one key per line (`key: <JSON value>`), hidden characters visible,
    whole (`argument_lines` folds them)."""
    value, refusal = loads_bounded(arguments or "{}")
    if refusal is not None or not isinstance(value, dict):
        return [visible(f"(not a JSON object: {refusal or type(value).__name__}) {arguments}")]
    return [visible(f"{key}: {json.dumps(item, ensure_ascii=False)}") for key, item in value.items()]


def argument_lines(arguments: str) -> list[str]:
    """The arguments' lines as shown: each long one folded (the rests: `folded(argument_text(…))`)."""
    return folded(argument_text(arguments)).lines
