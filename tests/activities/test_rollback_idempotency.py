"""`authorize_rollback` records a rollback request once, however often its activity runs (a retry
after its commit shares the attempt key: workflow id, run id, activity id)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from activities.saga import SagaActivities
from countersign.core.saga import RollbackAuthorization, RollbackRequest
from countersign.db.engine import session_factory
from countersign.db.schema import RollbackRecord
from tests.activities.test_decision_idempotency import environment


@pytest.fixture
async def workflow_id(db_engine: AsyncEngine) -> AsyncIterator[str]:
    workflow_id = f"conv-acme-rb-{uuid.uuid4().hex[:12]}"
    yield workflow_id
    async with db_engine.begin() as conn:
        await conn.execute(delete(RollbackRecord).where(RollbackRecord.workflow_id == workflow_id))


def authorization(workflow_id: str, requested_by: str) -> RollbackAuthorization:
    return RollbackAuthorization(
        tenant_id="acme",
        workflow_id=workflow_id,
        conversation_user="alice",
        request=RollbackRequest(requested_by=requested_by, scope="turn", reason="undo"),
    )


async def recorded(engine: AsyncEngine, workflow_id: str) -> list[tuple[str, bool]]:
    async with engine.connect() as conn:
        query = select(RollbackRecord.requested_by, RollbackRecord.accepted)
        rows = await conn.execute(query.where(RollbackRecord.workflow_id == workflow_id))
        return [(r.requested_by, r.accepted) for r in rows]


@pytest.mark.parametrize(("requester", "answer"), [("alice", ""), ("bob", "may not roll back")])
async def test_a_retried_authorization_records_the_request_once(
    db_engine: AsyncEngine, workflow_id: str, requester: str, answer: str
) -> None:
    saga = SagaActivities(session_factory(db_engine))
    auth = authorization(workflow_id, requester)
    env = environment(workflow_id, activity_id="4")
    first = await env.run(saga.authorize_rollback, auth)
    again = await env.run(saga.authorize_rollback, auth)  # the retry after a lost completion
    assert first == again and answer in first and (answer or first == "")
    assert await recorded(db_engine, workflow_id) == [(requester, answer == "")]


async def test_concurrent_attempts_record_once_and_distinct_requests_each(
    db_engine: AsyncEngine, workflow_id: str
) -> None:
    saga = SagaActivities(session_factory(db_engine))
    auth = authorization(workflow_id, "alice")
    env = environment(workflow_id, activity_id="4")
    answers = await asyncio.gather(*(env.run(saga.authorize_rollback, auth) for _ in range(4)))
    assert answers == ["", "", "", ""]
    await environment(workflow_id, activity_id="9").run(saga.authorize_rollback, auth)  # a second request
    assert await recorded(db_engine, workflow_id) == [("alice", True), ("alice", True)]
