"""The conversation store's activities (the store itself is `countersign.db.messages`)."""

from __future__ import annotations

from temporalio import activity

from countersign.core.activity_refs import APPEND_MESSAGES, LOAD_TURN_REPLY
from countersign.core.contract import TurnResult
from countersign.core.envelopes import AppendMessages, RepliedTurn
from countersign.core.messages import Usage
from countersign.db.messages import ConversationStore


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
