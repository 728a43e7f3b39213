"""People rate replies: a requester says whether an agent's reply helped (the Perin design's success
measure, "user satisfaction, measured through feedback").

A reply is a turn's closing message in the conversation store: the assistant message without tool
calls after the turn's user message (the `turn` event names it by `turn` and `seq`). The turn is
counted in the conversation instance its `conversations` row names now, as the events count it.
Rating a reply again replaces its rating: one row per reply, and every rating, replaced ones
included, is a record of the tenant's chain (countersign/db/chain.py CHAINED), so exported with the
audit. Who may rate is the caller's business (server.ratings: only the conversation's user, or a
token or chat identity acting for them); this module only writes what it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from countersign.core.direct import MARKER_NAME
from countersign.db.chain import chain
from countersign.db.instances import PENDING
from countersign.db.messages import of
from countersign.db.schema import Conversation, ConversationMessage, ReplyRating

Rating = Literal["helpful", "not_helpful"]
RatedVia = Literal["session", "token", "chat"]


class NoReply(LookupError):
    """The turn has no reply to rate (no such turn, or it has not replied yet)."""


@dataclass(frozen=True)
class Reply:
    """A rated reply's place: its turn and its message's seq, and the tools the turn called."""

    turn: int
    seq: int
    tools: list[str]


async def reply_of(session: AsyncSession, workflow_id: str, instance: str, turn: int) -> Reply:
    """The reply that closed turn `turn` (1 = the instance's first user message), or NoReply."""
    mine = of(workflow_id, instance)
    asked = await session.scalar(
        select(ConversationMessage.seq)
        .where(*mine, ConversationMessage.role == "user")
        .order_by(ConversationMessage.seq)
        .offset(max(turn - 1, 0))
        .limit(1)
    )
    if asked is None or turn < 1:
        raise NoReply(f"no turn {turn} in conversation {workflow_id}")
    following = await session.scalar(
        select(func.min(ConversationMessage.seq)).where(
            *mine, ConversationMessage.seq > asked, ConversationMessage.role == "user"
        )
    )
    within = [*mine, ConversationMessage.seq > asked]
    within += [ConversationMessage.seq < following] if following is not None else []
    rows = (
        await session.execute(
            select(
                ConversationMessage.seq,
                ConversationMessage.role,
                ConversationMessage.name,
                ConversationMessage.tool_calls,
            )
            .where(*within, ConversationMessage.role.in_(("assistant", "tool")))
            .order_by(ConversationMessage.seq)
        )
    ).all()
    # the reply: an assistant message that calls no tool (not direct mode's marker: the turn goes on)
    replies = [r.seq for r in rows if r.role == "assistant" and not r.tool_calls and r.name != MARKER_NAME]
    if not replies:
        raise NoReply(f"turn {turn} of conversation {workflow_id} has no reply yet")
    tools = sorted({r.name for r in rows if r.role == "tool" and r.name})
    return Reply(turn=turn, seq=replies[-1], tools=tools)


def rating_view(row: ReplyRating, replaced: bool | None = None) -> dict[str, Any]:
    """A rating as the API answers it."""
    view = {
        "workflow_id": row.workflow_id,
        "turn": row.turn,
        "seq": row.reply_seq,
        "rating": row.rating,
        "comment": row.comment,
        "rated_by": row.user_id,
        "rated_at": row.updated_at.isoformat(),
    }
    return view if replaced is None else view | {"replaced": replaced}


async def rate_reply(
    session: AsyncSession,
    conversation: Conversation,
    turn: int,
    rating: Rating,
    comment: str | None,
    via: RatedVia,
    now: datetime,
) -> tuple[ReplyRating, bool]:
    """Record the conversation's user's rating of turn `turn`'s reply (in the instance its row names
    now), replacing an earlier one, and chain it; the row and whether it replaced one. NoReply
    when the turn has not replied."""
    instance = conversation.conversation_id
    if instance is None or instance == PENDING:
        raise NoReply(f"conversation {conversation.workflow_id} has not started yet")
    reply = await reply_of(session, conversation.workflow_id, instance, turn)
    key = {"workflow_id": conversation.workflow_id, "conversation_id": instance, "turn": turn}
    earlier = await session.scalar(
        select(ReplyRating.id).filter_by(**key).with_for_update()  # replacing: one at a time
    )
    given = {"rating": rating, "comment": comment or None, "rated_via": via, "updated_at": now}
    row = await session.scalar(
        insert(ReplyRating)
        .values(
            **key,
            **given,
            tenant_id=conversation.tenant_id,
            reply_seq=reply.seq,
            agent=conversation.agent,
            user_id=conversation.user_id,
            tools=reply.tools,
            created_at=now,
        )
        .on_conflict_do_update(index_elements=list(key), set_=given)
        .returning(ReplyRating)
    )
    assert row is not None
    await chain(session, row)
    return row, earlier is not None


async def ratings_of(session: AsyncSession, conversation: Conversation) -> Sequence[ReplyRating]:
    """The ratings of the conversation instance its row names now, by turn."""
    return (
        await session.scalars(
            select(ReplyRating)
            .where(
                ReplyRating.workflow_id == conversation.workflow_id,
                ReplyRating.conversation_id == (conversation.conversation_id or PENDING),
            )
            .order_by(ReplyRating.turn)
        )
    ).all()


async def rating_totals(sessions: async_sessionmaker[AsyncSession]) -> dict[tuple[str, str, str], int]:
    """How many replies are rated each way, per tenant and agent (the metrics' totals)."""
    async with sessions() as session:
        rows = await session.execute(
            select(ReplyRating.tenant_id, ReplyRating.agent, ReplyRating.rating, func.count()).group_by(
                ReplyRating.tenant_id, ReplyRating.agent, ReplyRating.rating
            )
        )
        return {(tenant, agent, rating): n for tenant, agent, rating, n in rows}
