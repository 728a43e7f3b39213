"""Alembic's entry point, run by `countersign.db.migrate` with the URL in `config.attributes`.

It uses the async engine the application uses (asyncpg; no second, sync driver to install) through
`connection.run_sync`, the standard alembic async recipe. All pending migrations run in one
transaction behind an advisory lock, so two processes upgrading at once (`dev up` and a worker
deploy, say) serialize and the second one finds nothing to do.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from countersign.db.schema import Base

MIGRATION_LOCK = text("SELECT pg_advisory_xact_lock(hashtext('countersign:migrations'))")


def run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
    with context.begin_transaction():
        connection.execute(MIGRATION_LOCK)
        context.run_migrations()


async def run_online() -> None:
    engine = create_async_engine(context.config.attributes["database_url"], poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(run_migrations)
    finally:
        await engine.dispose()


asyncio.run(run_online())
