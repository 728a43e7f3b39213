"""Approval I/O: verify and audit every decision attempt, and remind reviewers before expiry."""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.tools import validate
from countersign.approvals import DecisionRecord, Verdict, approver_refusal
from countersign.db.schema import ApprovalDecision, Notification, User, UserRole
from tools.registry import REGISTRY, ToolFailure


class ApprovalReminder(BaseModel):
    tenant_id: str
    workflow_id: str
    call_id: str
    tool: str
    args: str
    expires_at: datetime


async def roles_of(session: AsyncSession, tenant_id: str, user_id: str) -> list[str] | None:
    """The user's roles in the tenant, or None when they are not a user of it."""
    if await session.get(User, (tenant_id, user_id)) is None:
        return None
    rows = await session.scalars(
        select(UserRole.role).where(UserRole.tenant_id == tenant_id, UserRole.user_id == user_id)
    )
    return list(rows)


class ApprovalActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @activity.defn(name="record_decision")
    async def record_decision(self, record: DecisionRecord) -> Verdict:
        """Verify the approver against the database, re-validate edited arguments, audit the attempt."""
        decision = record.decision
        async with self._sessions() as session, session.begin():
            refusal = record.refusal
            if refusal is None:
                roles = await roles_of(session, record.tenant_id, decision.approver)
                refusal = approver_refusal(
                    decision.decision, record.risk, record.requested_by, decision.approver, roles
                )
            edited: str | None = None
            if refusal is None and decision.args is not None:
                edited, refusal = self._edited(record.tool, decision.args)
            session.add(
                ApprovalDecision(
                    tenant_id=record.tenant_id,
                    workflow_id=record.workflow_id,
                    call_id=decision.call_id,
                    tool=record.tool,
                    approver=decision.approver,
                    decision=decision.decision,
                    accepted=refusal is None,
                    reason=refusal or decision.reason,
                    args=decision.args,
                )
            )
        return Verdict(accepted=refusal is None, reason=refusal, args=edited)

    @staticmethod
    def _edited(tool_name: str, args: dict[str, object]) -> tuple[str | None, str | None]:
        """(validated arguments as JSON, None) or (None, why they are invalid)."""
        tool = REGISTRY.get(tool_name)
        if tool is None:
            return None, f"no tool named {tool_name!r}"
        try:
            return validate(tool, json.dumps(args)).model_dump_json(), None
        except ToolFailure as failure:
            return None, f"edited arguments are invalid: {failure.message}"

    @activity.defn(name="send_approval_reminder")
    async def send_approval_reminder(self, reminder: ApprovalReminder) -> None:
        """A tenant-wide notification that a call still waits for a decision (once per call)."""
        async with self._sessions() as session, session.begin():
            sent = await session.scalar(
                select(Notification.id).where(
                    Notification.workflow_id == reminder.workflow_id,
                    Notification.call_id == reminder.call_id,
                    Notification.kind == "approval_reminder",
                )
            )
            if sent is None:
                session.add(
                    Notification(
                        tenant_id=reminder.tenant_id,
                        user_id=None,
                        kind="approval_reminder",
                        message=(
                            f"{reminder.tool} {reminder.args} waits for approval in {reminder.workflow_id} "
                            f"(call {reminder.call_id}); it expires at {reminder.expires_at.isoformat()}"
                        ),
                        workflow_id=reminder.workflow_id,
                        call_id=reminder.call_id,
                    )
                )
