"""Issue 48 item 8 through the real server (signed mode, PostgreSQL, Temporal): one admin's policy
text cannot take the front door down. A set nested 3,000 parentheses deep, one nested in another
bracket kind, and a 5,000-deep `if` chain (no bracket at all) each crashed the Cedar engine inside
the server's process on main; now each is refused with 422 naming the bound, recorded, and the
server goes on answering every tenant; `policy apply|test` says the same in one line."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.policy_bounds import MAX_NESTING
from countersign.db.policies import digest
from countersign.db.schema import PolicyChange, TenantPolicy
from tests.fixtures.approvals import ECHO_RESULT, qualify
from tests.fixtures.cli import run_starter
from tests.fixtures.inbox import SignedStack

HEAD = '@id("deep") forbid(principal, action, resource) when { '
DEEP_PARENS = HEAD + "(" * 3_000 + "true" + ")" * 3_000 + " };"  # the 9 KB text of the finding
DEEP_LISTS = HEAD + "[" * 1_000 + "1" + "]" * 1_000 + " == [1] };"
DEEP_IFS = HEAD + "if true then " * 5_000 + "true" + " else false" * 5_000 + " };"  # 120 KB


@pytest.mark.parametrize("text", [DEEP_PARENS, DEEP_LISTS, DEEP_IFS], ids=["parens", "lists", "ifs"])
async def test_a_deep_policy_is_refused_and_every_tenant_is_still_served(
    signed_agent: SignedStack, db_engine: AsyncEngine, text: str
) -> None:
    stack = signed_agent
    carol, dave = await stack.login("carol"), await stack.login("dave", tenant="globex")
    for method, path in (("POST", "/api/policies/validate"), ("PUT", "/api/policies")):
        status, body = await stack.call(method, path, carol, {"text": text})
        assert status == 422, body
        assert f"nests deeper than {MAX_NESTING} levels" in body["error"], body
    async with db_engine.connect() as conn:
        reason = await conn.scalar(
            select(PolicyChange.reason)
            .where(PolicyChange.tenant_id == "acme", PolicyChange.changed_by == "carol")
            .order_by(PolicyChange.id.desc())
            .limit(1)
        )
    assert reason is not None and "nests deeper than" in reason  # the attempt is on the record
    # the same process answers the other tenant, and acme, as before
    assert (await stack.call("GET", "/api/approvals", dave))[0] == 200
    status, shown = await stack.call("GET", "/api/policies", carol)
    assert status == 200 and shown["enforced"] is None


async def test_a_policy_text_postgresql_cannot_hold_is_refused_at_the_door(signed_agent: SignedStack) -> None:
    """A fuzz finding (tests/server/test_openapi.py): `PUT /api/policies` with a NUL in the text
    answered 500, its recorded attempt failing in PostgreSQL. Now both routes refuse it as invalid."""
    carol = await signed_agent.login("carol")
    before = (await signed_agent.call("GET", "/api/policies", carol))[1]
    text = '@id("nul") forbid(principal, action, resource) when { "\x00" == "" };'
    for method, path in (("PUT", "/api/policies"), ("POST", "/api/policies/validate")):
        status, body = await signed_agent.call(method, path, carol, {"text": text})
        assert status == 422 and "invalid request: text" in body["error"], (path, body)
    status, shown = await signed_agent.call("GET", "/api/policies", carol)
    assert status == 200 and shown == before  # nothing applied, nothing half-recorded


async def test_the_cli_refuses_a_deep_policy_in_one_line(database_url: str, tmp_path: Path) -> None:
    path = tmp_path / f"{uuid.uuid4().hex}.cedar"
    path.write_text(DEEP_PARENS)
    env = {"DATABASE_URL": database_url}
    applying = ("apply", str(path), "--tenant", "acme", "--as", "carol")
    for command in (applying, ("test", str(path), "--tenant", "acme")):
        done: subprocess.CompletedProcess[str] = await run_starter("policy", *command, env=env)
        assert done.returncode == 1, (done.returncode, done.stderr[-500:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"nests deeper than {MAX_NESTING} levels" in lines[0], lines


async def test_a_set_past_the_bounds_applied_before_them_refuses_calls_and_never_reaches_the_engine(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """A set stored before the bounds existed (written here as it would have been applied): the
    worker checks the bounds before it parses an applied set, so the call is refused, naming why,
    instead of the worker's process dying at the call (on main: a segfault of the worker)."""
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    row = {"tenant_id": "acme", "mode": "enforced", "version": 1, "text": DEEP_PARENS, "applied_by": "carol"}
    async with db_engine.begin() as conn:
        await conn.execute(insert(TenantPolicy).values(**row, sha256=digest(DEEP_PARENS)))
    try:
        handle = await stack.agent.start("qualify jane", single_turn=True)
        await handle.result()
        result = json.loads(
            [m for m in await stack.agent.transcript(handle) if m.role == "tool"][-1].content or ""
        )
        assert result["error"]["code"] == "FORBIDDEN" and "cannot be loaded" in result["error"]["message"]
        assert "nests deeper than" in result["error"]["message"]
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(TenantPolicy).where(TenantPolicy.tenant_id == "acme"))
