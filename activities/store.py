"""The conversation store's activities (the store itself is `countersign.db.messages`), and the
summarizing call's input: messages that fall out of the window fold into a running summary."""

from __future__ import annotations

from temporalio import activity

from countersign.core.activity_refs import APPEND_MESSAGES, LOAD_TURN_REPLY
from countersign.core.contract import TurnResult
from countersign.core.envelopes import SUMMARY_NAME, AppendMessages, RepliedTurn
from countersign.core.messages import ChatMessage, Usage
from countersign.db.messages import ConversationStore

SUMMARY_PROMPT = (
    "Summarize the conversation below for the assistant that continues it: the user's goals, facts "
    "found (with record names and ids), decisions made and what is still open. Be brief and factual; "
    "it replaces these messages in the assistant's context."
)


class StoreActivities:
    def __init__(self, store: ConversationStore) -> None:
        self._store = store

    @activity.defn(name=APPEND_MESSAGES.name)
    async def append_messages(self, batch: AppendMessages) -> list[int]:
        return await self._store.append(batch)

    @activity.defn(name=LOAD_TURN_REPLY.name)
    async def load_turn_reply(self, replied: RepliedTurn) -> TurnResult:
        """`wait_reply` for a message an earlier run answered: the reply from the store (none
        when the store does not hold the message)."""
        found = await self._store.turn_reply(
            replied.workflow_id, replied.conversation_id, replied.message_id, replied.turn
        )
        return found or TurnResult(turn=replied.turn, reply=None, stop="completed", usage=Usage())


def summary_message(text: str) -> ChatMessage:
    return ChatMessage(
        role="system", name=SUMMARY_NAME, content=f"Summary of the earlier conversation: {text}"
    )


def summary_input(previous: list[ChatMessage], folded: list[ChatMessage]) -> list[ChatMessage]:
    """The summarizing model call's messages: the instruction, then what to fold, as plain text."""
    lines = [f"{m.role}{f' ({m.name})' if m.name else ''}: {m.content or ''}" for m in previous + folded]
    lines += [f"assistant called {c.name}({c.arguments})" for m in folded for c in m.tool_calls]
    return [
        ChatMessage(role="system", content=SUMMARY_PROMPT),
        ChatMessage(role="user", content="\n".join(lines)),
    ]
