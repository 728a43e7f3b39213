"""Spending a grant where a call's approval request is recorded (activities/approvals.py,
`record_approval_request`) against the real PostgreSQL: once per call however often the activity
runs, never past its uses (two calls racing for the last one), never for another scope, and every
change chained."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from activities.approvals import ApprovalActivities, grant_scope
from countersign.core.approvals import RecordedApproval
from countersign.core.calls import PolicyDecision
from countersign.core.grants import GrantTerms
from countersign.db.chain import chain
from countersign.db.engine import session_factory
from countersign.db.grants import mint_grant, revoke_grant
from countersign.db.schema import ApprovalDecision, ApprovalRequest, Grant, GrantUse
from tests.fixtures.grants import grant_chained

TOOL = "update_lead_status"
TWO_APPROVERS = PolicyDecision(outcome="permit_approvals", policy="two-for-leads", approvals=2)


def request(
    args: dict[str, Any], *, requester: str = "alice", agent: str = "lead-qualifier"
) -> RecordedApproval:
    now = datetime.now(UTC)
    workflow_id = f"grant-test-{uuid.uuid4().hex[:8]}"
    return RecordedApproval(
        tenant_id="acme",
        workflow_id=workflow_id,
        conversation_id=f"{workflow_id}-run",
        call_id="c1",
        tool=TOOL,
        risk="high",
        nonce=uuid.uuid4().hex,
        agent=agent,
        args=json.dumps(args),
        requested_by=requester,
        requested_at=now,
        expires_at=now + timedelta(hours=1),
    )


@pytest_asyncio.fixture
async def lead_args(db_engine: AsyncEngine) -> AsyncIterator[dict[str, Any]]:
    """Arguments no other test's call has (a lead of its own), and every grant revoked after."""
    yield {"lead": f"grant-{uuid.uuid4().hex[:8]}@example.com", "new_status": "qualified", "reason": "r"}
    async with session_factory(db_engine)() as session, session.begin():
        for grant_id in list(
            await session.scalars(
                select(Grant.id).where(Grant.tenant_id == "acme", Grant.revoked_at.is_(None))
            )
        ):
            await revoke_grant(session, grant_id, "carol", "acme")


async def granted_for(engine: AsyncEngine, args: dict[str, Any], uses: int, minutes: int = 60) -> int:
    """A grant by bob of `args` for alice in lead-qualifier, as an accepted approval mints it."""
    async with session_factory(engine)() as session, session.begin():
        decision = await session.scalar(
            insert(ApprovalDecision)
            .values(
                tenant_id="acme", workflow_id="grant-origin", conversation_id="grant-origin-run",
                call_id="c0", tool=TOOL, approver="bob", decision="approve", accepted=True,
            )
            .returning(ApprovalDecision)
        )  # fmt: skip
        assert decision is not None
        scope = grant_scope("acme", TOOL, "alice", "lead-qualifier", json.dumps(args), mcp=False)
        assert scope is not None
        await mint_grant(session, decision, scope, json.dumps(args), GrantTerms(minutes=minutes, uses=uses))
        grant_id = await session.scalar(select(Grant.id).where(Grant.decision_id == decision.id))
        assert grant_id is not None
        return grant_id


async def uses_of(engine: AsyncEngine, grant_id: int) -> tuple[int, int]:
    """(uses recorded, uses left)."""
    async with session_factory(engine)() as session:
        used = len(list(await session.scalars(select(GrantUse).where(GrantUse.grant_id == grant_id))))
        left = await session.scalar(select(Grant.uses_left).where(Grant.id == grant_id))
        return used, left or 0


async def state_of(engine: AsyncEngine, asked: RecordedApproval) -> str | None:
    async with session_factory(engine)() as session:
        return await session.scalar(
            select(ApprovalRequest.state).where(
                ApprovalRequest.conversation_id == asked.conversation_id,
                ApprovalRequest.call_id == asked.call_id,
            )
        )


