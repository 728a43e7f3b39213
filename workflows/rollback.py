"""ConversationRollback: `rollback` of a conversation that has ended, as a short workflow.

An ended AgentWorkflow takes no signal, so its saga is read from PostgreSQL (`saga_entries`,
`compensations`) and undone by the same activities with the same guarantees as a live rollback:
authorized and audited by `authorize_rollback`, each call undone at most once by `compensate_call`
(which also refuses to overwrite a later human change), a failed compensation recorded, not dropped.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from countersign.core.contract import ROLLBACK_WORKFLOW_TYPE
    from countersign.core.saga import (
        CompensationRequest,
        EndedRollback,
        RollbackAuthorization,
        RollbackOutcome,
        SagaEntry,
    )
    from workflows.agent import (
        BOOKKEEPING_TIMEOUT,
        DB_OUTAGE_TOLERANCE,
        DB_RETRY,
        compensated,
    )


async def db(activity: str, arg: object, result_type: type | None, summary: str) -> Any:
    """A PostgreSQL activity, retried through database outages like the conversation's."""
    return await workflow.execute_activity(
        activity,
        arg,
        result_type=result_type,
        start_to_close_timeout=BOOKKEEPING_TIMEOUT,
        schedule_to_close_timeout=DB_OUTAGE_TOLERANCE,
        retry_policy=DB_RETRY,
        summary=summary,
    )


@workflow.defn(name=ROLLBACK_WORKFLOW_TYPE)
class RollbackWorkflow:
    @workflow.run
    async def run(self, rollback: EndedRollback) -> RollbackOutcome:
        refusal: str = await db(
            "authorize_rollback",
            RollbackAuthorization(
                tenant_id=rollback.tenant_id,
                workflow_id=rollback.workflow_id,
                conversation_user=rollback.conversation_user,
                request=rollback.request,
            ),
            str,
            f"authorize rollback ({rollback.request.scope}) by {rollback.request.requested_by}",
        )
        if refusal:
            return RollbackOutcome(refused=refusal)
        requests: list[CompensationRequest] = await db(
            "load_saga_entries", rollback, list[CompensationRequest], f"saga of {rollback.workflow_id}"
        )
        entries: list[SagaEntry] = []
        for request in requests:  # newest first
            if not await compensated(request):
                await db(
                    "record_compensation_failure",
                    request,
                    None,
                    f"record failed undo of {request.entry.call_id}",
                )
            entries.append(request.entry)
        return RollbackOutcome(entries=entries)
