"""Issue 35, grants, end to end in signed mode through the real server, worker, Temporal and
PostgreSQL: bob's approval with a grant lets later identical calls of alice's run unasked, as many
as it allows and no other; a revoked grant covers nothing; a grant nobody's proof names counts for
nothing; bad terms record nothing.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowUpdateFailedError

from countersign.core.approvals import Decision, PendingCall
from countersign.core.grants import GrantTerms
from countersign.db.engine import session_factory
from countersign.db.schema import (
    ApprovalDecision,
    ApprovalRequest,
    ConversationEvent,
    Grant,
    GrantUse,
    ToolExecution,
)
from countersign.identity.proofs import Binding, mint_proof
from tests.e2e.test_asked_again import card, decisions
from tests.fixtures.approvals import ECHO_RESULT
from tests.fixtures.grants import grant_chained
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE, reset_jane


def update(new_status: str, reason: str, when: str) -> dict[str, Any]:
    args = {"lead": JANE, "new_status": new_status, "reason": reason}
    return {
        "when": {"user_contains": when},
        "reply": {"tool_calls": [{"name": "update_lead_status", "arguments": args}]},
    }


# Each message names the call the scripted model makes: the same arguments, the same but for the
# free `reason`, other arguments.
SCRIPT = (
    update("contacted", "budget confirmed", "contacted"),
    update("qualified", "asked again later", "again"),
    update("qualified", "budget confirmed", "qualify"),
    ECHO_RESULT,
)


async def decide(
    stack: SignedStack, token: str, item: dict[str, Any], grant: dict[str, int] | None = None
) -> tuple[int, Any]:
    body: dict[str, Any] = {"decision": "approve", **({"grant": grant} if grant else {})}
    return await stack.call("POST", f"/api/approvals/{item['workflow_id']}/{item['call_id']}", token, body)


async def row_of(engine: AsyncEngine, workflow_id: str) -> ToolExecution:
    async with session_factory(engine)() as session:
        row: ToolExecution = (
            await session.scalars(select(ToolExecution).where(ToolExecution.workflow_id == workflow_id))
        ).one()
        return row


async def asked(stack: SignedStack, token: str, message: str) -> dict[str, Any]:
    """Start alice's conversation with `message`; its card in bob's inbox (it was asked)."""
    handle = await stack.agent.start(message, single_turn=True)
    return await card(stack, token, handle.id)


async def bob_is_asked(stack: SignedStack) -> tuple[str, dict[str, Any]]:
    """Bob's session, and the card of alice's "qualify jane" in his inbox."""
    stack.agent.script(*SCRIPT)
    bob = await stack.login("bob")
    return bob, await asked(stack, bob, "qualify jane")


async def ran_and_jane_is_new_again(stack: SignedStack, engine: AsyncEngine, workflow_id: str) -> None:
    """The approved call of `workflow_id` ran (Jane qualified), and someone set her back to new: a
    later "qualify jane" has the approved content again (new → qualified), which a grant binds."""
    await asyncio.wait_for(stack.agent.client.get_workflow_handle(workflow_id).result(), 30)
    await reset_jane(engine)


async def ran_unasked(stack: SignedStack, engine: AsyncEngine, message: str) -> ToolExecution:
    """Start alice's conversation with `message`; its call ran without anyone deciding it."""
    handle = await stack.agent.start(message, single_turn=True)
    await asyncio.wait_for(handle.result(), 30)
    assert await decisions(engine, handle.id) == []
    return await row_of(engine, handle.id)


