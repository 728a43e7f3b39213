"""ConversationRollback: `rollback` of a conversation that has ended, as a short workflow.

An ended AgentWorkflow takes no signal, so its saga is read from PostgreSQL (`saga_entries`,
`compensations`) and undone by the same activities with the same guarantees as a live rollback:
authorized and audited by `authorize_rollback`, each call undone at most once by `compensate_call`
(which also refuses to overwrite a later human change), a failed compensation recorded, not dropped.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import (
        AUTHORIZE_ROLLBACK,
        LOAD_SAGA_ENTRIES,
        RECORD_COMPENSATION_FAILURE,
    )
    from countersign.core.contract import ROLLBACK_WORKFLOW_TYPE
    from countersign.core.saga import (
        EndedRollback,
        RollbackAuthorization,
        RollbackOutcome,
        SagaEntry,
    )

from workflows.compensation import compensated
from workflows.options import bookkeeping


@workflow.defn(name=ROLLBACK_WORKFLOW_TYPE)
class RollbackWorkflow:
    @workflow.run
    async def run(self, rollback: EndedRollback) -> RollbackOutcome:
        refusal = await bookkeeping(
            AUTHORIZE_ROLLBACK,
            RollbackAuthorization.at(
                rollback,
                conversation_user=rollback.conversation_user,
                request=rollback.request,
            ),
            f"authorize rollback ({rollback.request.scope}) by {rollback.request.requested_by}",
            local=False,
        )
        if refusal:
            return RollbackOutcome(refused=refusal)
        requests = await bookkeeping(
            LOAD_SAGA_ENTRIES, rollback, f"saga of {rollback.workflow_id}", local=False
        )
        entries: list[SagaEntry] = []
        for request in requests:  # newest first
            if not await compensated(request):
                await bookkeeping(
                    RECORD_COMPENSATION_FAILURE,
                    request,
                    f"record failed undo of {request.entry.call_id}",
                    local=False,
                )
            entries.append(request.entry)
        return RollbackOutcome(entries=entries)
