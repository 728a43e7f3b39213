"""Saga I/O: run one compensation exactly once, record a failed one, authorize a rollback.

A compensation and its `compensations` row commit in one transaction (under an advisory lock on
the call), and the call's audit row is marked rolled back in the same transaction: a retry after
the commit finds the row and changes nothing twice.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeats
from countersign.core.activity_refs import AUTHORIZE_ROLLBACK, COMPENSATE_CALL, RECORD_COMPENSATION_FAILURE
from countersign.core.authority import action_refusal
from countersign.core.calls import lock_key
from countersign.core.saga import (
    FINAL_STATES,
    STATE_WHY,
    CompensationOutcome,
    CompensationRequest,
    RollbackAuthorization,
    undo_state,
)
from countersign.db.attempts import attempt_key, record_once
from countersign.db.chain import chain
from countersign.db.events import publish
from countersign.db.people import roles_of
from countersign.db.schema import Compensation, RollbackRecord, ToolExecution
from countersign.identity.proofs import Binding, ProofVerifier, check_proof
from tools.arguments import validate
from tools.registry import REGISTRY, ToolContext, ToolFailure

# Why undoing a call ended as it did, for its readers, by the compensation's outcome.
UNDO_WHY = {
    "undone": "its change was reversed",
    "already_undone": "it was already undone",
    "never_happened": STATE_WHY["skipped"],
    "irreversible": STATE_WHY["irreversible"],
}


async def told(session: AsyncSession, request: CompensationRequest, state: str, why: str) -> None:
    """The conversation's readers learn how undoing a call ended, and why (once per call and state)."""
    entry = request.entry
    undone = {"call_id": entry.call_id, "tool": entry.tool, "state": state, "why": why}
    key = f"rollback:{entry.call_id}:{state}"
    instance = request.workflow_id, request.conversation_id
    await publish(session, *instance, request.caller.tenant_id, "rollback", undone, key)


