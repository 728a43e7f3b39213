"""What a conversation carries into its next run, and what one model call may send.

Rule: keep the system prompt, then the most recent messages that fit `max_messages`, cut only at a
user message, so a turn is carried whole or not at all: no tool result loses the call it answers,
and the model never sees a conversation that starts mid-turn. The latest turn is always kept.
"""

from __future__ import annotations

from typing import Protocol

from countersign.core.messages import ChatMessage

MAX_CARRIED_MESSAGES = 200


def trim_for_carry(
    messages: list[ChatMessage], max_messages: int = MAX_CARRIED_MESSAGES
) -> list[ChatMessage]:
    system = [m for m in messages[:1] if m.role == "system"]
    rest = messages[len(system) :]
    turn_starts = [i for i, m in enumerate(rest) if m.role == "user"]
    budget = max_messages - len(system)
    for start in turn_starts:
        if len(rest) - start <= budget:
            return system + rest[start:]
    return system + rest[turn_starts[-1] :] if turn_starts else system


# What one model call may send: the server refuses payloads over 2 MB, and the request also holds
# the tools' schemas and the envelope. A byte budget, not a message count: one reply can be 256 KB.
MODEL_INPUT_BYTES = 1_000_000
# The transcript carried across continue-as-new: the start input also holds the inbox (up to 8
# messages of 32 000 characters), the saga and the limits, under the same 2 MB.
CARRIED_BYTES = 600_000
# Continue-as-new well before the server's limits (it terminates a run at 50 MB or 51 200 events,
# and suggests continuing at 4 MB / 4 096 events by default, which the workflow also honours).
HISTORY_BYTES_BUDGET = 10_000_000
HISTORY_EVENTS_BUDGET = 10_000
MIN_KEPT_CHARS = 500


def _size(message: ChatMessage) -> int:
    return len(message.model_dump_json().encode("utf-8", "replace"))


def _shrunk(message: ChatMessage, chars: int) -> ChatMessage:
    """`message` with its content and each call's arguments cut to `chars`, with a marker."""
    content = message.content
    if content is not None and len(content) > chars:
        content = f"{content[:chars]}…[cut for the model call: {len(content) - chars} characters]"
    calls = [
        c.model_copy(update={"arguments": c.arguments[:chars]}) if len(c.arguments) > chars else c
        for c in message.tool_calls
    ]
    return message.model_copy(update={"content": content, "tool_calls": calls})


def fit_for_model(messages: list[ChatMessage], budget: int = MODEL_INPUT_BYTES) -> list[ChatMessage]:
    """The messages a model call (or the next run) may carry within `budget` bytes.

    The system prompt, then the most recent whole turns that fit (cut at user messages, like
    `trim_for_carry`); when even the latest turn does not fit, its messages are cut, each to an
    equal share, with a marker the model reads. Pure: the workflow calls it before every model call.
    """
    system = [m for m in messages[:1] if m.role == "system"]
    rest = messages[len(system) :]
    room = budget - sum(_size(m) for m in system)
    sizes = [_size(m) for m in rest]
    for start in (i for i, m in enumerate(rest) if m.role == "user"):
        if sum(sizes[start:]) <= room:
            return system + rest[start:]
    starts = [i for i, m in enumerate(rest) if m.role == "user"]
    latest = rest[starts[-1] :] if starts else rest
    if sum(_size(m) for m in latest) <= room:
        return system + latest
    share = max(MIN_KEPT_CHARS, room // (4 * max(1, len(latest))))  # 4: worst-case UTF-8 bytes per char
    return system + [_shrunk(m, share) for m in latest]


class HistoryInfo(Protocol):
    def get_current_history_length(self) -> int: ...
    def get_current_history_size(self) -> int: ...
    def is_continue_as_new_suggested(self) -> bool: ...


def history_full(info: HistoryInfo) -> bool:
    """Whether the run's history is past the budget at which it continues as new."""
    return (
        info.get_current_history_size() > HISTORY_BYTES_BUDGET
        or info.get_current_history_length() > HISTORY_EVENTS_BUDGET
    )


def continue_suggested(info: HistoryInfo) -> bool:
    """Whether the run should continue as new now: the server suggests it, or the budget is past.
    Checked while the conversation waits too (for a message, a reviewer, an answer): a flood of
    signals grows history with no turn to end."""
    return info.is_continue_as_new_suggested() or history_full(info)
