"""What the chat page (`/chat`) reads besides the conversation API: the agents one may talk to,
and one's own conversations (keyed ones with their key), newest first, each with its first message
(the page names a conversation by it)."""

from __future__ import annotations

from aiohttp import web
from sqlalchemy import select

from countersign.db.schema import AgentProfile, Conversation, ConversationMessage
from countersign.server.door import CALLER, REQUESTERS

LISTED = 50


async def agents(request: web.Request) -> web.Response:
    """Every agent: agents are shared by tenants, and any user of a tenant may start a conversation
    with one (what its tools may do is the tenant's tiers' and the roles' business)."""
    async with request.app[REQUESTERS].sessions() as session:
        rows = (
            await session.execute(
                select(AgentProfile.name, AgentProfile.description).order_by(AgentProfile.name)
            )
        ).all()
    return web.json_response([{"name": name, "description": description} for name, description in rows])


async def conversations(request: web.Request) -> web.Response:
    """The caller's conversations (a token's: those of the users it acts for), newest first."""
    caller = request[CALLER]
    users = (
        [caller.person] if caller.person is not None else list(caller.token.act_as if caller.token else [])
    )
    first_message = (
        select(ConversationMessage.content)
        .where(
            ConversationMessage.workflow_id == Conversation.workflow_id,
            ConversationMessage.conversation_id == Conversation.conversation_id,
            ConversationMessage.role == "user",
        )
        .order_by(ConversationMessage.seq)
        .limit(1)
        .correlate(Conversation)
        .scalar_subquery()
    )  # None until the conversation's first run has stored it
    query = (
        select(Conversation, first_message)
        .where(Conversation.tenant_id == caller.tenant_id, Conversation.user_id.in_(users))
        .order_by(Conversation.created_at.desc())
        .limit(LISTED)
    )
    async with request.app[REQUESTERS].sessions() as session:
        rows = (await session.execute(query)).all()
    return web.json_response(
        [
            {"workflow_id": r.workflow_id, "agent": r.agent, "key": r.key, "user_id": r.user_id,
             "created_at": r.created_at.isoformat(), "first_message": first}
            for r, first in rows
        ]
    )  # fmt: skip


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/agents", agents)
    app.router.add_get("/api/conversations", conversations)