async def test_a_one_use_grant_covers_exactly_one_later_identical_call(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None, no_grants_left: None
) -> None:
    stack = signed_agent
    bob, first = await bob_is_asked(stack)
    status, body = await decide(stack, bob, first, {"minutes": 60, "uses": 1})
    assert status == 200 and body["state"] == "approved", body
    async with session_factory(db_engine)() as session:
        (grant,) = await session.scalars(select(Grant).where(Grant.workflow_id == first["workflow_id"]))
        decision = await session.get(ApprovalDecision, grant.decision_id)
    assert decision is not None and decision.proven and decision.call_id == first["call_id"]
    assert (grant.tool, grant.requester, grant.agent, grant.approver) == (
        "update_lead_status", "alice", "lead-qualifier", "bob",
    )  # fmt: skip
    assert (grant.uses, grant.uses_left, grant.minutes) == (1, 1, 60)

    # other arguments: asked as usual, the grant untouched
    other = await asked(stack, bob, "mark jane contacted")
    assert other["tool"] == "update_lead_status" and '"contacted"' in other["args"]

    # the same arguments but for the free `reason`, the same change: runs unasked, by bob's grant
    await ran_and_jane_is_new_again(stack, db_engine, first["workflow_id"])
    row = await ran_unasked(stack, db_engine, "qualify jane again")
    assert (row.outcome, row.approved_by, row.grant_id) == ("executed", "bob", grant.id)
    assert row.args["reason"] == "asked again later"
    async with session_factory(db_engine)() as session:
        (use,) = await session.scalars(select(GrantUse).where(GrantUse.grant_id == grant.id))
        spent = await session.get(Grant, grant.id, populate_existing=True)
        request = await session.get(ApprovalRequest, (row.conversation_id, row.call_id))
        assert (use.decision_id, use.approver, use.workflow_id) == (decision.id, "bob", row.workflow_id)
        assert spent is not None and spent.uses_left == 0
        assert request is not None and (request.state, request.decided_by) == ("approved", "bob")
        (told,) = await session.scalars(
            select(ConversationEvent.data).where(
                ConversationEvent.workflow_id == row.workflow_id, ConversationEvent.kind == "approval"
            )
        )  # what the chat page shows of it
        assert told == {
            "call_id": row.call_id, "tool": "update_lead_status", "state": "approved", "decided_by": "bob",
            "grant_id": grant.id,
        }  # fmt: skip
    await grant_chained(db_engine, grant.id)  # every use and change chained

    # its one use is spent: the next identical call is asked
    await ran_and_jane_is_new_again(stack, db_engine, row.workflow_id)
    again = await asked(stack, bob, "qualify jane")
    assert again["workflow_id"] != first["workflow_id"]


async def test_a_revoked_grant_covers_nothing(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None, no_grants_left: None
) -> None:
    stack = signed_agent
    bob, first = await bob_is_asked(stack)
    alice = await stack.login("alice")
    status, body = await decide(stack, bob, first, {"minutes": 600, "uses": 5})
    assert status == 200, body

    status, listed = await stack.call("GET", "/api/grants", alice)  # hers: her calls run under it
    assert status == 200, listed
    (grant,) = [g for g in listed if g["workflow_id"] == first["workflow_id"]]
    assert grant["state"] == "live" and grant["uses_left"] == 5
    status, refused = await stack.call("POST", f"/api/grants/{grant['id']}/revoke", alice)
    assert status == 403, refused  # the requester may not: its approver or an admin may
    erin = await stack.login("erin", tenant="globex")
    status, _ = await stack.call("POST", f"/api/grants/{grant['id']}/revoke", erin)
    assert status == 404  # another tenant's grant does not exist for her

    status, revoked = await stack.call("POST", f"/api/grants/{grant['id']}/revoke", bob)
    assert status == 200 and revoked["state"] == "revoked" and revoked["revoked_by"] == "bob", revoked
    await ran_and_jane_is_new_again(stack, db_engine, first["workflow_id"])
    await asked(stack, bob, "qualify jane")  # identical, within its time and uses: asked all the same
    async with session_factory(db_engine)() as session:
        assert list(await session.scalars(select(GrantUse).where(GrantUse.grant_id == grant["id"]))) == []
    await grant_chained(db_engine, grant["id"])


async def test_a_grant_no_proof_names_counts_for_nothing(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None, no_grants_left: None
) -> None:
    """A client holding bob's proof for a plain approval cannot add a grant to it."""
    stack = signed_agent
    _, item = await bob_is_asked(stack)
    assert stack.agent.proof_key is not None
    binding = Binding.decision(
        PendingCall.model_validate(item), "approve", item["args"], item["effect_digest"]
    )  # what the server mints for bob's approval without a grant
    forged = Decision(
        call_id=item["call_id"],
        decision="approve",
        approver="bob",
        proof=mint_proof(stack.agent.proof_key, "bob", binding, datetime.now(UTC)),
        grant=GrantTerms(minutes=10080, uses=100),
    )
    handle = stack.agent.client.get_workflow_handle(item["workflow_id"])
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("decide", forged)
    assert "another grant" in str(refused.value.cause)
    async with session_factory(db_engine)() as session:
        assert (
            list(await session.scalars(select(Grant).where(Grant.workflow_id == item["workflow_id"]))) == []
        )


@pytest.mark.parametrize(
    "grant",
    [{"minutes": 0, "uses": 1}, {"minutes": 10081, "uses": 1}, {"minutes": 60, "uses": 101}, {"minutes": 60}],
)
async def test_terms_out_of_bounds_are_refused_and_record_nothing(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None, grant: dict[str, int]
) -> None:
    stack = signed_agent
    bob, item = await bob_is_asked(stack)
    status, body = await decide(stack, bob, item, grant)
    assert status == 400 and "grant" in body["error"], body
    assert await decisions(db_engine, item["workflow_id"]) == []
    assert (await card(stack, bob, item["workflow_id"]))["call_id"] == item["call_id"]  # still waits
