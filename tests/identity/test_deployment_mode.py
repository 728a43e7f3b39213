"""The authentication mode belongs to the deployment: recorded in PostgreSQL, read by every worker
when it starts; a worker configured for another mode refuses to start (real PostgreSQL, the real
`worker.py` as a subprocess)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import session_factory
from countersign.identity.mode import ModeMismatch, record_mode, recorded_mode, settle
from countersign.runtime.config import PROJECT_ROOT, load_settings


def test_a_worker_runs_the_deployments_mode_and_may_only_agree_with_it() -> None:
    assert settle(None, "signed") == "signed"  # no variable: the deployment's
    assert settle("signed", "signed") == "signed"
    assert settle(None, None) == settle("names", None) == "names"
    with pytest.raises(ModeMismatch, match="refusing to start"):
        settle("names", "signed")


def test_countersign_auth_is_read_and_approver_auth_still_works() -> None:
    assert load_settings({"COUNTERSIGN_AUTH": "signed"}).approver_auth == "signed"
    old = load_settings({"APPROVER_AUTH": "signed"})
    assert (old.approver_auth, old.auth_configured) == ("signed", True)
    assert load_settings({"COUNTERSIGN_AUTH": "names", "APPROVER_AUTH": "signed"}).approver_auth == "names"
    assert not load_settings({}).auth_configured


@pytest_asyncio.fixture
async def deployment_signed(db_engine: AsyncEngine) -> AsyncIterator[None]:
    sessions = session_factory(db_engine)
    async with sessions.begin() as session:
        before = await recorded_mode(session)
        assert await record_mode(session, "signed") == "signed"
    yield
    async with sessions.begin() as session:
        await record_mode(session, before or "names")


async def test_a_worker_configured_otherwise_refuses_to_start(
    database_url: str, db_engine: AsyncEngine, deployment_signed: None
) -> None:
    async with session_factory(db_engine)() as session:
        assert await recorded_mode(session) == "signed"
        assert await record_mode(session, None) == "signed"  # `db upgrade` without a variable keeps it
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "COUNTERSIGN_AUTH": "names",
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "worker.py"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "configured for COUNTERSIGN_AUTH=names, but the deployment runs signed" in done.stderr
