"""Client side of conversations that may have ended: the transcript from the conversation store,
a rollback through the short ConversationRollback workflow, a tenant's tokens of the day.

A running conversation answers queries and signals itself; an ended one takes no signal, and its
messages and saga are in PostgreSQL anyway.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from countersign.core.calls import stored_at
from countersign.core.contract import ROLLBACK_WORKFLOW_TYPE, StartConversation, StatusView
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackAuthorization, RollbackOutcome, RollbackRequest
from countersign.db.engine import create_engine, session_factory
from countersign.db.messages import ConversationStore
from countersign.runtime.config import Settings


async def with_store(settings: Settings, work: Any) -> Any:
    if not settings.database_url:
        raise RuntimeError("no DATABASE_URL: run `python starter.py dev up` or set DATABASE_URL")
    engine = create_engine(settings.database_url, pool_size=1, max_overflow=0)
    try:
        return await work(ConversationStore(session_factory(engine)))
    finally:
        await engine.dispose()


async def stored_transcript(settings: Settings, workflow_id: str) -> list[ChatMessage]:
    """Every message of the conversation (the latest instance under `workflow_id`), all runs, in
    order (empty for one from before the store)."""
    messages: list[ChatMessage] = await with_store(settings, lambda s: s.latest(workflow_id))
    return messages


async def with_stored_results(
    settings: Settings, workflow_id: str, messages: list[ChatMessage]
) -> list[ChatMessage]:
    """`messages` from the `transcript` query with each tool result it shows only the envelope of
    (`stored_at`: the body never entered workflow history) read from the conversation store. As
    they are without a DATABASE_URL."""
    seqs = [seq for m in messages if m.role == "tool" and (seq := stored_at(m.content)) is not None]
    if not seqs or not settings.database_url:
        return messages

    async def read(store: ConversationStore) -> dict[int, ChatMessage]:
        return await store.at(workflow_id, await store.latest_instance(workflow_id), seqs)

    stored: dict[int, ChatMessage] = await with_store(settings, read)
    return [stored.get(stored_at(m.content) or -1, m) if m.role == "tool" else m for m in messages]


async def full_transcript(client: Client, settings: Settings, workflow_id: str) -> list[ChatMessage]:
    """The whole conversation: from the store, or (a conversation from before it, no database
    configured) from the `transcript` query."""
    stored = await stored_transcript(settings, workflow_id) if settings.database_url else []
    if stored:
        return stored
    messages: list[ChatMessage] = await client.get_workflow_handle(workflow_id).query(
        "transcript", result_type=list[ChatMessage]
    )
    return messages


async def conversation_status(client: Client, settings: Settings, workflow_id: str) -> StatusView:
    """The `status` query with its state as Temporal knows it; for a conversation whose history is
    gone, what the store says.

    A run that failed, was terminated, timed out or was cancelled still answers queries, with the
    state it was in when it stopped (`running`, often): the query alone would say so forever. The
    run's status from Temporal's own record (a describe, asked alongside) overrides it: a closed
    run is `ended`, and one that did not complete says how it closed in `last_error`."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        queried, described = await asyncio.gather(
            handle.query("status", result_type=StatusView), handle.describe()
        )
        return as_temporal_knows(queried, described.status)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND or not settings.database_url:
            raise
        stored: StatusView | None = await with_store(settings, lambda s: s.latest_status(workflow_id))
        if stored is None:
            raise
        return stored


def as_temporal_knows(status: StatusView, run: WorkflowExecutionStatus | None) -> StatusView:
    """`status` (a query's answer) corrected by the run's status in Temporal's record."""
    if run in (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW):
        return status  # still running (or, for a moment, handing over to its next run)
    if run == WorkflowExecutionStatus.COMPLETED:
        return status.model_copy(update={"state": "ended"})
    how = run.name.lower().replace("_", " ")
    return status.model_copy(update={"state": "ended", "last_error": status.last_error or f"the run {how}"})


async def tokens_today(settings: Settings, tenant_id: str) -> tuple[int, int | None]:
    used: tuple[int, int | None] = await with_store(settings, lambda s: s.tokens_today(tenant_id))
    return used


async def has_ended(client: Client, workflow_id: str) -> bool:
    """Whether the conversation no longer runs (its history may be gone too)."""
    try:
        status = (await client.get_workflow_handle(workflow_id).describe()).status
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return True
        raise
    return status != WorkflowExecutionStatus.RUNNING


async def started_with(client: Client, workflow_id: str) -> StartConversation:
    """The latest run's input: who the conversation belongs to."""
    handle = client.get_workflow_handle(workflow_id)
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        [start] = await client.data_converter.decode(payloads, [StartConversation])
        return start  # type: ignore[no-any-return]
    raise LookupError(f"no history for {workflow_id}")


async def owner(client: Client, settings: Settings, workflow_id: str) -> tuple[str, str]:
    """Whose conversation it is: from its latest run's input, or from the store once its history
    is gone (past the namespace's retention)."""
    try:
        start = await started_with(client, workflow_id)
        return start.tenant_id, start.user_id
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND or not settings.database_url:
            raise
        stored: tuple[str, str] | None = await with_store(settings, lambda s: s.latest_owner(workflow_id))
        if stored is None:
            raise LookupError(f"no conversation {workflow_id} in Temporal or in the store") from err
        return stored


async def roll_back_ended(
    client: Client, settings: Settings, workflow_id: str, request: RollbackRequest
) -> RollbackOutcome:
    """Run `request` on an ended conversation through a ConversationRollback workflow."""
    tenant_id, user_id = await owner(client, settings, workflow_id)
    instance: str = (
        await with_store(settings, lambda s: s.latest_instance(workflow_id)) if settings.database_url else ""
    )
    rollback = RollbackAuthorization(
        tenant_id=tenant_id,
        workflow_id=workflow_id,
        conversation_id=instance,
        conversation_user=user_id,
        request=request,
    )
    outcome: RollbackOutcome = await client.execute_workflow(
        ROLLBACK_WORKFLOW_TYPE,
        rollback,
        id=f"{workflow_id}-rollback-{uuid.uuid4().hex[:8]}",
        task_queue=settings.task_queue,
        result_type=RollbackOutcome,
    )
    return outcome
