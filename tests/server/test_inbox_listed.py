"""A decision from an inbox whose events stream is open binds its proof to the call as the stream
listed it (no status query through the worker); the workflow still decides whether it is pending:
a second decision bound to the listed (now stale) call is refused with 409 and recorded.
Real parts: the dev server, PostgreSQL, the scripted model over HTTP, the inbox over HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import session_factory
from countersign.db.schema import ApprovalDecision, ToolExecution
from countersign.identity.proofs import load_private_key
from countersign.server import inbox as inbox_service
from countersign.server.auth import Reviewer
from countersign.server.http import HttpRefusal
from countersign.server.inbox import DecisionRequest, Inbox, PendingItem
from tests.fixtures.approvals import ECHO_RESULT, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE

pytestmark = pytest.mark.devserver


async def listed(response: aiohttp.ClientResponse, workflow_id: str) -> list[dict[str, Any]]:
    """The first `approvals` event of an open stream that lists a call of `workflow_id`."""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            items: list[dict[str, Any]] = json.loads(line[6:])
            if any(i["workflow_id"] == workflow_id for i in items):
                return items
    raise AssertionError("the stream ended")


async def test_a_listed_call_is_decided_once_with_the_listed_arguments(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    bob = await stack.login("bob")
    headers = {"Authorization": f"Bearer {bob}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(stack.url + "/api/events", headers=headers) as stream,
    ):
        handle = await stack.agent.start("qualify jane", single_turn=True)
        items = await asyncio.wait_for(listed(stream, handle.id), 30)
        assert json.loads(next(i["args"] for i in items if i["workflow_id"] == handle.id))["lead"] == JANE
        url = f"{stack.url}/api/approvals/{handle.id}/c1"
        edited = {"lead": JANE, "new_status": "contacted", "reason": "listed"}
        async with http.post(url, json={"decision": "approve", "args": edited}, headers=headers) as first:
            assert first.status == 200, await first.text()
    # the stream's item, now stale: the inbox binds a proof to it without asking the conversation,
    # and the workflow refuses (and records) the second decision
    stale = PendingItem.model_validate(next(i for i in items if i["workflow_id"] == handle.id))
    reviewer = Reviewer(tenant_id="acme", user_id="bob")
    inbox = Inbox(stack.agent.client, session_factory(db_engine), load_private_key(stack.keys.private))
    with pytest.raises(HttpRefusal) as again:
        await inbox.decide(
            Reviewer(tenant_id="acme", user_id="bob"),
            handle.id,
            "c1",
            DecisionRequest(decision="approve"),
            stale,
        )
    assert again.value.status == 409 and "already approved by bob" in str(again.value)
    await handle.result()
    with pytest.raises(HttpRefusal) as ended:  # the conversation has ended since it was listed
        await inbox.decide(reviewer, handle.id, "c1", DecisionRequest(decision="approve"), stale)
    assert ended.value.status == 409 and "no longer pending" in str(ended.value)
    async with db_engine.connect() as conn:
        decisions = list(
            await conn.execute(
                select(ApprovalDecision)
                .where(ApprovalDecision.workflow_id == handle.id)
                .order_by(ApprovalDecision.id)
            )
        )
        executions = list(
            await conn.execute(select(ToolExecution).where(ToolExecution.workflow_id == handle.id))
        )
    assert [(d.accepted, d.proven) for d in decisions] == [(True, True), (False, False)]
    assert "already approved" in (decisions[1].reason or "")
    assert [(e.outcome, e.edited_args) for e in executions] == [("executed", edited)]


async def test_a_conversation_terminated_while_it_waits_is_no_longer_listed(
    signed_dev_agent: SignedStack, jane_is_new: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No workflow code runs when an operator terminates a conversation, so its request stays
    `pending` in `approval_requests`: the inbox asks Temporal (not a worker) which conversations
    still run, and lists only their requests."""
    monkeypatch.setattr(inbox_service, "LIVE_FOR_S", 0.2)
    stack = signed_dev_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    bob = await stack.login("bob")
    handle = await stack.agent.start("qualify jane")

    async def listed_ids() -> set[str]:
        code, items = await stack.call("GET", "/api/approvals", bob)
        assert code == 200, items
        return {i["workflow_id"] for i in items}

    for _ in range(100):
        if handle.id in await listed_ids():
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("the request was never listed")
    await handle.terminate(reason="an operator stopped it")
    for _ in range(50):
        if handle.id not in await listed_ids():
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("the terminated conversation's request is still listed")
