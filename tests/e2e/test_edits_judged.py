"""Issue 48 item 5, end to end in signed mode through the real server, worker, Temporal and
PostgreSQL: a reviewer's edit is a new call, judged again by the tenant's current policies. bob's
approval of alice's mail to a partner, edited to readdress it to a competitor that a forbid names, is
refused naming the policy, and nothing is sent; approved as asked, it goes to the partner."""

from __future__ import annotations

import asyncio

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ApprovalDecision, EmailOutbox
from tests.e2e.test_asked_again import card
from tests.fixtures.approvals import PARTNER
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import ApplyPolicies

SEND = 'Countersign::Action::"send_email"'
NO_COMPETITORS = (
    f'@id("no-competitors") forbid(principal, action == {SEND}, resource) '
    'when { context.args.to like "*@competitor.example" };'
)
MAIL = {"to": PARTNER, "subject": "Our offer", "body": "Dear partner, here is our offer."}
COMPETITOR = "x@competitor.example"


async def sent_to(engine: AsyncEngine, address: str) -> list[int]:
    async with engine.connect() as conn:
        return list(await conn.scalars(select(EmailOutbox.id).where(EmailOutbox.to_address == address)))


async def test_an_edit_to_a_recipient_a_policy_forbids_is_refused_naming_it_and_nothing_is_sent(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    stack = signed_agent
    await policies(NO_COMPETITORS)
    stack.agent.script(
        {
            "when": {"user_contains": "mail"},
            "reply": {"tool_calls": [{"name": "send_email", "arguments": MAIL}]},
        },
        {"when": {"after_tool": "send_email"}, "reply": {"content": "done"}},
    )
    handle = await stack.agent.start("mail the partner our offer", single_turn=True)
    bob = await stack.login("bob")
    item = await card(stack, bob, handle.id)  # to the partner: no policy forbids it, a reviewer decides
    path = f"/api/approvals/{handle.id}/{item['call_id']}"

    status, body = await stack.call(
        "POST", path, bob, {"decision": "approve", "args": {**MAIL, "to": COMPETITOR}}
    )
    assert status == 403, body  # on main: 200, and the mail went to the competitor
    assert "no-competitors" in body["error"] and "as edited" in body["error"], body
    async with db_engine.connect() as conn:
        (refused,) = (
            await conn.execute(
                select(ApprovalDecision.accepted, ApprovalDecision.reason, ApprovalDecision.effect).where(
                    ApprovalDecision.workflow_id == handle.id
                )
            )
        ).all()
    assert not refused.accepted and "no-competitors" in refused.reason
    assert COMPETITOR in str(refused.effect)  # the edit's effect, resolved and recorded with the refusal
    assert await sent_to(db_engine, COMPETITOR) == []

    still = await card(stack, bob, handle.id)  # the call still waits for a decision
    assert still["call_id"] == item["call_id"]
    status, body = await stack.call("POST", path, bob, {"decision": "approve"})
    assert status == 200 and body["state"] == "approved", body
    await asyncio.wait_for(handle.result(), 30)
    assert await sent_to(db_engine, COMPETITOR) == []
    assert len(await sent_to(db_engine, PARTNER)) >= 1
