"""Spending a grant where a call's approval request is recorded (activities/approvals.py,
`record_approval_request`) against the real PostgreSQL: once per call however often the activity
runs, never past its uses (two calls racing for the last one), never for another scope or content,
never once its approver no longer stands, and every change chained."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest_asyncio
from sqlalchemy import delete, insert, select, update
from sqlalchemy.dialects.postgresql import insert as upsert
from sqlalchemy.ext.asyncio import AsyncEngine

from activities.approvals import ApprovalActivities
from countersign.core.approvals import RecordedApproval
from countersign.core.calls import PolicyDecision
from countersign.core.grants import GrantScope, GrantTerms, content_digest
from countersign.db.access import set_active
from countersign.db.chain import chain
from countersign.db.engine import session_factory
from countersign.db.grants import mint_grant, revoke_grant
from countersign.db.schema import ApprovalDecision, ApprovalRequest, Grant, GrantUse, Lead, UserRole
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
    """Arguments no other test's call has (a new lead of its own), and every grant revoked after."""
    email = f"grant-{uuid.uuid4().hex[:8]}@example.com"
    async with session_factory(db_engine)() as session, session.begin():
        session.add(Lead(tenant_id="acme", email=email, name="Grant Test", status="new"))
    yield {"lead": email, "new_status": "qualified", "reason": "r"}
    async with session_factory(db_engine)() as session, session.begin():
        await session.execute(delete(Lead).where(Lead.tenant_id == "acme", Lead.email == email))
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
        effect = await ApprovalActivities.resolve_effect(session, request(args))
        assert effect.problem is None, effect
        scope = GrantScope(
            tenant_id="acme", tool=TOOL, requester="alice", agent="lead-qualifier",
            content_sha256=content_digest(effect, ("reason",)),
        )  # fmt: skip
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


async def test_a_grant_dies_with_its_approvers_standing(
    db_engine: AsyncEngine, lead_args: dict[str, Any]
) -> None:
    """Read when it is spent: bob deactivated, or without the role that let him approve, covers
    nothing; back in standing, his grant covers again (it was never revoked)."""
    activities = ApprovalActivities(session_factory(db_engine))
    grant_id = await granted_for(db_engine, lead_args, uses=5)
    try:
        async with session_factory(db_engine)() as session, session.begin():
            await set_active(session, "acme", "bob", False, datetime.now(UTC))
        assert await activities.record_approval_request(request(lead_args)) is None
        async with session_factory(db_engine)() as session, session.begin():
            await set_active(session, "acme", "bob", True, datetime.now(UTC))
            await session.execute(
                delete(UserRole).where(UserRole.tenant_id == "acme", UserRole.user_id == "bob")
            )
        assert await activities.record_approval_request(request(lead_args)) is None
        assert await uses_of(db_engine, grant_id) == (0, 5)
    finally:
        async with session_factory(db_engine)() as session, session.begin():
            await set_active(session, "acme", "bob", True, datetime.now(UTC))
            await session.execute(
                upsert(UserRole)
                .values(tenant_id="acme", user_id="bob", role="reviewer")
                .on_conflict_do_nothing()
            )
    covered = await activities.record_approval_request(request(lead_args))
    assert covered is not None and covered.grant_id == grant_id
