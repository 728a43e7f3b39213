"""Grants in PostgreSQL (countersign.core.grants holds the rules): minted with the approval that
grants them, spent once per call under a row lock, listed, revoked. Every write is chained.

A use is keyed by the call's idempotency key (`grant_uses.idempotency_key`): the activity that
spends it may run again (a retry, a local activity replayed after a crash) and then finds its use
instead of spending another. Candidates are locked (`FOR UPDATE`) before one is spent: two calls
racing for a grant's last use wait for each other, and the second finds none left. A candidate is
spent only while its approver stands (`stands`): still active, with a role that lets them approve the
call, and not the last editor of what it sends; read from the database when it is spent, so a grant
dies with its approver's standing without anyone revoking it.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.approvals import approver_refusal
from countersign.core.authority import ADMIN
from countersign.core.calls import Risk
from countersign.core.grants import (
    Granted,
    GrantScope,
    GrantState,
    GrantTerms,
    covers,
    revoke_refusal,
    standing,
)
from countersign.db.chain import chain
from countersign.db.people import roles_of
from countersign.db.schema import ApprovalDecision, Grant, GrantUse


class GrantRefused(Exception):
    """A grant that cannot be revoked by this person: `status` 404 (none such) or 403."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def state_of(grant: Grant) -> GrantState:
    return GrantState(
        scope=GrantScope(
            tenant_id=grant.tenant_id,
            tool=grant.tool,
            requester=grant.requester,
            agent=grant.agent,
            content_sha256=grant.content_sha256 or "",  # none: a grant bound to arguments (before 0029)
        ),
        expires_at=grant.expires_at,
        uses_left=grant.uses_left,
        revoked=grant.revoked_at is not None,
    )


async def mint_grant(
    session: AsyncSession, decision: ApprovalDecision, scope: GrantScope, args: str, terms: GrantTerms
) -> None:
    """The grant of an accepted approval, once (a re-run of the decision's activity mints nothing)."""
    grant = await session.scalar(
        insert(Grant)
        .values(
            **scope.model_dump(),
            args=args,
            decision_id=decision.id,
            approver=decision.approver,
            workflow_id=decision.workflow_id,
            call_id=decision.call_id,
            minutes=terms.minutes,
            uses=terms.uses,
            uses_left=terms.uses,
            expires_at=decision.created_at + timedelta(minutes=terms.minutes),
        )
        .on_conflict_do_nothing(index_elements=[Grant.decision_id])
        .returning(Grant)
    )
    if grant is not None:
        await chain(session, grant)


async def stands(session: AsyncSession, grant: Grant, risk: Risk, editors: Collection[str]) -> bool:
    """Whether the grant's approver may still approve a call of `risk` by its requester now: an
    active user of the tenant whose roles allow it (as a decision's approver must), and not one of
    `editors` (who last edited what the call sends: four-eyes)."""
    if grant.approver in editors:
        return False
    roles = await roles_of(session, grant.tenant_id, grant.approver)
    return approver_refusal("approve", risk, grant.requester, grant.approver, roles) is None


