"""Which conversation instance a workflow id names now: the one place a reader by workflow id asks.

A workflow id names a conversation only while it runs; Temporal starts a closed one's id again, and
the new conversation is another instance (its first run's id, `conversations.conversation_id`) that
must read nothing of the old one. Readers that know only the workflow id (the server's transcript,
status and events, the CLI's transcript of an ended conversation) read the instance the front
door's row names now. A row whose first run has not registered yet names no instance (`PENDING`,
which no stored row carries); a workflow id without a row is a conversation from before instances
(its rows carry "").
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from countersign.db.schema import Conversation

PENDING = "-"  # not a run id: matches no stored row
# `current_instance` for plain SQL whose $1 is the workflow id (the CLI's LISTEN connection)
CURRENT_INSTANCE_SQL = (
    f"coalesce((SELECT coalesce(conversation_id, '{PENDING}') FROM conversations WHERE workflow_id = $1), '')"
)


def current_instance(
    workflow_id: str | ColumnElement[str] | InstrumentedAttribute[str],
) -> ColumnElement[str]:
    """The instance `workflow_id` (a value, or a column of the rows filtered) names now, as an
    expression (a correlated subquery) for statements that filter by it."""
    named = (
        select(func.coalesce(Conversation.conversation_id, PENDING))
        .where(Conversation.workflow_id == workflow_id)
        .scalar_subquery()
    )
    return func.coalesce(named, "")


async def instance_of(session: AsyncSession | AsyncConnection, workflow_id: str) -> str:
    """The instance `workflow_id` names now (see `current_instance`)."""
    found = await session.scalar(select(current_instance(workflow_id)))
    return found or ""
