"""Issue 34 end to end, in signed mode through the real server, worker and Temporal: what bob
approves is what runs.

A draft changed after bob saw it is never sent unseen: a person's edit is refused while he decides,
and a change that reaches the row anyway voids his approval when the call runs; the call is asked
again with the new content, and only his second approval, of what he then saw, sends it. The same
for a lead someone changes between the decision and the execution.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.saga import Saga
from countersign.db.engine import session_factory
from countersign.db.schema import ApprovalDecision, EmailDraft, EmailOutbox, Lead
from tests.fixtures.approvals import ATTACKER, ECHO_RESULT, PARTNER, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE


async def card(
    stack: SignedStack, token: str, workflow_id: str, voided_by: str | None = None
) -> dict[str, Any]:
    """The conversation's card in bob's inbox, once listed (asked again: naming `voided_by`)."""
    for _ in range(200):
        _, items = await stack.call("GET", "/api/approvals", token)
        mine: list[dict[str, Any]] = [
            i for i in items if i["workflow_id"] == workflow_id and i.get("voided_by") == voided_by
        ]
        if mine:
            return mine[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no card for {workflow_id} (voided_by={voided_by})")


async def approve(stack: SignedStack, token: str, item: dict[str, Any]) -> None:
    path = f"/api/approvals/{item['workflow_id']}/{item['call_id']}"
    status, body = await stack.call("POST", path, token, {"decision": "approve"})
    assert status == 200, body


async def decisions(engine: AsyncEngine, workflow_id: str) -> list[tuple[str, bool, bool]]:
    """(approver, accepted, voided) of the conversation's decisions, in order."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(ApprovalDecision.approver, ApprovalDecision.accepted, ApprovalDecision.voided_at)
            .where(ApprovalDecision.workflow_id == workflow_id)
            .order_by(ApprovalDecision.id)
        )
        return [(approver, accepted, voided is not None) for approver, accepted, voided in rows]


async def test_a_draft_changed_after_bob_saw_it_is_never_sent_unseen(
    signed_agent: SignedStack, db_engine: AsyncEngine, partner_draft: int
) -> None:
    stack = signed_agent
    send = {"name": "send_draft", "arguments": {"draft": partner_draft}}
    stack.agent.script(
        {"when": {"user_contains": "send"}, "reply": {"tool_calls": [send]}},
        {"when": {"after_tool": "send_draft"}, "reply": {"content": "done"}},
    )
    handle = await stack.agent.start("send the partner draft", single_turn=True)
    alice, bob = await stack.login("alice"), await stack.login("bob")
    seen = await card(stack, bob, handle.id)
    assert PARTNER in seen["effect"]["summary"], seen["effect"]

    # alice (the requester) tries to redirect it while bob reads: refused, nothing changes
    path = f"/api/drafts/{partner_draft}"
    status, body = await stack.call("PATCH", path, alice, {"to": ATTACKER, "body": "Pay into this account."})
    assert status == 409 and "waiting for a reviewer's decision" in body["error"], body
    # a change that reaches the row anyway (the operator's SQL, a restore): bob's approval is voided
    async with session_factory(db_engine)() as session, session.begin():
        await session.execute(
            update(EmailDraft)
            .where(EmailDraft.id == partner_draft)
            .values(to_address=ATTACKER, body="Pay here.")
        )
    await approve(stack, bob, seen)
    again = await card(stack, bob, handle.id, voided_by="bob")
    assert ATTACKER in again["effect"]["summary"] and again["call_id"] == seen["call_id"]
    assert again["voided_effect"] == seen["effect"]  # what changed since: then, and now
    assert again["nonce"] != seen["nonce"]  # a new request: bob's first proof cannot decide it
    async with session_factory(db_engine)() as session:
        assert (await session.get(EmailDraft, partner_draft)).sent_outbox_id is None  # type: ignore[union-attr]
    assert await decisions(db_engine, handle.id) == [("bob", True, True)]

    await approve(stack, bob, again)  # now he has seen where it goes
    await handle.result()
    async with session_factory(db_engine)() as session:
        draft = await session.get(EmailDraft, partner_draft)
        assert draft is not None and draft.sent_outbox_id is not None
        outbox = await session.get(EmailOutbox, draft.sent_outbox_id)
        assert outbox is not None and (outbox.to_address, outbox.body) == (ATTACKER, "Pay here.")
    assert await decisions(db_engine, handle.id) == [("bob", True, True), ("bob", True, False)]


async def test_a_lead_changed_between_decision_and_execution_is_asked_again(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    handle = await stack.agent.start("qualify jane", single_turn=True)
    bob = await stack.login("bob")
    seen = await card(stack, bob, handle.id)
    assert "new → qualified" in seen["effect"]["summary"], seen["effect"]
    async with session_factory(db_engine)() as session, session.begin():  # someone else, meanwhile
        await session.execute(
            update(Lead).where(Lead.tenant_id == "acme", Lead.email == JANE).values(status="disqualified")
        )
    await approve(stack, bob, seen)
    again = await card(stack, bob, handle.id, voided_by="bob")
    assert "disqualified → qualified" in again["effect"]["summary"], again["effect"]
    async with db_engine.connect() as conn:
        status = await conn.scalar(select(Lead.status).where(Lead.tenant_id == "acme", Lead.email == JANE))
    assert status == "disqualified"  # nothing ran on what bob did not see
    await approve(stack, bob, again)
    await handle.result()
    async with db_engine.connect() as conn:
        status = await conn.scalar(select(Lead.status).where(Lead.tenant_id == "acme", Lead.email == JANE))
    assert status == "qualified"
    assert await decisions(db_engine, handle.id) == [("bob", True, True), ("bob", True, False)]
    saga = await handle.query("saga", result_type=Saga)
    assert [e.call_id for e in saga.entries] == [seen["call_id"]]  # the voided run is not a write
