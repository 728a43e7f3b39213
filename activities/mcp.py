"""MCP tool calls as activities, through the same gates as native tools.

- `check_mcp_arguments` validates a call against the schema snapshotted at conversation start
  (unknown keys refused) before anyone is asked to approve it.
- `execute_mcp_tool` validates again, checks the server is still registered for the agent and
  still lists the same tool (same schema and description), calls it with the call's idempotency
  key in the request's `_meta` (`countersign/call_id`, for servers that deduplicate), passes the
  result through the common redaction and truncation, and writes the `tool_executions` row.
  A server that is down, slow or refusing gives an error envelope at once: never a retry loop.
- What a conversation is offered (its snapshot) is listed by `load_conversation_context`, with
  `countersign.mcp.snapshot.mcp_specs`.

Exactly-once is weaker than for native tools, whose effect commits with its audit row: an MCP
server's effect is outside our transaction. An attempt that finds the call's audit row returns it;
a worker that dies between the server's answer and the audit row makes the retry call again, with
the same `_meta` key.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.access import admit, check_standing
from activities.audit import approval_reason, ran_audit_row
from activities.heartbeat import heartbeats
from activities.rules import approval_required, asks_now, refusal_now, ruled, rules_now
from countersign.core.activity_refs import CHECK_MCP_ARGUMENTS, EXECUTE_MCP_TOOL
from countersign.core.calls import CheckedCall, McpCall, StoredResult, ToolInvocation, ToolResult, lock_key
from countersign.core.guards import TruncationLimits, sanitize
from countersign.db.chain import chain
from countersign.db.messages import result_or_envelope
from countersign.db.ratelimit import RateLimits
from countersign.db.schema import McpServer, ToolExecution
from countersign.mcp.catalog import argument_errors, mcp_result, normalized
from countersign.mcp.pool import McpOutcomeUnknown, McpPool, McpRefused, McpUnavailable
from countersign.mcp.servers import ServerConfig
from tools.arguments import load_arguments
from tools.registry import OutcomeUnknown, ToolFailure

META_CALL_ID = "countersign/call_id"


class McpActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        pool: McpPool,
        limits: TruncationLimits | None = None,
        rate_limits: RateLimits | None = None,
    ) -> None:
        self._sessions = sessions
        self._pool = pool
        self._limits = limits or TruncationLimits()
        self._rate_limits = rate_limits or RateLimits()

    # --- before approval ----------------------------------------------------------------------

    @activity.defn(name=CHECK_MCP_ARGUMENTS.name)
    async def check_mcp_arguments(self, call: McpCall) -> CheckedCall:
        """`{"ok": true, "data": <arguments>}`, the VALIDATION_ERROR envelope or the access gate's
        refusal, with the rules in force now (activities/rules.py), as `check_arguments`."""
        try:
            arguments = validated(call)
        except ToolFailure as failure:
            return CheckedCall.failure(failure.code, failure.message)
        except Exception:  # the schema check itself broke: refuse now, never retried, never asked
            activity.logger.exception("checking %s arguments failed", call.spec.name)
            return CheckedCall.failure(
                "INTERNAL_ERROR", f"the arguments of {call.spec.name} could not be checked"
            )
        async with self._sessions() as session:
            try:  # as for native tools: nobody approves a call for a user who can no longer act
                await check_standing(session, call.invocation.caller, call.spec.name, ())
            except ToolFailure as refused:
                return CheckedCall.failure(refused.code, refused.message)
            checked = ruled(
                CheckedCall.success(arguments),
                await rules_now(session, call.invocation, call.spec),
                call.spec,
            )
            await session.commit()  # a shadow set's difference, found on the way, is kept
        return checked

    # --- the call -----------------------------------------------------------------------------

    @activity.defn(name=EXECUTE_MCP_TOOL.name)
    @heartbeats
    async def execute_mcp_tool(self, call: McpCall) -> ToolResult | StoredResult:
        """The call's result; with `store_seq`, stored as its tool message with its audit row
        (one transaction), answered with the small `StoredResult` (see `result_or_envelope`)."""
        inv = call.invocation
        key = inv.key
        started = datetime.now(UTC)
        clock = time.perf_counter()
        async with self._sessions() as session, session.begin():
            lock = lock_key(inv.workflow_id, inv.call_id)
            await session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(lock, 0))))
            recorded = await self._recorded(session, inv)
            if recorded is not None:
                return await result_or_envelope(session, inv, recorded)
            rules = await rules_now(session, inv, call.spec)
            refusal = refusal_now(rules, call.spec)
            if refusal is None and asks_now(rules, inv):
                return approval_required(inv)
            if rules.policy is not None:  # the decision in force, with its set's version, in the audit
                inv = inv.model_copy(update={"policy": rules.policy})
                call = call.model_copy(update={"invocation": inv})
            try:
                if refusal is not None:
                    raise refusal
                await admit(session, inv.caller, inv.tool, (), self._rate_limits, started)
                server: ServerConfig | None = await self._server(session, call)
            except ToolFailure as refused:
                server, result = None, ToolResult.failure(refused.code, refused.message)
        unknown = False
        if server is not None:
            try:
                result = await self._call(server, call, key)
            except ToolFailure as failure:
                result = ToolResult.failure(failure.code, failure.message)
                unknown = isinstance(failure, OutcomeUnknown)
        result = result.model_copy(update={"data": sanitize(result.data, self._limits)})
        blocked = refusal is not None
        return await self._audit(
            call, result, started, clock, unknown=unknown, blocked=blocked, roles=rules.roles
        )

    async def _server(self, session: AsyncSession, call: McpCall) -> ServerConfig:
        """The server as registered now: still there, still for this agent and tenant."""
        inv, ref = call.invocation, call.spec.mcp
        assert ref is not None
        row = await session.get(McpServer, ref.server)
        server = ServerConfig.of_row(row) if row is not None else None
        if (
            server is None
            or inv.caller.agent not in server.agents
            or server.tenant_id not in (None, inv.caller.tenant_id)
        ):
            raise ToolFailure(
                "CONFLICT", f"MCP server {ref.server!r} is no longer registered for agent {inv.caller.agent}"
            )
        return server

    async def _call(self, server: ServerConfig, call: McpCall, key: str) -> ToolResult:
        ref = call.spec.mcp
        assert ref is not None
        arguments = validated(call)
        try:
            listing = await self._pool.list_tools(server)
            now = next((t for t in listing if t.name == ref.tool), None)
            if now is None or now.fingerprint() != ref.fingerprint:
                what = "no longer lists" if now is None else "changed the schema or description of"
                raise ToolFailure(
                    "CONFLICT",
                    f"MCP server {server.name!r} {what} {ref.tool} since this conversation started; "
                    "it was not called (a new conversation sees the current version)",
                )
            outcome = await self._pool.call_tool(server, ref.tool, arguments, {META_CALL_ID: key})
        except McpOutcomeUnknown as lost:
            raise OutcomeUnknown(
                "INTERNAL_ERROR",
                f"{lost}; {call.spec.name} was sent and may have run: its outcome is unknown. "
                "Check its effect before calling it again",
            ) from lost
        except McpUnavailable as down:
            raise ToolFailure("INTERNAL_ERROR", f"{down}; {call.spec.name} was not completed") from down
        except McpRefused as refused:
            raise ToolFailure("INTERNAL_ERROR", str(refused)) from refused
        return mcp_result(outcome, call.spec.name)

    async def _recorded(self, session: AsyncSession, inv: ToolInvocation) -> ToolResult | None:
        row = await session.scalar(
            select(ToolExecution.result).where(
                ToolExecution.workflow_id == inv.workflow_id,
                ToolExecution.conversation_id == inv.conversation_id,
                ToolExecution.call_id == inv.call_id,
            )
        )
        return ToolResult.model_validate(row) if row is not None else None

    async def _audit(
        self,
        call: McpCall,
        result: ToolResult,
        started: datetime,
        clock: float,
        *,
        unknown: bool = False,
        blocked: bool = False,
        roles: list[str] | None = None,
    ) -> ToolResult | StoredResult:
        """`blocked`: the rules in force stopped the call before the server was asked; `roles`: the
        requester's as they read them (what `policy test` replays the call with)."""
        inv, spec = call.invocation, call.spec
        async with self._sessions() as session, session.begin():
            row = ran_audit_row(
                inv, result, risk=spec.risk, category=spec.category, started=started, clock=clock,
                unknown=unknown, decision_reason=await approval_reason(session, inv),
            ) | {"roles": roles}  # fmt: skip
            if blocked:
                row["outcome"] = "blocked"
            inserted = await session.scalar(
                insert(ToolExecution).values(**row).on_conflict_do_nothing().returning(ToolExecution)
            )
            if inserted is not None:
                await chain(session, inserted)
            else:  # a concurrent attempt of the same call recorded first: its answer holds
                result = await self._recorded(session, inv) or result
            return await result_or_envelope(session, inv, result)


def validated(call: McpCall) -> dict[str, Any]:
    """The call's arguments, checked against the snapshotted schema and normalized by it (its plan:
    what policies judged and reviewers were shown is what is sent), or VALIDATION_ERROR."""
    arguments = load_arguments(call.invocation.arguments)
    errors = argument_errors(call.spec, arguments)
    if errors:
        raise ToolFailure("VALIDATION_ERROR", errors)
    planned: dict[str, Any] = normalized(call.spec.parameters, arguments)
    return planned
