"""Audit rows written once per activity invocation, however often it runs.

A retry after a commit whose completion was lost, or a local activity run again when its workflow
task is replayed after a worker crash, is the same invocation: it has the same workflow id, run id
and activity id. Rows keyed by that (`attempt_key`, unique) are inserted once; a re-run, or a
concurrent twin, reads the first run's row and answers from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute
from temporalio import activity
from temporalio.exceptions import ApplicationError

from countersign.db.schema import Base

Row = TypeVar("Row", bound=Base)
Key = InstrumentedAttribute[str | None]


def attempt_key() -> str:
    """This activity invocation's identity: the same on its retries and when a replayed workflow task
    runs a local activity again (workflow id, run id and the activity id the workflow's command
    sequence assigns), distinct for every other invocation."""
    info = activity.info()
    return f"{info.workflow_id}:{info.workflow_run_id}:{info.activity_id}"


async def recorded(session: AsyncSession, model: type[Row], column: Key, key: str) -> Row | None:
    row: Row | None = await session.scalar(select(model).where(column == key))
    return row


async def record_once(
    session: AsyncSession,
    model: type[Row],
    column: Key,
    key: str,
    values: Callable[[], Awaitable[dict[str, Any]]],
) -> Row:
    """The `model` row whose attempt key (`column`) is `key`: the one an earlier run wrote, or a new
    one of `values()` (only computed when there is none). Call inside the session's transaction."""
    row = await recorded(session, model, column, key)
    if row is not None:
        return row
    inserted = await session.scalars(
        insert(model)
        .values(**await values(), **{column.key: key})
        # a concurrent twin waits for the other to commit, then inserts nothing and reads its row
        .on_conflict_do_nothing(index_elements=[column])
        .returning(model)
    )
    row = inserted.one_or_none() or await recorded(session, model, column, key)
    if row is None:  # the twin rolled back after all: let the retry decide
        raise ApplicationError(f"attempt {key} vanished while it was being recorded")
    return row
