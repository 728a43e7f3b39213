"""The audit as people read it: one row per tool call (`tool_executions`), with who asked for the
conversation and whether that was proven (a start proof the worker accepted, `proof_checks`),
whether the decision on it was proven (`approval_decisions.proven`), and how an undo of it ended
and why (`compensations`: `undo`, `undo_why`; a skipped undo is never a bare `rolled_back` False)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.saga import undo_why
from countersign.db.instances import current_instance
from countersign.db.schema import ApprovalDecision, Compensation, ProofCheck, ToolExecution


async def audit_rows(
    session: AsyncSession, workflow_id: str | None = None, tenant_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The latest `limit` calls (of one conversation: the instance its workflow id names now, see
    db.instances; or of one tenant), oldest first."""
    start_proven = exists().where(
        ProofCheck.workflow_id == ToolExecution.workflow_id,
        ProofCheck.action == "start",
        ProofCheck.accepted,
    )
    decision_proven = exists().where(
        ApprovalDecision.workflow_id == ToolExecution.workflow_id,
        ApprovalDecision.conversation_id == ToolExecution.conversation_id,
        ApprovalDecision.call_id == ToolExecution.call_id,
        ApprovalDecision.accepted,
        ApprovalDecision.proven,
    )
    undo = (
        (Compensation.workflow_id == ToolExecution.workflow_id)
        & (Compensation.conversation_id == ToolExecution.conversation_id)
        & (Compensation.call_id == ToolExecution.call_id)
    )
    query = (
        select(
            ToolExecution,
            start_proven.label("request_proven"),
            decision_proven.label("decision_proven"),
            Compensation.state,
            Compensation.error,
        )
        .outerjoin(Compensation, undo)
        .order_by(ToolExecution.id.desc())
        .limit(limit)
    )
    if workflow_id:
        query = query.where(
            ToolExecution.workflow_id == workflow_id,
            ToolExecution.conversation_id == current_instance(workflow_id),
        )
    if tenant_id:
        query = query.where(ToolExecution.tenant_id == tenant_id)
    found = (await session.execute(query)).all()
    return [
        {
            **{c.name: getattr(r, c.name) for c in ToolExecution.__table__.columns},
            # `args` are the model's; an approver who edited them approved `edited_args`
            "edited_by": r.approved_by if r.edited_args is not None else None,
            "requested_by": r.user_id,
            "request_proven": request_proven,
            "decision_proven": decided_proven if r.approved_by else None,
            "undo": undo_state,  # None: nobody asked to undo it
            "undo_why": undo_why(undo_state, undo_error) if undo_state else None,
        }
        for r, request_proven, decided_proven, undo_state, undo_error in reversed(found)
    ]
