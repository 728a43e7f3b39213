"""The bounds a tenant's policy text must keep before the Cedar engine reads it.

The engine (`cedarpy`, native code) parses recursively: a condition nested about 700 brackets deep
(`(`, `[` or `{`), or about 10,000 `if … then … else` deep, overflows its stack and the process
dies (a segfault, not an exception), whichever process it is: the server's, the worker's. So the text
is scanned here first, by a small lexer that knows Cedar's string literals (`"…"` with `\\` escapes)
and line comments (`// …`), so that a bracket or an `if` in a string or a comment counts for nothing:

- `MAX_POLICY_CHARS`: the whole file, in characters;
- `MAX_NESTING`: how deep an expression may nest, counting each open bracket and each `if` still
  open in the bracket group it appears in (an over-count: `if a then b else c && if …` counts two).

Both are far above what a readable policy uses (a set of a few hundred policies fits many times;
real conditions nest a handful of levels) and far below what hurts the engine (docs/explanation/
policy-engine.md). Pure: no I/O.
"""

from __future__ import annotations

MAX_POLICY_CHARS = 200_000
MAX_NESTING = 32

_OPEN = "([{"
_CLOSE = ")]}"


def _word_at(text: str, i: int) -> str:
    j = i
    while j < len(text) and (text[j].isalnum() or text[j] == "_"):
        j += 1
    return text[i:j]


def _where(text: str, i: int) -> str:
    line = text.count("\n", 0, i) + 1
    column = i - (text.rfind("\n", 0, i) + 1) + 1
    return f"line {line}, column {column}"


def bounds_refusal(text: str) -> str | None:
    """Why `text` may not reach the Cedar engine (naming the bound and where it is passed), or
    None when it keeps both bounds. Reads each character once; stops at the first excess."""
    if len(text) > MAX_POLICY_CHARS:
        return f"the policy text is {len(text)} characters, over the limit of {MAX_POLICY_CHARS}"
    groups: list[int] = [0]  # per open bracket group: the `if`s opened in it
    depth = 0  # open brackets plus open `if`s
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':  # a string literal: skip to its closing quote (an escape skips one character)
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c in _OPEN or (c == "i" and (i == 0 or not _ident(text[i - 1])) and _word_at(text, i) == "if"):
            if c in _OPEN:
                groups.append(0)
            else:
                groups[-1] += 1
            depth += 1
            if depth > MAX_NESTING:
                return (
                    f"the policy text nests deeper than {MAX_NESTING} levels (brackets and `if`s) at "
                    f"{_where(text, i)}: the limit is {MAX_NESTING}"
                )
        elif c in _CLOSE and len(groups) > 1:
            depth -= groups.pop() + 1
        elif c == ";" and len(groups) == 1:  # a policy ends: its `if`s end with it
            groups, depth = [0], 0
        i += 1
    return None


def _ident(c: str) -> bool:
    return c.isalnum() or c == "_"
