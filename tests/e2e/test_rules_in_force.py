"""Issue 48 item 7 in signed mode through the real server, worker, Temporal and PostgreSQL: the rules
in force are today's in every conversation, however old. A conversation started while its tenant had
no policy set is refused by a forbid applied later, and asks a quorum applied later of its
approvers; a tool an operator blocks mid-conversation is refused there; the decision records the
version of the set that made it. On main the conversation kept its start's snapshot: no set, so
no policy step, and the tiers it started with."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ApprovalRequest, TenantPolicy, TenantToolTier, ToolExecution
from tests.e2e.test_asked_again import card
from tests.fixtures.approvals import ECHO_RESULT, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import ApplyPolicies
from tests.server.test_front_door import token_for
from tests.server.test_mcp_face import client

STATUS = 'Countersign::Action::"update_lead_status"'
HELLO = {"when": {"user_contains": "hello"}, "reply": {"content": "hi"}}
SEARCH = {
    "when": {"user_contains": "search"},
    "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "jane"}}]},
}
SEARCHED = {"when": {"after_tool": "search_leads"}, "reply": {"content": "searched"}}
pytestmark = pytest.mark.usefixtures("jane_is_new")


async def started(stack: SignedStack, token: str) -> str:
    """A conversation alice starts through the server, once its first turn ("hello") is over:
    its snapshot is taken while acme has no policy set."""
    status, body = await stack.call(
        "POST", "/api/conversations", token, {"agent": "lead-qualifier", "message": "hello"}
    )
    assert status == 201, body
    workflow_id = str(body["workflow_id"])
    await settled(stack, token, workflow_id, turn=1)
    return workflow_id


async def settled(stack: SignedStack, token: str, workflow_id: str, turn: int) -> dict[str, Any]:
    """The conversation's status once turn `turn` has ended or waits for people."""
    for _ in range(400):
        _, status = await stack.call("GET", f"/api/conversations/{workflow_id}", token)
        if status["turn"] >= turn and status["state"] in ("idle", "awaiting_approval"):
            return dict(status)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{workflow_id} did not settle: {status}")


async def say(stack: SignedStack, token: str, workflow_id: str, text: str, turn: int) -> dict[str, Any]:
    status, body = await stack.call(
        "POST", f"/api/conversations/{workflow_id}/messages", token, {"text": text}
    )
    assert status == 202, body
    return await settled(stack, token, workflow_id, turn)


async def last_result(stack: SignedStack, token: str, workflow_id: str) -> dict[str, Any]:
    _, messages = await stack.call("GET", f"/api/conversations/{workflow_id}/transcript", token)
    tool = [m for m in messages if m["role"] == "tool"]
    return dict(json.loads(tool[-1]["content"])) if tool else {}


async def enforced_version(db_engine: AsyncEngine) -> int:
    async with db_engine.connect() as conn:
        version = await conn.scalar(
            select(TenantPolicy.version).where(
                TenantPolicy.tenant_id == "acme", TenantPolicy.mode == "enforced"
            )
        )
    assert version is not None
    return int(version)


@asynccontextmanager
async def search_blocked(db_engine: AsyncEngine) -> AsyncIterator[None]:
    """An operator blocks search_leads for acme (tools/tiers.py's row) while the block runs; the
    row is deleted after it."""
    tier = {"tenant_id": "acme", "agent": "lead-qualifier", "tool": "search_leads", "tier": "blocked"}
    async with db_engine.begin() as conn:
        await conn.execute(insert(TenantToolTier).values(**tier, set_by="carol"))
    try:
        yield
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(
                delete(TenantToolTier).where(
                    TenantToolTier.tenant_id == "acme", TenantToolTier.tool == "search_leads"
                )
            )


