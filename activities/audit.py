"""Audit rows for tool calls that never ran: refused by policy, rejected, expired, over a limit.

Executed calls are audited by the tool activity itself, in the transaction of their effect. In
conversations that store tool results, the refusal the model reads is stored with its audit row.
"""

from __future__ import annotations

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.tools import audit_row
from countersign.core.activity_refs import RECORD_UNEXECUTED_CALL
from countersign.core.calls import UnexecutedCall, outcome_of
from countersign.db.messages import store_tool_result
from countersign.db.schema import ToolExecution
from countersign.mcp.catalog import MCP_CATEGORY, MCP_RISK
from countersign.mcp.servers import server_of
from tools.registry import REGISTRY


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
            outcome_of(call.result),
            risk=tool.risk if tool else MCP_RISK if server_of(inv.tool) else None,
            category=tool.category if tool else MCP_CATEGORY if server_of(inv.tool) else None,
        )
        row["decision_reason"] = call.reason
        async with self._sessions() as session, session.begin():
            # a retried activity finds its row: one row per call, whatever happens
            await session.execute(insert(ToolExecution).values(**row).on_conflict_do_nothing())
            if inv.store_seq is not None:  # the envelope the model reads, with its audit row
                await store_tool_result(session, inv, call.result)