class SagaActivities:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], proofs: ProofVerifier | None = None
    ) -> None:
        self._sessions = sessions
        self._proofs = proofs or ProofVerifier(mode="names")

    @activity.defn(name=COMPENSATE_CALL.name)
    @heartbeats
    async def compensate_call(self, request: CompensationRequest) -> CompensationOutcome:
        entry = request.entry
        tool = REGISTRY.get(entry.tool)
        if tool is None or tool.compensation is None:
            detail = f"{entry.tool} declares no compensation"
            async with self._sessions() as session, session.begin():
                await told(session, request, "irreversible", f"{detail}: it cannot be undone")
            return CompensationOutcome(state="irreversible", detail=detail)
        async with self._sessions() as session, session.begin():
            key = f"{lock_key(request.workflow_id, entry.call_id)}:undo"
            await session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(key, 0))))
            done = await session.scalar(
                select(Compensation).where(
                    Compensation.workflow_id == request.workflow_id,
                    Compensation.conversation_id == request.conversation_id,
                    Compensation.call_id == entry.call_id,
                )
            )
            if done is not None and done.state in FINAL_STATES:
                return CompensationOutcome.model_validate({"state": done.state, "detail": "recorded earlier"})
            executed = await session.scalar(
                select(ToolExecution).where(
                    ToolExecution.workflow_id == request.workflow_id,
                    ToolExecution.conversation_id == request.conversation_id,
                    ToolExecution.call_id == entry.call_id,
                    ToolExecution.outcome == "executed",
                )
            )
            if executed is None:
                outcome = "never_happened"
            else:
                recorded = executed.result or {}
                result = entry.result if entry.result is not None else recorded.get("data")
                context = ToolContext(
                    caller=request.caller,
                    session=session,
                    workflow_id=request.workflow_id,
                    call_id=entry.call_id,
                    now=datetime.now(UTC),
                    conversation_id=request.conversation_id,
                )
                try:
                    args = validate(tool, entry.arguments)
                except ToolFailure as failure:  # arguments that executed always validate again
                    raise RuntimeError(
                        f"recorded arguments no longer validate: {failure.message}"
                    ) from failure
                try:
                    async with session.begin_nested():
                        outcome = await tool.compensation(context, args, result)
                except ToolFailure as refusal:  # the tool says it cannot undo safely: a person must look
                    raise ApplicationError(
                        f"{refusal.code}: {refusal.message}", type="CompensationRefused", non_retryable=True
                    ) from refusal
            state = undo_state(outcome)
            await self._record(session, request, state, None)
            await told(session, request, state, UNDO_WHY.get(outcome, outcome))
            if state == "done":
                undone = await session.scalars(
                    update(ToolExecution)
                    .where(
                        ToolExecution.workflow_id == request.workflow_id,
                        ToolExecution.conversation_id == request.conversation_id,
                        ToolExecution.call_id == entry.call_id,
                    )
                    .values(rolled_back=True, rolled_back_at=func.now())
                    .returning(ToolExecution)
                    .execution_options(populate_existing=True)
                )
                for row in undone:
                    await chain(session, row)
        return CompensationOutcome(state=state, detail=outcome)

    @activity.defn(name=RECORD_COMPENSATION_FAILURE.name)
    async def record_compensation_failure(self, request: CompensationRequest) -> None:
        async with self._sessions() as session, session.begin():
            await self._record(session, request, "failed", request.entry.error)
            await told(session, request, "failed", f"undoing it failed: {request.entry.error}")

    @staticmethod
    async def _record(
        session: AsyncSession, request: CompensationRequest, state: str, error: str | None
    ) -> None:
        tool = REGISTRY.get(request.entry.tool)
        compensation = tool.compensation.__name__ if tool and tool.compensation else "none"
        values = {"state": state, "error": error, "finished_at": func.now()}
        row = await session.scalar(
            insert(Compensation)
            .values(
                tenant_id=request.caller.tenant_id,
                workflow_id=request.workflow_id,
                conversation_id=request.conversation_id,
                call_id=request.entry.call_id,
                tool=request.entry.tool,
                compensation=compensation,
                **values,
            )
            .on_conflict_do_update(index_elements=["workflow_id", "conversation_id", "call_id"], set_=values)
            .returning(Compensation)
            .execution_options(populate_existing=True)
        )
        assert row is not None  # an upsert returns its row
        await chain(session, row)

    @activity.defn(name=AUTHORIZE_ROLLBACK.name)
    async def authorize_rollback(self, auth: RollbackAuthorization) -> str:
        """ "" when the requester may roll back (the conversation's user, or an admin of the
        tenant), else why not. Every request is recorded either way, once: a retry of this
        invocation (same attempt key) answers from the row the first run wrote."""
        request = auth.request
        key = attempt_key()
        async with self._sessions() as session, session.begin():

            async def attempt() -> dict[str, Any]:
                refusal = await check_proof(
                    session,
                    self._proofs,
                    request.proof,
                    Binding.rollback(
                        auth.tenant_id, auth.workflow_id, auth.conversation_id, request.scope, request.call_id
                    ),
                    request.requested_by,
                    datetime.now(UTC),
                    key,
                )
                refusal = refusal or await self._rollback_refusal(session, auth)
                return {
                    "tenant_id": auth.tenant_id,
                    "workflow_id": auth.workflow_id,
                    "requested_by": request.requested_by,
                    "scope": request.scope,
                    "call_id": request.call_id,
                    "accepted": refusal is None,
                    "reason": refusal or request.reason,
                    "proven": refusal is None and self._proofs.mode == "signed",
                }

            row = await record_once(session, RollbackRecord, RollbackRecord.attempt_key, key, attempt)
            await chain(session, row)  # a re-run finds it chained: nothing is appended twice
            return "" if row.accepted else row.reason or "refused"

    @staticmethod
    async def _rollback_refusal(session: AsyncSession, auth: RollbackAuthorization) -> str | None:
        requester = auth.request.requested_by
        roles = await roles_of(session, auth.tenant_id, requester)
        return action_refusal("rollback", requester, auth.conversation_user, roles)
