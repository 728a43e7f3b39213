"""An MCP tool's plan is its call normalized by its schema (issue 48): a policy on `context.args`
judges that one spelling, through the real worker, Temporal, PostgreSQL and the HTTP MCP server
(tests/fixtures/mcp_http_server.py): `{"n": 3.0}` is the integer 3 its schema declares."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.agent import AgentHarness
from tests.fixtures.mcp import HttpServer, http_config, register
from tests.fixtures.policies import ApplyPolicies
from tests.mcp.test_mcp import call, results

NOT_THREE = """@id("not-three")
forbid(principal, action, resource) when { context.args has n && context.args.n == 3 };"""


async def test_a_policy_judges_an_mcp_call_as_its_schema_normalizes_it(
    mcp_agent: tuple[AgentHarness, str],
    db_engine: AsyncEngine,
    http_server: HttpServer,
    policies: ApplyPolicies,
) -> None:
    harness, agent = mcp_agent
    await register(db_engine, http_config(agent, http_server), big="always_allow")
    await policies(NOT_THREE)
    harness.script(
        {"when": {"user_contains": "go"}, "reply": call("mcp__web__big", n=3.0)},
        {"when": {"after_tool": "mcp__web__big", "turn_calls": 1}, "reply": call("mcp__web__big", n=4.0)},
        {"when": {"after_tool": "mcp__web__big"}, "reply": {"content": "done"}},
    )
    handle = await harness.start("go", agent=agent, single_turn=True)
    await handle.result()
    got = results(await harness.transcript(handle))
    assert got["c1"]["error"]["code"] == "FORBIDDEN" and "not-three" in got["c1"]["error"]["message"], got
    assert got["c2"]["ok"] and got["c2"]["data"]["result"] == {"result": "xxxx"}, got  # another number runs
