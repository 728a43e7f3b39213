"""A rollback after the conversation ended: the saga from PostgreSQL instead of workflow state.

`execute_tool` writes a `saga_entries` row in the transaction of every compensable call that
executed; `compensations` says which were undone already. The entries still to undo are those
without a final compensation, chosen by scope like the live saga (newest first).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.saga import FINAL_STATES
from countersign.core.activity_refs import LOAD_SAGA_ENTRIES
from countersign.core.calls import CallerContext
from countersign.core.saga import CompensationRequest, EndedRollback, Saga, SagaEntry
from countersign.db.schema import Compensation, SagaRecord


class RollbackActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @activity.defn(name=LOAD_SAGA_ENTRIES.name)
    async def load_saga_entries(self, rollback: EndedRollback) -> list[CompensationRequest]:
        """What `rollback.request` undoes of the ended conversation, newest first."""
        async with self._sessions() as session:
            rows = list(
                await session.scalars(
                    select(SagaRecord).where(
                        SagaRecord.workflow_id == rollback.workflow_id,
                        SagaRecord.conversation_id == rollback.conversation_id,
                        SagaRecord.tenant_id == rollback.tenant_id,
                    )
                )
            )
            rows.sort(key=lambda r: (r.turn, len(r.call_id), r.call_id))  # call order: c2 before c10
            finished = set(
                await session.scalars(
                    select(Compensation.call_id).where(
                        Compensation.workflow_id == rollback.workflow_id,
                        Compensation.conversation_id == rollback.conversation_id,
                        Compensation.state.in_(FINAL_STATES),
                    )
                )
            )
        saga = Saga(
            entries=[
                SagaEntry(
                    call_id=r.call_id,
                    tool=r.tool,
                    turn=r.turn,
                    arguments=r.arguments,
                    state="done" if r.call_id in finished else "registered",
                )
                for r in rows
            ]
        )
        callers = {r.call_id: CallerContext.model_validate(r.caller) for r in rows}
        latest = max((r.turn for r in rows), default=0)
        request = rollback.request
        return [
            CompensationRequest(
                caller=callers[e.call_id],
                workflow_id=rollback.workflow_id,
                conversation_id=rollback.conversation_id,
                entry=e,
            )
            for e in saga.to_undo(request.scope, latest, request.call_id)
        ]
