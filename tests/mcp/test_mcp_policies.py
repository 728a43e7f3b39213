"""Issue 50 item 1: a tenant's policies with an MCP server registered, against the real
`mcp-server-time`. On main, `mcp add` kept the listing without the tools' input schemas, so every
`policy show|apply|test` and the policies API failed on `1 validation error for ListedTool`; now the
listing keeps them, a set naming `mcp__time__convert_time` and its arguments is checked against
them, and a forbid on one argument value refuses exactly those calls."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import AgentProfile, AgentToolPermission, McpServer, TenantPolicy, ToolExecution
from tests.fixtures.agent import AgentHarness
from tests.fixtures.cli import run_starter
from tests.fixtures.inbox import SignedStack
from tests.fixtures.mcp import BIN

CONVERT = "mcp__time__convert_time"
NOT_FROM_PARIS = f"""
@id("not-from-paris")
forbid(principal, action == Countersign::Action::"{CONVERT}", resource)
when {{ context.args.source_timezone == "Europe/Paris" }};
"""


async def starter(database_url: str, *args: str) -> Any:
    return await run_starter(*args, env={"DATABASE_URL": database_url})


async def add_time_server(database_url: str, db_engine: AsyncEngine, agent: str) -> None:
    """`mcp add time` for `agent` in acme, as an operator does (it lists the server's tools), and
    its convert_time allowed without approval, so that only a policy can stop a call of it."""
    added = await starter(
        database_url, "mcp", "add", "time", "--command", str(BIN / "mcp-server-time"),
        "--agent", agent, "--tenant", "acme",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    async with db_engine.begin() as conn:
        await conn.execute(
            insert(AgentToolPermission)
            .values(agent=agent, tool=CONVERT, tier="always_allow")
            .on_conflict_do_update(index_elements=["agent", "tool"], set_={"tier": "always_allow"})
        )


@pytest_asyncio.fixture
async def time_agent(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """An agent of its own for the time server; the server, the agent and acme's sets removed after."""
    agent = f"mcp-{uuid.uuid4().hex[:8]}"
    async with db_engine.begin() as conn:
        await conn.execute(insert(AgentProfile).values(name=agent, system_prompt="You use MCP tools."))
    yield agent
    async with db_engine.begin() as conn:
        await conn.execute(delete(TenantPolicy).where(TenantPolicy.tenant_id == "acme"))
        await conn.execute(delete(McpServer).where(McpServer.name == "time"))
        await conn.execute(delete(AgentProfile).where(AgentProfile.name == agent))


async def test_policy_commands_and_the_policies_api_work_with_an_mcp_server_registered(
    signed_agent: SignedStack, database_url: str, db_engine: AsyncEngine, time_agent: str, tmp_path: Path
) -> None:
    await add_time_server(database_url, db_engine, time_agent)
    async with db_engine.connect() as conn:
        listed = await conn.scalar(select(McpServer.tools).where(McpServer.name == "time")) or []
    assert {t["name"] for t in listed} >= {"convert_time"} and all("inputSchema" in t for t in listed)

    file = tmp_path / "time.cedar"
    file.write_text(NOT_FROM_PARIS)
    applied = await starter(database_url, "policy", "apply", str(file), "--tenant", "acme", "--as", "carol")
    assert applied.returncode == 0, applied.stderr
    shown = await starter(database_url, "policy", "show", "--tenant", "acme", "--json")
    assert shown.returncode == 0 and "not-from-paris" in json.loads(shown.stdout)["enforced"]["text"]
    tested = await starter(database_url, "policy", "test", str(file), "--tenant", "acme", "--json")
    assert tested.returncode == 0, tested.stderr
    # an argument the tool does not have is refused at apply, naming it: the schema is the tool's
    wrong = await starter(
        database_url, "policy", "apply", str(tmp_path / "wrong.cedar"), "--tenant", "acme", "--as", "carol"
    )
    assert wrong.returncode == 1
    (tmp_path / "wrong.cedar").write_text(NOT_FROM_PARIS.replace("source_timezone", "no_such_argument"))
    wrong = await starter(
        database_url, "policy", "apply", str(tmp_path / "wrong.cedar"), "--tenant", "acme", "--as", "carol"
    )
    assert wrong.returncode == 1 and "no_such_argument" in wrong.stderr

    stack = signed_agent
    carol = await stack.login("carol")
    for method, path in (
        ("POST", "/api/policies/validate"),
        ("PUT", "/api/policies"),
        ("GET", "/api/policies"),
    ):
        status, body = await stack.call(
            method, path, carol, {"text": NOT_FROM_PARIS} if method != "GET" else None
        )
        assert status == 200, (method, path, body)


def convert(source: str) -> dict[str, Any]:
    arguments = {"source_timezone": source, "time": "12:00", "target_timezone": "Asia/Tokyo"}
    return {"name": CONVERT, "arguments": arguments}


async def test_a_forbid_on_an_mcp_tools_argument_refuses_exactly_those_calls(
    mcp_agent: tuple[AgentHarness, str], database_url: str, db_engine: AsyncEngine, tmp_path: Path
) -> None:
    harness, agent = mcp_agent
    await add_time_server(database_url, db_engine, agent)
    file = tmp_path / "time.cedar"
    file.write_text(NOT_FROM_PARIS)
    applied = await starter(database_url, "policy", "apply", str(file), "--tenant", "acme", "--as", "carol")
    assert applied.returncode == 0, applied.stderr
    try:
        harness.script(
            {
                "when": {"user_contains": "convert"},
                "reply": {"tool_calls": [convert("Europe/Paris"), convert("Europe/London")]},
            },
            {"when": {"after_tool": CONVERT}, "reply": {"content": "done"}},
        )
        handle = await harness.start("convert noon", agent=agent, single_turn=True)
        await handle.result()
        got = {
            m.tool_call_id: json.loads(m.content or "")
            for m in await harness.transcript(handle)
            if m.role == "tool"
        }
        assert got["c1"]["error"]["code"] == "FORBIDDEN" and "not-from-paris" in got["c1"]["error"]["message"]
        assert got["c2"]["ok"], got["c2"]
        async with db_engine.connect() as conn:
            rows = {
                r.call_id: r
                for r in await conn.execute(
                    select(ToolExecution).where(ToolExecution.workflow_id == handle.id)
                )
            }
        assert (rows["c1"].outcome, rows["c2"].outcome) == ("blocked", "executed")
        assert rows["c1"].policy["policy"] == "not-from-paris"
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(TenantPolicy).where(TenantPolicy.tenant_id == "acme"))