async def outcomes(db_engine: AsyncEngine, workflow_id: str) -> list[str]:
    """The outcomes of the conversation's tool calls, in the order they ran."""
    async with db_engine.connect() as conn:
        return list(
            await conn.scalars(
                select(ToolExecution.outcome)
                .where(ToolExecution.workflow_id == workflow_id)
                .order_by(ToolExecution.id)
            )
        )


async def test_a_forbid_applied_after_the_start_refuses_the_call(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO, qualify(), ECHO_RESULT)
    alice = await stack.login("alice")
    workflow_id = await started(stack, alice)
    await policies(f'@id("never-qualify") forbid(principal, action == {STATUS}, resource);')
    status = await say(stack, alice, workflow_id, "qualify jane", turn=2)
    assert status["state"] == "idle" and status["pending_approvals"] == []
    result = await last_result(stack, alice, workflow_id)
    assert result["error"]["code"] == "FORBIDDEN" and "never-qualify" in result["error"]["message"]
    async with db_engine.connect() as conn:
        row = (
            await conn.execute(select(ToolExecution).where(ToolExecution.workflow_id == workflow_id))
        ).one()
        asked = (
            await conn.execute(select(ApprovalRequest).where(ApprovalRequest.workflow_id == workflow_id))
        ).all()
    assert asked == [] and row.outcome == "blocked"
    assert row.policy == {
        "outcome": "forbid",
        "policy": "never-qualify",
        "version": await enforced_version(db_engine),
    }


async def test_a_quorum_applied_after_the_start_asks_its_approvers(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO, qualify(), ECHO_RESULT)
    alice, bob = await stack.login("alice"), await stack.login("bob")
    workflow_id = await started(stack, alice)
    await policies(f'@id("two-for-status") @approvals("2") permit(principal, action == {STATUS}, resource);')
    await say(stack, alice, workflow_id, "qualify jane", turn=2)
    seen = await card(stack, bob, workflow_id)
    assert (seen["approvals_required"], seen["policy"], seen["quorum"]) == (
        2,
        "two-for-status",
        "0 of 2 approved",
    )
    async with db_engine.connect() as conn:
        policy = await conn.scalar(
            select(ApprovalRequest.policy).where(ApprovalRequest.workflow_id == workflow_id)
        )
    assert policy is not None and policy["version"] == await enforced_version(db_engine)


async def test_a_tool_blocked_mid_conversation_is_refused_there(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO, SEARCH, SEARCHED)
    alice = await stack.login("alice")
    workflow_id = await started(stack, alice)
    await say(stack, alice, workflow_id, "search jane", turn=2)
    assert (await last_result(stack, alice, workflow_id))["ok"]  # allowed when it started
    async with search_blocked(db_engine):
        await say(stack, alice, workflow_id, "search jane again", turn=3)
        result = await last_result(stack, alice, workflow_id)
        assert result["error"]["code"] == "BLOCKED", result
        assert await outcomes(db_engine, workflow_id) == ["executed", "blocked"]


async def test_a_tool_blocked_mid_conversation_is_refused_in_an_mcp_clients_conversation(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """The long-lived conversation of a client of Countersign's MCP face (one per token's user and
    agent): a read that ran is refused at its next call once an operator blocks it, in the same
    conversation, and audited as blocked."""
    stack = signed_agent
    async with token_for(db_engine, "acme", "mcp-rules", "alice") as secret:
        async with client(stack, secret) as mcp:
            first = await mcp.call_tool("search_leads", {"query": "jane"})
            assert not first.is_error, first
            workflow_id = (first.meta or {})["countersign"]["workflow_id"]
            async with search_blocked(db_engine):
                again = await mcp.call_tool("search_leads", {"query": "jane"})
                assert again.is_error and "blocked" in again.content[0].text, again  # type: ignore[union-attr]
                assert (again.meta or {})["countersign"]["workflow_id"] == workflow_id
        stack.agent.track(workflow_id)
    assert (await outcomes(db_engine, workflow_id))[-2:] == ["executed", "blocked"]