async def test_a_retried_activity_spends_one_use(db_engine: AsyncEngine, lead_args: dict[str, Any]) -> None:
    activities = ApprovalActivities(session_factory(db_engine))
    grant_id = await granted_for(db_engine, lead_args, uses=3)
    asked = request({**lead_args, "reason": "another reason"})  # `reason` is free
    first = await activities.record_approval_request(asked)
    again = await activities.record_approval_request(asked)  # a retry, a local activity run again
    assert first is not None and first == again
    assert (first.grant_id, first.approver, first.uses_left) == (grant_id, "bob", 2)
    assert await uses_of(db_engine, grant_id) == (1, 2)
    assert await state_of(db_engine, asked) == "approved"
    await grant_chained(db_engine, grant_id)


async def test_two_calls_racing_for_the_last_use_get_one(
    db_engine: AsyncEngine, lead_args: dict[str, Any]
) -> None:
    activities = ApprovalActivities(session_factory(db_engine))
    grant_id = await granted_for(db_engine, lead_args, uses=1)
    racing = [request(lead_args) for _ in range(4)]
    results = await asyncio.gather(*(activities.record_approval_request(r) for r in racing))
    assert sum(r is not None for r in results) == 1
    assert await uses_of(db_engine, grant_id) == (1, 0)
    states = [await state_of(db_engine, r) for r in racing]
    assert sorted(states) == ["approved", "pending", "pending", "pending"]  # type: ignore[type-var]


async def test_another_scope_or_a_dead_grant_is_asked(
    db_engine: AsyncEngine, lead_args: dict[str, Any]
) -> None:
    activities = ApprovalActivities(session_factory(db_engine))
    grant_id = await granted_for(db_engine, lead_args, uses=5)
    others = [
        request({**lead_args, "new_status": "contacted"}),  # other arguments
        request(lead_args, requester="bob"),  # another requester
        request(lead_args, agent="operations"),  # another agent
        request(lead_args).model_copy(update={"tenant_id": "globex"}),  # another tenant
        request(lead_args).model_copy(update={"voided_by": "bob"}),  # asked again: never granted
        request(lead_args).model_copy(update={"quorum": TWO_APPROVERS}),  # one grant never stands in for two
    ]
    for asked in others:
        assert await activities.record_approval_request(asked) is None, asked
        assert await state_of(db_engine, asked) == "pending"
    assert await uses_of(db_engine, grant_id) == (0, 5)

    async with session_factory(db_engine)() as session, session.begin():  # its time is up (chained)
        ended = await session.scalar(
            update(Grant)
            .where(Grant.id == grant_id)
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
            .returning(Grant)
        )
        assert ended is not None
        await chain(session, ended)
    assert await activities.record_approval_request(request(lead_args)) is None

    revoked = await granted_for(db_engine, lead_args, uses=5)
    async with session_factory(db_engine)() as session, session.begin():
        await revoke_grant(session, revoked, "bob")
    assert await activities.record_approval_request(request(lead_args)) is None
    assert await uses_of(db_engine, revoked) == (0, 5)
    for dead in (grant_id, revoked):
        await grant_chained(db_engine, dead)


lead_calls = st.fixed_dictionaries({
    "lead": st.sampled_from(["jane.doe@example.com", "john@example.com", "42"]),
    "new_status": st.sampled_from(["new", "contacted", "qualified"]),
    "reason": st.text(alphabet="ab yz.é", min_size=1, max_size=12).filter(str.strip),  # valid ones
})  # fmt: skip


@given(lead_calls, lead_calls)
def test_a_grant_of_update_lead_status_binds_all_but_its_reason(
    one: dict[str, Any], other: dict[str, Any]
) -> None:
    """The real tool's declared free argument (`reason`) is the only one a grant does not bind."""
    scope = grant_scope("acme", TOOL, "alice", "lead-qualifier", json.dumps(one), mcp=False)
    their = grant_scope("acme", TOOL, "alice", "lead-qualifier", json.dumps(other), mcp=False)
    assert scope is not None and their is not None
    assert (scope == their) == ((one["lead"], one["new_status"]) == (other["lead"], other["new_status"]))


def test_arguments_that_do_not_read_as_an_object_are_never_granted() -> None:
    for args in ("[1]", "not json", '{"lead": 1}'):
        assert grant_scope("acme", TOOL, "alice", "lead-qualifier", args, mcp=False) is None
    assert grant_scope("acme", "mcp__x__y", "alice", "ops", "[1]", mcp=True) is None
