"""Issue 35 end to end, in signed mode through the real server, worker, Temporal and PostgreSQL:
a forbidden call is refused without anyone being asked; a call a policy gives two approvers runs
only after two distinct proven approvals, never after one, and the requester never counts; a
shadow set changes nothing and the admins' policies API reports what it would have changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ApprovalDecision, ApprovalRequest, ToolExecution
from tests.e2e.test_asked_again import card
from tests.fixtures.approvals import ECHO_RESULT, lead_status, qualify
from tests.fixtures.cli import run_starter
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import ApplyPolicies

STATUS = 'Countersign::Action::"update_lead_status"'
pytestmark = pytest.mark.usefixtures("jane_is_new")


async def test_a_forbidden_call_is_refused_unasked(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    stack = signed_agent
    await policies(f'@id("never-qualify") forbid(principal, action == {STATUS}, resource);')
    stack.agent.script(qualify(), ECHO_RESULT)
    handle = await stack.agent.start("qualify jane", single_turn=True)
    await handle.result()
    result = json.loads(
        [m for m in await stack.agent.transcript(handle) if m.role == "tool"][-1].content or ""
    )
    assert result["error"]["code"] == "FORBIDDEN" and "never-qualify" in result["error"]["message"]
    async with db_engine.connect() as conn:
        asked = (
            await conn.execute(select(ApprovalRequest).where(ApprovalRequest.workflow_id == handle.id))
        ).all()
        outcome = await conn.scalar(
            select(ToolExecution.outcome).where(ToolExecution.workflow_id == handle.id)
        )
    assert asked == [] and outcome == "blocked"
    assert await lead_status(db_engine, "acme") == "new"


async def test_two_proven_approvals_and_never_one(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    stack = signed_agent
    await policies(f'@id("two-for-status") @approvals("2") permit(principal, action == {STATUS}, resource);')
    stack.agent.script(qualify(), ECHO_RESULT)
    handle = await stack.agent.start("qualify jane", single_turn=True)  # by alice
    alice, bob, carol = await stack.login("alice"), await stack.login("bob"), await stack.login("carol")
    seen = await card(stack, bob, handle.id)
    assert (seen["approvals_required"], seen["policy"], seen["quorum"]) == (
        2,
        "two-for-status",
        "0 of 2 approved",
    )
    path = f"/api/approvals/{handle.id}/{seen['call_id']}"

    status, body = await stack.call("POST", path, bob, {"decision": "approve"})
    assert status == 200 and body["state"] == "pending", body
    again = await card(stack, carol, handle.id)
    assert again["quorum"] == "1 of 2 approved (bob)"
    assert await lead_status(db_engine, "acme") == "new", "one approval of two runs nothing"

    status, body = await stack.call("POST", path, bob, {"decision": "approve"})
    assert status == 409 and "bob already approved" in body["error"], body
    assert "DecisionRefused" not in body["error"], "a person reads the sentence, never the failure's class"
    status, body = await stack.call("POST", path, alice, {"decision": "approve"})
    assert status == 403, body  # the requester never counts
    status, body = await stack.call("POST", path, carol, {"decision": "approve"})
    assert status == 200 and body["state"] == "approved" and body["decided_by"] == "bob, carol", body
    await handle.result()
    assert await lead_status(db_engine, "acme") == "qualified"
    async with db_engine.connect() as conn:
        rows = (
            await conn.execute(
                select(ApprovalDecision.approver, ApprovalDecision.accepted, ApprovalDecision.proven)
                .where(ApprovalDecision.workflow_id == handle.id)
                .order_by(ApprovalDecision.id)
            )
        ).all()
    accepted = [(approver, proven) for approver, ok, proven in rows if ok]
    assert accepted == [("bob", True), ("carol", True)]


async def test_a_shadow_set_changes_nothing_and_reports_the_difference(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    stack = signed_agent
    await policies(f'@id("would-forbid") forbid(principal, action == {STATUS}, resource);', shadow=True)
    stack.agent.script(qualify(), ECHO_RESULT)
    handle = await stack.agent.start("qualify jane", single_turn=True)
    bob, carol = await stack.login("bob"), await stack.login("carol")
    seen = await card(stack, bob, handle.id)  # asked as before: the tiers decide
    status, body = await stack.call(
        "POST", f"/api/approvals/{handle.id}/{seen['call_id']}", bob, {"decision": "approve"}
    )
    assert status == 200 and body["state"] == "approved", body
    await handle.result()
    assert await lead_status(db_engine, "acme") == "qualified"
    status, shown = await stack.call("GET", "/api/policies", carol)
    assert status == 200 and shown["enforced"] is None, shown
    (difference,) = [d for d in shown["differences"] if d["workflowId"] == handle.id]
    assert (difference["enforced"], difference["shadow"]) == (
        {"outcome": "no_match"},
        {"outcome": "forbid", "policy": "would-forbid"},
    )
    status, refused = await stack.call("GET", "/api/policies", bob)
    assert status == 403 and "only an admin of acme" in refused["error"], refused


async def test_policy_apply_without_as_goes_through_the_server_as_the_signed_in_admin(
    signed_agent: SignedStack, tmp_path: Path, policies: ApplyPolicies
) -> None:
    """Signed mode: the CLI's `login` session, and the server decides whether its person is an admin."""
    stack = signed_agent
    file = tmp_path / "set.cedar"
    file.write_text(f'@id("never-qualify") forbid(principal, action == {STATUS}, resource);')
    for user, said in (
        ("bob", "inbox: refused (recorded): only an admin of acme may change its policies (bob is not)"),
        ("carol", "acme: enforced policy set version 1 applied by carol"),
    ):
        session = tmp_path / f"{user}-session.json"
        token = await stack.login(user)
        session.write_text(
            json.dumps({"inbox_url": stack.url, "tenant_id": "acme", "user_id": user, "token": token})
        )
        env = {"COUNTERSIGN_SESSION_FILE": str(session)}
        done = await run_starter("policy", "apply", str(file), "--tenant", "acme", env=env)
        assert said in done.stdout + done.stderr, (done.stdout, done.stderr)
    status, shown = await stack.call("GET", "/api/policies", await stack.login("carol"))
    assert status == 200 and shown["enforced"]["appliedBy"] == "carol", shown
    latest = [(c["changedBy"], c["via"], c["accepted"]) for c in shown["changes"][:2]]
    assert latest == [("carol", "inbox", True), ("bob", "inbox", False)]
