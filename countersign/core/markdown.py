"""Text going into the Temporal Web UI's markdown (workflow summary and details, activity and timer
summaries): whatever the model, a tool argument or a user wrote must show as typed, not as a link,
emphasis or HTML. Pure: the workflow calls it."""

from __future__ import annotations

import re

# What inline markdown interprets mid-line: escapes, code, emphasis, links and images (`[`, `]`; `(`
# and `!` only act next to them), autolinks and HTML (`<`, `>`), strikethrough and table pipes.
_SPECIAL = re.compile(r"([\\`*_\[\]<>~|])")


def escape_markdown(text: str) -> str:
    """`text` with every character inline markdown would interpret backslash-escaped."""
    return _SPECIAL.sub(r"\\\1", text)
