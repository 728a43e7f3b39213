"""Issue 48 item 9, end to end in signed mode through the real server, worker, Temporal and
PostgreSQL: standing is read from the database when it matters. An approval inside an unfinished
quorum counts only while its approver is still active and entitled when the quorum completes; a
call whose requester was deactivated while it waits is not offered to reviewers, and a decision on
it is refused with the reason. (A deactivated approver's grant: tests/e2e/test_grant_content.py;
through the workflow's own update: tests/activities/test_access.py; a demoted admin over MCP:
tests/server/test_mcp_face.py.)"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.access import set_active
from countersign.db.engine import session_factory
from tests.e2e.test_asked_again import card
from tests.fixtures.approvals import ECHO_RESULT, lead_status, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import ApplyPolicies

STATUS = 'Countersign::Action::"update_lead_status"'


async def active(engine: AsyncEngine, user: str, now_active: bool) -> None:
    async with session_factory(engine)() as session, session.begin():
        await set_active(session, "acme", user, now_active, datetime.now(UTC))


async def test_a_deactivated_reviewers_approval_does_not_count_when_the_quorum_completes(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies, jane_is_new: None
) -> None:
    stack = signed_agent
    await policies(f'@id("two-for-status") @approvals("2") permit(principal, action == {STATUS}, resource);')
    stack.agent.script(qualify(), ECHO_RESULT)
    handle = await stack.agent.start("qualify jane", single_turn=True)
    bob, carol = await stack.login("bob"), await stack.login("carol")
    seen = await card(stack, bob, handle.id)
    path = f"/api/approvals/{handle.id}/{seen['call_id']}"
    status, body = await stack.call("POST", path, bob, {"decision": "approve"})
    assert status == 200 and body["state"] == "pending", body

    await active(db_engine, "bob", False)
    try:
        status, body = await stack.call("POST", path, carol, {"decision": "approve"})
        assert status == 200, body
        assert body["state"] == "pending", body  # on main: approved by "bob, carol", and it ran
        assert (body["approvals"], body["reasons"]) == (["carol"], {"carol": None}), body  # bob's went
        assert (await card(stack, carol, handle.id))["quorum"] == "1 of 2 approved (carol)"
        assert await lead_status(db_engine, "acme") == "new"
    finally:
        await active(db_engine, "bob", True)

    status, body = await stack.call("POST", path, await stack.login("bob"), {"decision": "approve"})
    assert status == 200 and body["state"] == "approved" and body["decided_by"] == "carol, bob", body
    await asyncio.wait_for(handle.result(), 30)
    assert await lead_status(db_engine, "acme") == "qualified"


async def test_a_call_whose_requester_was_deactivated_is_not_offered_and_cannot_be_approved(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    handle = await stack.agent.start("qualify jane", single_turn=True)  # by alice
    bob = await stack.login("bob")
    seen = await card(stack, bob, handle.id)
    await active(db_engine, "alice", False)
    try:
        _, items = await stack.call("GET", "/api/approvals", bob)
        assert [i for i in items if i["workflow_id"] == handle.id] == []  # on main: still offered
        path = f"/api/approvals/{handle.id}/{seen['call_id']}"
        status, body = await stack.call("POST", path, bob, {"decision": "approve"})
        assert (
            status == 403 and "alice is deactivated in acme: this call can no longer run" in body["error"]
        ), body
        status, body = await stack.call("POST", path, bob, {"decision": "reject", "reason": "alice left"})
        assert status == 200 and body["state"] == "rejected", body
        await asyncio.wait_for(handle.result(), 30)
        assert await lead_status(db_engine, "acme") == "new"
    finally:
        await active(db_engine, "alice", True)
