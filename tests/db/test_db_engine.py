"""The engine's pool outlives a PostgreSQL restart without a round trip per checkout.

`pool_pre_ping` asked the server on every checkout (BEGIN, an empty statement, ROLLBACK); the
`refuse_closed` checkout hook asks asyncpg whether the server closed the connection instead.
This PostgreSQL is the test's own: it is stopped and started again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import create_engine, refuse_closed
from countersign.devstack.postgres import EmbeddedPostgres
from countersign.runtime.ports import free_port


async def one(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int((await connection.execute(text("SELECT 1"))).scalar_one())


async def test_a_pooled_connection_the_server_closed_is_replaced_at_checkout(tmp_path: Path) -> None:
    server = EmbeddedPostgres(data_dir=tmp_path, port=free_port())
    await asyncio.to_thread(server.start)
    engine = create_engine(server.url("postgres"), pool_size=1, max_overflow=0)
    bare = create_engine(server.url("postgres"), pool_size=1, max_overflow=0)
    event.remove(bare.sync_engine, "checkout", refuse_closed)
    try:
        assert await one(engine) == 1 and await one(bare) == 1  # one pooled connection each
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start)
        assert await one(engine) == 1  # the closed connection was replaced, nothing failed
        failed = None
        try:
            await one(bare)
        except Exception as exc:  # without the hook the stale connection reaches the caller
            failed = exc
        assert failed is not None
    finally:
        await engine.dispose()
        await bare.dispose()
        await asyncio.to_thread(server.stop)
