"""The conversation's address: whose tenant it is, its workflow id, and which instance under that id.

A workflow id can be started again after its conversation ended (a reused key, or anyone with
Temporal access): the new start is another conversation, another *instance*, named by its first
run's id (`conversations`, countersign.db.instances). Every stored row, every read and every
idempotency key names the instance, so that the new conversation inherits nothing of the old.

The payloads that address a conversation inherit this model: their JSON stays flat (the three keys
beside their own), and a payload recorded before instances existed still decodes (`""`).
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel


class ConversationRef(BaseModel):
    tenant_id: str
    workflow_id: str
    # The conversation instance (countersign.db.schema.Conversation): its first run's id; "" in
    # payloads recorded before instances existed.
    conversation_id: str = ""

    @classmethod
    def at(cls, ref: ConversationRef, **fields: Any) -> Self:
        """This payload for the conversation `ref` addresses (only its address is taken from it)."""
        return cls(
            tenant_id=ref.tenant_id,
            workflow_id=ref.workflow_id,
            conversation_id=ref.conversation_id,
            **fields,
        )
