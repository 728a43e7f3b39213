"""Rollbacks: the saga's compensations, run newest first, none silently dropped.

Each write a turn commits is registered in the saga (countersign.core.saga) before it runs. A rollback
(the `rollback` signal, authorized by `authorize_rollback`), a cancelled conversation, or an atomic
turn with a failed write undoes the chosen entries through `compensate_call`, which undoes each call
at most once and refuses to overwrite a later human change. A compensation that fails for good is
recorded (`record_compensation_failure`) and the rest still run. `compensated` is shared with
ConversationRollback (workflows/rollback.py), which undoes an ended conversation.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import (
        AUTHORIZE_ROLLBACK,
        COMPENSATE_CALL,
        RECORD_COMPENSATION_FAILURE,
    )
    from countersign.core.messages import ChatMessage
    from countersign.core.saga import (
        CompensationRequest,
        RollbackAuthorization,
        RollbackRequest,
        SagaEntry,
    )

from workflows.conversation import Conversation
from workflows.messages import MessageStore
from workflows.options import (
    DB_OUTAGE_TOLERANCE,
    DB_RETRY,
    HEARTBEAT_TIMEOUT,
    TOOL_CALL_TIMEOUT,
    bookkeeping,
    execute,
)
from workflows.rules import call_summary, error_text


async def compensated(request: CompensationRequest) -> bool:
    """Run one compensation and set its entry's state: False when it failed for good (the entry
    then holds the error, for the failure record)."""
    entry = request.entry
    try:
        outcome = await execute(
            COMPENSATE_CALL,
            request,
            start_to_close_timeout=TOOL_CALL_TIMEOUT,
            schedule_to_close_timeout=DB_OUTAGE_TOLERANCE,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=DB_RETRY,
            summary=f"undo {call_summary(entry.tool, entry.arguments)} ({entry.call_id})",
        )
    except ActivityError as err:
        entry.state = "failed"
        entry.error = error_text(err)
        return False
    entry.state = outcome.state
    return True


async def record_failure(request: CompensationRequest) -> None:
    try:
        await bookkeeping(
            RECORD_COMPENSATION_FAILURE,
            request,
            f"record failed undo of {request.entry.call_id}",
            local=False,
        )
    except ActivityError:
        workflow.logger.error("could not record the failed compensation of %s", request.entry.call_id)


class Rollbacks:
    def __init__(self, conversation: Conversation, store: MessageStore) -> None:
        self.conversation = conversation
        self.store = store
        self.requested: list[RollbackRequest] = []  # authorized, not yet run

    async def request(self, request: RollbackRequest) -> None:
        """Queue `request` once the database says its requester may roll back; refused, it is
        logged (and recorded by the activity). Unreachable, the database refuses: never a failed workflow."""
        conversation = self.conversation
        conversation.authorizing += 1
        try:
            refusal = await bookkeeping(
                AUTHORIZE_ROLLBACK,
                RollbackAuthorization.at(
                    conversation.ref(),
                    conversation_user=conversation.start.user_id,
                    request=request,
                ),
                f"authorize rollback ({request.scope}) by {request.requested_by}",
                local=False,
            )
            if refusal:
                workflow.logger.warning("rollback refused: %s", refusal)
            else:
                self.requested.append(request)
        except ActivityError as err:
            workflow.logger.error("rollback by %s not authorized: %s", request.requested_by, err.cause or err)
        finally:
            conversation.authorizing -= 1

    async def run_requested(self) -> None:
        """Run every accepted rollback, after those still being authorized: a rollback sent just
        before `end` (or before continue-as-new) is accepted and runs, never dropped."""
        await workflow.wait_condition(lambda: self.conversation.authorizing == 0)
        while self.requested:
            request = self.requested.pop(0)
            scope = f"{request.scope} {request.call_id or ''}".strip()
            undo = self.conversation.saga.to_undo(request.scope, self.conversation.turn, request.call_id)
            await self.compensate(undo, f"rollback ({scope}) by {request.requested_by}")

    async def compensate(self, entries: list[SagaEntry], why: str) -> None:
        """Undo `entries` in the order given (newest first), then tell the model what was undone."""
        if not entries:
            return
        conversation = self.conversation
        conversation.rolling_back = True
        conversation.refresh_state()
        caller = conversation.caller()
        for entry in entries:
            request = CompensationRequest(
                caller=caller,
                workflow_id=conversation.workflow_id,
                conversation_id=conversation.conversation_id,
                entry=entry,
            )
            if not await compensated(request):
                await record_failure(request)
        conversation.rolling_back = False
        undone = ", ".join(f"{e.call_id} {e.tool}: {e.state}" for e in entries)
        await self.store.note(ChatMessage(role="system", content=f"Rolled back, {why}: {undone}."))
        conversation.refresh_state()