async def spend_grant(
    session: AsyncSession,
    scope: GrantScope,
    *,
    key: str,
    workflow_id: str,
    conversation_id: str,
    call_id: str,
    now: datetime,
    risk: Risk,
    editors: Collection[str] = (),
) -> Granted | None:
    """Spend one use of a live grant covering the call (`key`: its idempotency key) whose approver
    still stands (`stands`: `risk` is the call's, `editors` who last edited what it sends) and record
    the use; the use already recorded for `key`, if any; None when no grant covers the call."""
    spent = await session.scalar(select(GrantUse).where(GrantUse.idempotency_key == key))
    if spent is not None:
        left = await session.scalar(select(Grant.uses_left).where(Grant.id == spent.grant_id))
        return Granted(
            grant_id=spent.grant_id,
            decision_id=spent.decision_id,
            approver=spent.approver,
            uses_left=left or 0,
        )
    candidates = await session.scalars(
        select(Grant)
        .where(
            Grant.tenant_id == scope.tenant_id,
            Grant.tool == scope.tool,
            Grant.requester == scope.requester,
            Grant.agent == scope.agent,
            Grant.content_sha256 == scope.content_sha256,
            Grant.revoked_at.is_(None),
            Grant.expires_at > now,
            Grant.uses_left > 0,
        )
        .order_by(Grant.expires_at, Grant.id)  # the one that ends first
        .with_for_update()
    )
    grant = None
    for candidate in list(candidates):
        if covers(state_of(candidate), scope, now) and await stands(session, candidate, risk, editors):
            grant = candidate
            break
    if grant is None:
        return None
    spent_on = await session.scalar(
        update(Grant)
        .where(Grant.id == grant.id)
        .values(uses_left=Grant.uses_left - 1)
        .returning(Grant)
        .execution_options(populate_existing=True)
    )
    assert spent_on is not None  # locked above
    await chain(session, spent_on)
    use = await session.scalar(
        insert(GrantUse)
        .values(
            tenant_id=scope.tenant_id,
            grant_id=grant.id,
            decision_id=grant.decision_id,
            approver=grant.approver,
            workflow_id=workflow_id,
            conversation_id=conversation_id,
            call_id=call_id,
            idempotency_key=key,
        )
        .returning(GrantUse)
    )
    assert use is not None  # a plain insert returns its row
    await chain(session, use)
    return Granted(
        grant_id=grant.id,
        decision_id=grant.decision_id,
        approver=grant.approver,
        uses_left=spent_on.uses_left,
    )


def grant_view(grant: Grant, now: datetime) -> dict[str, Any]:
    """A grant as `grants list --json` and `GET /api/grants` show it."""
    return {
        "id": grant.id,
        "tenant_id": grant.tenant_id,
        "tool": grant.tool,
        "requester": grant.requester,
        "agent": grant.agent,
        "args": grant.args,
        "approver": grant.approver,
        "decision_id": grant.decision_id,
        "workflow_id": grant.workflow_id,
        "call_id": grant.call_id,
        "minutes": grant.minutes,
        "uses": grant.uses,
        "uses_left": grant.uses_left,
        "created_at": grant.created_at.isoformat(),
        "expires_at": grant.expires_at.isoformat(),
        "revoked_at": grant.revoked_at.isoformat() if grant.revoked_at else None,
        "revoked_by": grant.revoked_by,
        "state": standing(state_of(grant), now),
    }


async def grants_of(session: AsyncSession, tenant_id: str, seen_by: str | None = None) -> list[Grant]:
    """The tenant's grants, newest first; `seen_by`: only those a person who is not an admin may
    see (they granted it, or it lets their calls run). None: all (an operator's CLI)."""
    query = select(Grant).where(Grant.tenant_id == tenant_id).order_by(Grant.id.desc())
    if seen_by is not None and ADMIN not in (await roles_of(session, tenant_id, seen_by) or []):
        query = query.where(or_(Grant.approver == seen_by, Grant.requester == seen_by))
    return list(await session.scalars(query))


async def revoke_grant(
    session: AsyncSession, grant_id: int, revoker: str, tenant_id: str | None = None
) -> Grant:
    """Revoke a grant (by one of its tenant's admins, or its approver), chained; a grant already
    revoked stays as it was. `tenant_id`: the revoker's tenant (the server's signed-in person), where
    the grant must be; None: the grant's own (names mode: the name is checked against its users).
    Raises GrantRefused."""
    query = select(Grant).where(Grant.id == grant_id)
    if tenant_id is not None:
        query = query.where(Grant.tenant_id == tenant_id)
    grant = await session.scalar(query.with_for_update())
    if grant is None:
        raise GrantRefused(404, f"no grant {grant_id}")
    refusal = revoke_refusal(revoker, await roles_of(session, grant.tenant_id, revoker), grant.approver)
    if refusal is not None:
        raise GrantRefused(403, refusal)
    if grant.revoked_at is not None:
        return grant
    revoked = await session.scalar(
        update(Grant)
        .where(Grant.id == grant_id)
        .values(revoked_at=func.now(), revoked_by=revoker)
        .returning(Grant)
        .execution_options(populate_existing=True)
    )
    assert revoked is not None  # locked above
    await chain(session, revoked)
    return revoked
