"""What the chat page (`/chat`) reads besides the conversation API: the agents one may talk to,
and one's own conversations (keyed ones with their key), newest first, each with its first message
(the page names a conversation by it) and its state now (`state`, from Temporal's visibility)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from aiohttp import web
from sqlalchemy import select
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from countersign.db.messages import first_message
from countersign.db.schema import AgentProfile, Conversation
from countersign.runtime.search_attributes import AGENT_STATUS
from countersign.server.door import CALLER, REQUESTERS

LISTED = 50
# A conversation's state as its list entry says it: the agent's (the AgentStatus search attribute)
# while its run is open, "ended" once it has closed.
STATE_SAID = {
    "running": "working",
    "awaiting_approval": "waiting for a reviewer",
    "awaiting_answer": "waiting for your answer",
    "idle": "open",
    "rolling_back": "undoing",
    "ended": "ended",
}
SAFE_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,200}")  # a workflow id a visibility query may quote as it is
JUST_STARTED = timedelta(minutes=2)  # not yet in Temporal's visibility: starting, not gone


async def states_of(client: Client, listed: list[Conversation]) -> dict[str, str]:
    """Each listed conversation's state now, in one visibility query: its open run's agent state,
    else "ended" (a closed run, or one whose history is gone); "starting" for one started a moment
    ago that visibility does not list yet. {} when Temporal cannot answer (the list still shows).

    The query names the open runs and those started a moment ago, never every closed run: a long
    conversation has one run per continue-as-new, and the list would read them all each time."""
    ids = [c.workflow_id for c in listed if SAFE_ID.fullmatch(c.workflow_id)]
    if not ids:
        return {}
    quoted = ", ".join(f"'{i}'" for i in ids)
    now = datetime.now(UTC)
    since = (now - JUST_STARTED).isoformat()
    query = f"WorkflowId IN ({quoted}) AND (ExecutionStatus = 'Running' OR StartTime > '{since}')"
    open_runs: dict[str, str] = {}
    try:
        async for run in client.list_workflows(query):
            if run.status == WorkflowExecutionStatus.RUNNING:
                open_runs[run.id] = run.typed_search_attributes.get(AGENT_STATUS) or "running"
            else:
                open_runs.setdefault(run.id, "ended")
    except RPCError:
        return {}
    return {
        c.workflow_id: STATE_SAID.get(open_runs[c.workflow_id], open_runs[c.workflow_id])
        if c.workflow_id in open_runs
        else "starting"
        if now - c.created_at < JUST_STARTED
        else "ended"
        for c in listed
    }


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
    query = (
        select(Conversation, first_message())
        .where(Conversation.tenant_id == caller.tenant_id, Conversation.user_id.in_(users))
        .order_by(Conversation.created_at.desc())
        .limit(LISTED)
    )
    requesters = request.app[REQUESTERS]
    async with requesters.sessions() as session:
        rows = (await session.execute(query)).all()
    states = await states_of(requesters.client, [r for r, _ in rows])
    return web.json_response(
        [
            {"workflow_id": r.workflow_id, "agent": r.agent, "key": r.key, "user_id": r.user_id,
             "created_at": r.created_at.isoformat(), "first_message": first,
             "state": states.get(r.workflow_id)}
            for r, first in rows
        ]
    )  # fmt: skip


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/agents", agents)
    app.router.add_get("/api/conversations", conversations)
