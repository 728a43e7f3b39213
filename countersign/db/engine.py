"""The async engine and session factory the worker, the CLI and the tests share."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from countersign.core.bounds import dumps_storable


def create_engine(url: str, *, pool_size: int = 10, max_overflow: int = 10) -> AsyncEngine:
    """An asyncpg engine sized for one worker's concurrent activities.

    A pooled connection the server closed (`dev down` / `dev up`, a restart, a failover) is
    replaced when it is checked out (`refuse_closed`), so the pool survives a restart of
    PostgreSQL without failing the first activity of each stale connection. `application_name`
    shows the worker's connections in `pg_stat_activity`. Every JSON column is written through
    `dumps_storable`: NaN, infinities, NUL and lone surrogates, which jsonb refuses, cannot fail
    an insert, whichever code path or outside value brought them.
    """
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_recycle=1800,
        json_serializer=dumps_storable,
        connect_args={"server_settings": {"application_name": "countersign"}},
    )
    event.listen(engine.sync_engine, "checkout", refuse_closed)
    return engine


def refuse_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Pool `checkout` hook: a connection whose server went away is discarded (the pool then
    checks out another, or connects anew) before anyone uses it.

    The server closes every connection when it stops, and asyncpg notices the socket closing at
    once (the worker's event loop reads every connection), so asking the driver costs nothing.
    `pool_pre_ping`, which did this before, asks the server on every checkout instead: BEGIN, an
    empty statement and ROLLBACK, three round trips and a transaction per checkout, three
    checkouts per agent step (issue 25)."""
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("the server closed this pooled connection")


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions whose objects stay readable after commit: activities build results from them then."""
    return async_sessionmaker(engine, expire_on_commit=False)
