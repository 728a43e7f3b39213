"""`approve … --grant-minutes M --grant-uses N`, `grants list` and `grants revoke` as subprocesses
against the real dev server, worker and PostgreSQL: in signed mode through the server with the
session `login` keeps, in names mode straight to Temporal and the database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.cli.test_inbox_cli import starter
from tests.e2e.test_asked_again import decisions
from tests.e2e.test_grants import SCRIPT, ran_and_jane_is_new_again, ran_unasked
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import pending
from tests.fixtures.inbox import SignedStack

pytestmark = pytest.mark.devserver


def runner(env: dict[str, str]) -> Any:
    async def cli(*args: str, code: int = 0) -> str:
        done = await starter(env, *args)
        assert done.returncode == code, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout if code == 0 else done.stderr

    return cli


async def test_bob_grants_lists_and_revokes_through_the_server(
    signed_dev_agent: SignedStack,
    db_engine: AsyncEngine,
    tmp_path: Path,
    jane_is_new: None,
    no_grants_left: None,
) -> None:
    stack = signed_dev_agent
    stack.agent.script(*SCRIPT)
    cli = runner({
        **stack.agent.cli_env(tmp_path),
        "COUNTERSIGN_AUTH": "signed",
        "COUNTERSIGN_SESSION_FILE": str(tmp_path / "session.json"),
    })  # fmt: skip
    handle = await stack.agent.start("qualify jane", single_turn=True)
    await pending(handle)
    await cli("login", "--tenant", "acme", "--as", "bob", "--password", "bob-dev", "--inbox", stack.url)

    too_long = await cli(
        "approve", handle.id, "c1", "--as", "bob", "--grant-minutes", "10081", "--grant-uses", "1", code=2
    )
    assert "a grant lasts 1 to 10080 minutes and 1 to 100 uses" in too_long
    half = await cli("approve", handle.id, "c1", "--as", "bob", "--grant-minutes", "30", code=2)
    assert "both --grant-minutes and --grant-uses" in half
    assert await decisions(db_engine, handle.id) == []  # nothing recorded

    approved = await cli(
        "approve", handle.id, "c1", "--as", "bob", "--grant-minutes", "30", "--grant-uses", "1"
    )
    assert "approved c1: update_lead_status by bob (proven), granted for 30 min or 1 use(s)" in approved
    (grant,) = [g for g in json.loads(await cli("grants", "list", "--tenant", "acme", "--json"))
                if g["workflow_id"] == handle.id]  # fmt: skip
    assert (grant["state"], grant["uses_left"], grant["approver"], grant["requester"]) == (
        "live",
        1,
        "bob",
        "alice",
    )

    await ran_and_jane_is_new_again(stack, db_engine, handle.id)  # the approved change is possible again
    used = await ran_unasked(stack, db_engine, "qualify jane again")
    assert used.grant_id == grant["id"]
    listed = await cli("grants", "list", "--tenant", "acme")
    assert "used up" in listed and "update_lead_status" in listed

    refused = await cli("grants", "revoke", str(grant["id"]), "--as", "carol", code=1)
    assert "logged in as bob" in refused  # the session's person revokes, nobody else
    revoked = await cli("grants", "revoke", str(grant["id"]), "--as", "bob")
    assert f"revoked grant {grant['id']} (update_lead_status for alice) by bob" in revoked


async def test_in_names_mode_approvals_approve_grants_and_an_admin_revokes(
    dev_agent: AgentHarness, db_engine: AsyncEngine, tmp_path: Path, jane_is_new: None, no_grants_left: None
) -> None:
    dev_agent.script(*SCRIPT)
    cli = runner({**dev_agent.cli_env(tmp_path), "APPROVER_AUTH": "names"})
    handle = await dev_agent.start("qualify jane", single_turn=True)
    await pending(handle)
    out = await cli(
        "approvals", "approve", handle.id, "c1", "--as", "bob", "--grant-minutes", "60", "--grant-uses", "5"
    )
    assert "approved c1: update_lead_status by bob, granted for 60 min or 5 use(s)" in out
    await handle.result()
    (grant,) = [g for g in json.loads(await cli("grants", "list", "--tenant", "acme", "--json"))
                if g["workflow_id"] == handle.id]  # fmt: skip

    refused = await cli("grants", "revoke", str(grant["id"]), "--as", "alice", code=1)
    assert "alice may not revoke a grant bob made" in refused
    assert "revoked grant" in await cli("grants", "revoke", str(grant["id"]), "--as", "carol")
    again = await dev_agent.start("qualify jane", single_turn=True)
    assert (await pending(again)).pending_approvals[0].tool == "update_lead_status"  # asked again
