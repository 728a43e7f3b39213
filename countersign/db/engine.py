"""The async engine and session factory the worker, the CLI and the tests share."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from countersign.core.bounds import dumps_storable


def create_engine(url: str, *, pool_size: int = 10, max_overflow: int = 10) -> AsyncEngine:
    """An asyncpg engine sized for one worker's concurrent activities.

    `pool_pre_ping` makes the pool survive a PostgreSQL restart (`dev down` / `dev up`) without
    failing the first activity of each stale connection, and `application_name` shows the worker's
    connections in `pg_stat_activity`. Every JSON column is written through `dumps_storable`:
    NaN, infinities, NUL and lone surrogates, which jsonb refuses, cannot fail an insert, whichever
    code path or outside value brought them.
    """
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        pool_recycle=1800,
        json_serializer=dumps_storable,
        connect_args={"server_settings": {"application_name": "countersign"}},
    )


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions whose objects stay readable after commit: activities build results from them then."""
    return async_sessionmaker(engine, expire_on_commit=False)
