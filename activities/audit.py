"""The audit row of a tool call (`tool_executions`), native or MCP, run or not: its one home.

`audit_row` is what every row holds; `ran_audit_row` adds what a call its activity ran has (the
approver, the idempotency key, the timing). The outcome comes from the one table in
`countersign.core.calls` (`outcome_of`), which the metrics read as well.

Executed calls are audited by their activity, in the transaction of their effect (activities/tools.py,
activities/mcp.py). Calls that never ran (refused by policy, rejected, expired, over a limit) are
audited here by `record_unexecuted_call`; every audit row is appended to its tenant's hash chain
in the transaction that writes it (countersign.db.chain). In conversations that store tool
results, the refusal the model reads is stored with its audit row.

The shared home of the audit is the one module of activities/ that the other activity modules
import (tests/test_architecture.py).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from countersign.core.activity_refs import RECORD_UNEXECUTED_CALL
from countersign.core.bounds import load_arguments_or_raw, storable
from countersign.core.calls import ToolInvocation, ToolResult, UnexecutedCall, outcome_of
from countersign.core.effects import Effect
from countersign.core.guards import redact
from countersign.db.chain import chain
from countersign.db.messages import store_tool_result
from countersign.db.people import roles_of
from countersign.db.quorum import approvals_of
from countersign.db.schema import ApprovalDecision, ToolExecution
from countersign.mcp.catalog import MCP_CATEGORY, MCP_RISK
from countersign.mcp.servers import server_of
from tools.registry import REGISTRY


def audit_row(
    inv: ToolInvocation, result: ToolResult, outcome: str, *, risk: str | None, category: str | None
) -> dict[str, Any]:
    """The `tool_executions` columns every audited call has (native or MCP, run or not): who, where,
    which call, what the model asked (redacted), what an approver's edit made of it, and what the
    model was told (redacted)."""
    return {
        "tenant_id": inv.caller.tenant_id,
        "agent": inv.caller.agent,
        "user_id": inv.caller.user_id,
        "workflow_id": inv.workflow_id,
        "conversation_id": inv.conversation_id,
        "run_id": inv.run_id,
        "call_id": inv.call_id,
        "turn": inv.turn,
        "tool": storable(inv.tool[:200]),
        "risk": risk,
        "category": category,
        "args": redact(load_arguments_or_raw(inv.model_arguments or inv.arguments)),
        "edited_args": redact(load_arguments_or_raw(inv.arguments)) if inv.arguments_edited else None,
        "result": redact(result.envelope()),
        "outcome": outcome,
        "error": storable(result.error.message) if result.error else None,
        "policy": inv.policy.model_dump(mode="json", exclude_defaults=True) if inv.policy else None,
    }


def standing_approvals(invocation: ToolInvocation) -> tuple[ColumnElement[bool], ...]:
    """The call's accepted approvals that no changed effect voided (`approval_decisions`)."""
    return (
        ApprovalDecision.workflow_id == invocation.workflow_id,
        ApprovalDecision.conversation_id == invocation.conversation_id,
        ApprovalDecision.call_id == invocation.call_id,
        ApprovalDecision.decision == "approve",
        ApprovalDecision.accepted.is_(True),
        ApprovalDecision.voided_at.is_(None),
    )


async def approval_reason(session: AsyncSession, invocation: ToolInvocation) -> str | None:
    """Why the call's reviewers approved it, as their standing decisions recorded it (None for a
    call nobody approved, or one approver who gave no reason): the audit row of the call keeps it
    beside who approved, as it keeps a rejection's. A quorum's row keeps every approver's reason
    ("bob: checked it; carol (no reason given)"), not only the last one's."""
    if invocation.approved_by is None:
        return None
    key = (invocation.conversation_id, invocation.call_id)
    approvals = (await approvals_of(session, [key])).get(key)
    return approvals.reason_text() if approvals is not None else None


def ran_audit_row(
    inv: ToolInvocation,
    result: ToolResult,
    *,
    risk: str | None,
    category: str | None,
    started: datetime,
    clock: float,
    unknown: bool = False,
    effect: Effect | None = None,
    decision_reason: str | None = None,
) -> dict[str, Any]:
    """The row of a call its activity ran, from `started` (and `time.perf_counter()` at `clock`)
    until now: `unknown` when its effect was sent out and no usable answer came; `effect`, the one
    it made, resolved again where it was made (an approved call's, issue 34); `decision_reason`,
    why its reviewer approved it (`approval_reason`)."""
    outcome = "unknown" if unknown else outcome_of(result.code, ran=True)
    return audit_row(inv, result, outcome, risk=risk, category=category) | {
        "approved_by": inv.approved_by,
        "grant_id": inv.grant_id,
        "decision_reason": decision_reason,
        "effect": effect.model_dump(mode="json") if effect is not None else None,
        "idempotency_key": inv.key,
        "started_at": started,
        "finished_at": datetime.now(UTC),
        "duration_ms": int((time.perf_counter() - clock) * 1000),
    }


class AuditActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @activity.defn(name=RECORD_UNEXECUTED_CALL.name)
    async def record_unexecuted_call(self, call: UnexecutedCall) -> None:
        inv = call.invocation
        tool = REGISTRY.get(inv.tool)
        row = audit_row(
            inv,
            call.result,
            outcome_of(call.result.code, ran=False),
            risk=tool.risk if tool else MCP_RISK if server_of(inv.tool) else None,
            category=tool.category if tool else MCP_CATEGORY if server_of(inv.tool) else None,
        )
        row["decision_reason"] = call.reason
        async with self._sessions() as session, session.begin():
            # the requester's roles now, as a call that ran records them (what `policy test` replays)
            row["roles"] = await roles_of(session, inv.caller.tenant_id, inv.caller.user_id) or []
            # a retried activity finds its row: one row per call, whatever happens
            inserted = await session.scalar(
                insert(ToolExecution).values(**row).on_conflict_do_nothing().returning(ToolExecution)
            )
            if inserted is not None:
                await chain(session, inserted)
            if inv.store_seq is not None:  # the envelope the model reads, with its audit row
                await store_tool_result(session, inv, call.result)
