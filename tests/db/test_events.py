"""countersign/db/events.py `publish`: the event and its NOTIFY in one statement, in the caller's
transaction; a retried event (same key) lands once and wakes nobody twice."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import session_factory
from countersign.db.events import CHANNEL, listen_dsn, publish
from countersign.db.schema import ConversationEvent


async def test_an_event_is_written_once_and_told_at_commit(database_url: str, db_engine: AsyncEngine) -> None:
    workflow_id, instance = f"events-{uuid.uuid4()}", str(uuid.uuid4())
    told: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(listen_dsn(database_url))
    await listener.add_listener(CHANNEL, lambda _c, _p, _ch, payload: told.put_nowait(payload))
    sessions = session_factory(db_engine)
    try:
        async with sessions() as session, session.begin():
            first = await publish(session, workflow_id, instance, "acme", "turn", {"turn": 1}, "turn:1")
            again = await publish(session, workflow_id, instance, "acme", "turn", {"turn": 1}, "turn:1")
            await asyncio.sleep(0.2)
            assert told.empty()  # NOTIFY is delivered at commit, not before
        async with sessions() as session, session.begin():  # a retried activity's attempt
            retried = await publish(session, workflow_id, instance, "acme", "turn", {"turn": 1}, "turn:1")
            delta = await publish(session, workflow_id, instance, "acme", "delta", {"text": "hi"})
        assert isinstance(first, int) and again is None and retried is None
        assert isinstance(delta, int) and delta > first
        assert await asyncio.wait_for(told.get(), 5) == workflow_id
        assert await asyncio.wait_for(told.get(), 5) == workflow_id  # the second transaction's
        await asyncio.sleep(0.2)
        assert told.empty()  # a NOTIFY per transaction that inserted (PostgreSQL folds repeats)
    finally:
        await listener.close()
    async with sessions() as session:
        rows = await session.scalar(select(func.count()).where(ConversationEvent.workflow_id == workflow_id))
    assert rows == 2


async def test_an_event_rolled_back_is_neither_kept_nor_told(
    database_url: str, db_engine: AsyncEngine
) -> None:
    workflow_id = f"events-{uuid.uuid4()}"
    told: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(listen_dsn(database_url))
    await listener.add_listener(CHANNEL, lambda _c, _p, _ch, payload: told.put_nowait(payload))
    try:
        async with session_factory(db_engine)() as session:
            await session.begin()
            assert await publish(session, workflow_id, "i", "acme", "turn", {}, "turn:1") is not None
            await session.rollback()
        await asyncio.sleep(0.3)
        assert told.empty()
    finally:
        await listener.close()


async def test_an_event_and_its_notify_are_one_round_trip(db_engine: AsyncEngine) -> None:
    statements: list[str] = []

    def executed(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    async with session_factory(db_engine)() as session, session.begin():
        await session.scalar(select(1))  # the transaction's BEGIN is behind us
        event.listen(db_engine.sync_engine, "before_cursor_execute", executed)
        try:
            await publish(session, f"events-{uuid.uuid4()}", "i", "acme", "turn", {}, "turn:1")
        finally:
            event.remove(db_engine.sync_engine, "before_cursor_execute", executed)
    assert len(statements) == 1 and "pg_notify" in statements[0]
