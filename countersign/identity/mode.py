"""The deployment's authentication mode: `signed` (only proofs the server minted count) or `names`
(a bare name is claimed, the embedded demo's default).

It belongs to the deployment, not to one process: `db upgrade` records it in PostgreSQL
(`deployment_settings.auth_mode`) from COUNTERSIGN_AUTH (or the older APPROVER_AUTH) when either is
set, else keeps what is recorded (`names` on a new database). Every worker reads it when it starts:
one whose own environment names another mode refuses to start, and one whose environment names
none runs the recorded mode. So a second worker started from a shell without the variable cannot
quietly accept bare names beside signed-mode workers.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.db.engine import create_engine, session_factory
from countersign.db.schema import DeploymentSetting

AuthMode = Literal["signed", "names"]
SETTING = "auth_mode"


class ModeMismatch(Exception):
    """This process is configured for another mode than the deployment's."""


async def recorded_mode(session: AsyncSession) -> AuthMode | None:
    row = await session.get(DeploymentSetting, SETTING)
    if row is None or row.value not in ("signed", "names"):
        return None
    return "signed" if row.value == "signed" else "names"


async def record_mode(session: AsyncSession, configured: AuthMode | None) -> AuthMode:
    """Record `configured` as the deployment's mode (None: keep the recorded one, `names` if none)."""
    recorded = await recorded_mode(session)
    mode: AuthMode = configured or recorded or "names"
    if mode != recorded:
        statement = insert(DeploymentSetting).values(name=SETTING, value=mode)
        await session.execute(
            statement.on_conflict_do_update(index_elements=[DeploymentSetting.name], set_={"value": mode})
        )
    return mode


def settle(configured: AuthMode | None, recorded: AuthMode | None) -> AuthMode:
    """The mode a worker runs: the deployment's. Its own configuration may only agree with it."""
    if configured is not None and recorded is not None and configured != recorded:
        raise ModeMismatch(
            f"this worker is configured for COUNTERSIGN_AUTH={configured}, but the deployment runs "
            f"{recorded} (recorded by `db upgrade` in deployment_settings): refusing to start. Unset "
            f"the variable to run the deployment's mode, or change the deployment's with "
            f"COUNTERSIGN_AUTH={configured} python starter.py db upgrade"
        )
    return recorded or configured or "names"


async def record_deployment_mode(database_url: str, configured: AuthMode | None) -> AuthMode:
    """`record_mode` on the database at `database_url` (`db upgrade`, `dev up`)."""
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    try:
        async with session_factory(engine).begin() as session:
            return await record_mode(session, configured)
    finally:
        await engine.dispose()


async def deployment_mode(database_url: str) -> AuthMode | None:
    """The recorded mode of the database at `database_url` (`dev status`, a starting worker)."""
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    try:
        async with session_factory(engine)() as session:
            return await recorded_mode(session)
    finally:
        await engine.dispose()
