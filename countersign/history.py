"""What a conversation carries into its next run when it continues-as-new.

Rule: keep the system prompt, then the most recent messages that fit `max_messages`, cut only at a
user message, so a turn is carried whole or not at all: no tool result loses the call it answers,
and the model never sees a conversation that starts mid-turn. The latest turn is always kept.
"""

from __future__ import annotations

from countersign.chat import ChatMessage

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
