"""Audit rows for tool calls that never ran: refused by policy, rejected, expired, over a limit.

Executed calls are audited by the tool activity itself, in the transaction of their effect.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.tools import load_arguments_or_raw
from countersign.bounds import storable
from countersign.db.schema import ToolExecution
from countersign.guards import redact
from countersign.mcp.catalog import MCP_CATEGORY, MCP_RISK
from countersign.mcp.servers import server_of
from countersign.tooling import ErrorCode, ToolInvocation, ToolResult
from tools.registry import REGISTRY

OUTCOME_OF: dict[ErrorCode, str] = {
    "UNKNOWN_TOOL": "invalid",
    "VALIDATION_ERROR": "invalid",
    "BLOCKED": "blocked",
    "FORBIDDEN": "blocked",
    "LIMIT_REACHED": "limit_reached",
    "REJECTED": "rejected",
    "EXPIRED": "expired",
}


class UnexecutedCall(BaseModel):
    invocation: ToolInvocation
    result: ToolResult  # the error envelope the model was given
    reason: str | None = None  # who decided and why, for rejected and expired calls


def outcome_of(result: ToolResult) -> str:
    return OUTCOME_OF.get(result.error.code, "failed") if result.error else "failed"


class AuditActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @activity.defn(name="record_unexecuted_call")
    async def record_unexecuted_call(self, call: UnexecutedCall) -> None:
        inv = call.invocation
        tool = REGISTRY.get(inv.tool)
        row = audit_row(
            inv,
            call.result,
            outcome_of(call.result),
            risk=tool.risk if tool else MCP_RISK if server_of(inv.tool) else None,
            category=tool.category if tool else MCP_CATEGORY if server_of(inv.tool) else None,
        )
        row["decision_reason"] = call.reason
        async with self._sessions() as session, session.begin():
            # a retried activity finds its row: one row per call, whatever happens
            await session.execute(insert(ToolExecution).values(**row).on_conflict_do_nothing())


def audit_row(
    inv: ToolInvocation, result: ToolResult, outcome: str, *, risk: str | None, category: str | None
) -> dict[str, Any]:
    """The `tool_executions` columns every audited call has: who, where, which call, what was asked
    (redacted) and what the model was told (redacted)."""
    return {
        "tenant_id": inv.caller.tenant_id,
        "agent": inv.caller.agent,
        "user_id": inv.caller.user_id,
        "workflow_id": inv.workflow_id,
        "run_id": inv.run_id,
        "call_id": inv.call_id,
        "turn": inv.turn,
        "tool": storable(inv.tool[:200]),
        "risk": risk,
        "category": category,
        "args": redact(load_arguments_or_raw(inv.arguments)),
        "result": redact(result.envelope()),
        "outcome": outcome,
        "error": storable(result.error.message) if result.error else None,
    }
