"""Direct mode: a conversational message is answered without sending the tool schemas.

A greeting, a thank-you or a goodbye needs no tool, yet every model call pays for the schemas of
all the agent's tools (for the admin assistant, more than the conversation itself). The rule that
decides is deliberately cheap and deterministic, so the workflow can apply it: the message is
short and every word of it is small talk (`SMALL_TALK`). Anything else, including "yes", "ok" or
"go ahead" (which answer the assistant's own question and may mean "do it"), gets the tools.

When the rule is wrong, nothing is lost: the model is told that no tools came with this message and
to answer exactly `NEED_TOOLS` if it needs one; that answer (or a tool call it makes anyway) is not
kept in the model's window, and the same turn asks again with the tools. The user's message is the
same message; only the request differs.
"""

from __future__ import annotations

import re

from countersign.core.messages import ChatMessage

NEED_TOOLS = "NEED_TOOLS"
# The `name` of the stored marker reply: not a turn's end (countersign.db.events skips it)
MARKER_NAME = "needs_tools"
DIRECT_NOTE = (
    "No tools were sent with this message because it reads as small talk. If answering it needs a "
    f"tool or the workspace's data, reply with exactly {NEED_TOOLS} and nothing else; otherwise reply "
    "briefly."
)
MAX_DIRECT_WORDS = 8
# Greetings, thanks and goodbyes, nothing that could answer a question or ask for an action.
SMALL_TALK = frozenset(
    """
    hi hello hey hiya howdy greetings good morning afternoon evening day night there
    thanks thank you thx ty cheers much very so a lot many appreciated appreciate it for your
    bye goodbye see later soon take care have nice great
    how are doing is going
    """.split()
)
WORD = re.compile(r"[a-z]+")


def conversational(text: str) -> bool:
    """Whether `text` is small talk the model can answer without tools (see the module docstring)."""
    if len(text) > 200 or any(ch.isdigit() for ch in text):
        return False
    words = WORD.findall(text.casefold().replace("'", ""))
    return 0 < len(words) <= MAX_DIRECT_WORDS and all(w in SMALL_TALK for w in words)


def marker() -> ChatMessage:
    """What is stored for a direct reply that wants the tools (the model's own words are dropped)."""
    return ChatMessage(role="assistant", content=NEED_TOOLS, name=MARKER_NAME)


def is_marker(message: ChatMessage) -> bool:
    """Whether a model call's (recorded) reply is the marker. The workflow decides on this, not on
    the rule: a history replays the same way whatever a later build's `SMALL_TALK` says."""
    return message.role == "assistant" and message.name == MARKER_NAME and not message.tool_calls


def wants_tools(message: ChatMessage) -> bool:
    """Whether a reply to a direct request asks for the tools after all: a tool call it was not
    offered, or the marker (allowing what a model adds around it: a period, a label)."""
    content = message.content or ""
    return (
        bool(message.tool_calls)
        or message.name == MARKER_NAME
        or (NEED_TOOLS in content and len(content) <= 3 * len(NEED_TOOLS))
    )
