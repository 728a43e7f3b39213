"""`starter.py login`, then `approve` with APPROVER_AUTH=signed: the CLI decides through the inbox
with its session, as a subprocess against the real dev server, worker and inbox."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ApprovalDecision
from tests.fixtures.approvals import ECHO_RESULT, pending, qualify
from tests.fixtures.cli import run_starter
from tests.fixtures.inbox import SignedStack

pytestmark = pytest.mark.devserver


async def starter(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await run_starter(*args, env=env)


async def test_login_then_approve_goes_through_the_inbox_with_a_proof(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, tmp_path: Path, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    handle = await stack.agent.start("qualify jane", single_turn=True)
    await pending(handle)
    env = {
        **os.environ,
        "APPROVER_AUTH": "signed",
        "COUNTERSIGN_SESSION_FILE": str(tmp_path / "session.json"),
        "TEMPORAL_ADDRESS": stack.agent.settings.temporal_address,
        "DATABASE_URL": stack.agent.settings.database_url or "",
    }
    not_yet = await starter(env, "approve", handle.id, "c1", "--as", "bob")
    assert not_yet.returncode != 0 and "log in first" in not_yet.stderr
    wrong = await starter(
        env, "login", "--tenant", "acme", "--as", "bob", "--password", "x", "--inbox", stack.url
    )
    assert wrong.returncode != 0 and "wrong password" in wrong.stderr
    login = await starter(
        env, "login", "--tenant", "acme", "--as", "bob", "--password", "bob-dev", "--inbox", stack.url
    )
    assert login.returncode == 0, login.stderr
    assert (tmp_path / "session.json").stat().st_mode & 0o077 == 0
    impostor = await starter(env, "approve", handle.id, "c1", "--as", "carol")
    assert impostor.returncode != 0 and "logged in as bob" in impostor.stderr
    approved = await starter(env, "approve", handle.id, "c1", "--as", "bob", "--reason", "fine")
    assert approved.returncode == 0, approved.stderr
    assert "approved c1: update_lead_status by bob (proven)" in approved.stdout
    await handle.result()
    async with db_engine.connect() as conn:
        rows = list(
            await conn.execute(select(ApprovalDecision).where(ApprovalDecision.workflow_id == handle.id))
        )
    assert [(r.approver, r.accepted, r.proven, r.reason) for r in rows] == [("bob", True, True, "fine")]
