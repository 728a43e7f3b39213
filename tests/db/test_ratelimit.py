"""Rate limits per tenant and tool: the refill math, the shared bucket in PostgreSQL under concurrency,
and a model that calls a tool more often than allowed seeing RATE_LIMITED."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.testing import WorkflowEnvironment

from activities.tools import ToolActivities
from countersign.core.calls import CallerContext, ToolInvocation
from countersign.db.engine import session_factory
from countersign.db.ratelimit import RateLimit, RateLimits, refill, take
from countersign.db.schema import RateLimitBucket, ToolExecution
from countersign.scripted_model.server import ScriptedModelServer
from tests.fixtures.agent import running_agent

T0 = datetime(2030, 1, 1, tzinfo=UTC)
# the worker's own limit, whatever acme's seeded one says (tests/activities/test_access.py tests those)
ONE_AT_A_TIME = RateLimits(per_tool={"search_leads": RateLimit(per_s=0.001, burst=2)}, tenant_settings=False)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("tokens", "elapsed_s", "expected"),
    [
        (0.0, 0.0, 0.0),
        (0.0, 0.5, 1.0),  # 2 tokens a second
        (1.5, 1.0, 3.5),
        (4.0, 10.0, 5.0),  # never above the burst
        (3.0, -5.0, 3.0),  # a clock that went backwards adds nothing and takes nothing
    ],
)
def test_refill(tokens: float, elapsed_s: float, expected: float) -> None:
    assert refill(tokens, T0, at(elapsed_s), rate_per_s=2.0, burst=5.0) == pytest.approx(expected)


def test_limits_per_tool_and_from_the_environment() -> None:
    limits = RateLimits.from_env({"RATE_LIMIT_PER_S": "0.5", "RATE_LIMIT_BURST": "3"})
    assert limits.of("get_lead") == RateLimit(per_s=0.5, burst=3)
    assert RateLimits.from_env({}) == RateLimits()
    assert (
        ONE_AT_A_TIME.of("search_leads").burst == 2 and ONE_AT_A_TIME.of("get_lead") == RateLimits().default
    )
    with pytest.raises(ValueError, match="per_s > 0"):
        RateLimit(per_s=0, burst=1)


@pytest_asyncio.fixture
async def tool_name(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """A tool name of this test only, whose acme bucket is removed afterwards."""
    name = f"tool-{uuid.uuid4()}"
    yield name
    async with db_engine.begin() as conn:
        await conn.execute(delete(RateLimitBucket).where(RateLimitBucket.tool == name))


async def take_at(
    engine: AsyncEngine, tool: str, now: datetime, rate: float = 0.5, burst: float = 3
) -> float | None:
    async with session_factory(engine)() as session, session.begin():
        return await take(session, "acme", tool, rate, burst, now)


async def test_a_bucket_empties_then_refills(db_engine: AsyncEngine, tool_name: str) -> None:
    assert [await take_at(db_engine, tool_name, T0) for _ in range(3)] == [None, None, None]
    assert await take_at(db_engine, tool_name, T0) == pytest.approx(2.0)  # one token at 0.5/s
    assert await take_at(db_engine, tool_name, at(1.0)) == pytest.approx(1.0)
    assert await take_at(db_engine, tool_name, at(2.0)) is None
    assert await take_at(db_engine, tool_name, at(1.0)) is not None, "an earlier clock gains nothing"


async def test_concurrent_takes_never_exceed_the_burst(db_engine: AsyncEngine, tool_name: str) -> None:
    waits = await asyncio.gather(*(take_at(db_engine, tool_name, T0, rate=1e-6, burst=4) for _ in range(12)))
    assert sum(wait is None for wait in waits) == 4
    async with db_engine.connect() as conn:
        tokens = await conn.scalar(select(RateLimitBucket.tokens).where(RateLimitBucket.tool == tool_name))
    assert tokens == pytest.approx(0.0)


@pytest_asyncio.fixture
async def search_bucket(db_engine: AsyncEngine) -> AsyncIterator[None]:
    """Empties acme's search_leads bucket afterwards, so tests with the default limit find it full."""
    yield
    async with db_engine.begin() as conn:
        await conn.execute(
            delete(RateLimitBucket).where(
                RateLimitBucket.tenant_id == "acme", RateLimitBucket.tool == "search_leads"
            )
        )


@pytest.mark.usefixtures("search_bucket")
async def test_a_retry_that_finds_its_result_takes_no_token(db_engine: AsyncEngine) -> None:
    tools = ToolActivities(session_factory(db_engine), rate_limits=ONE_AT_A_TIME)
    invocation = ToolInvocation(
        caller=CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="lead-qualifier"),
        workflow_id=f"wf-{uuid.uuid4()}",
        run_id="run-1",
        call_id="c1",
        tool="search_leads",
        arguments=json.dumps({"query": "Jane"}),
    )
    first = await tools.execute_tool(invocation)
    assert first.ok and all([await tools.execute_tool(invocation) == first for _ in range(3)])
    second_call = await tools.execute_tool(invocation.model_copy(update={"call_id": "c2"}))
    assert second_call.ok, "the second token of the burst was still there"


@pytest.mark.usefixtures("search_bucket")
async def test_the_model_sees_rate_limited(
    temporal_env: WorkflowEnvironment,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
) -> None:
    tools = ToolActivities(session_factory(db_engine), rate_limits=ONE_AT_A_TIME)
    async with running_agent(temporal_env, database_url, db_engine, scripted_model, tools) as agent:
        search = {"name": "search_leads", "arguments": {"query": "Jane"}}
        agent.script(
            {"when": {"turn_calls": 0}, "reply": {"tool_calls": [search, search, search]}},
            {"when": {"after_tool": "search_leads"}, "reply": {"content": "done"}},
        )
        handle = await agent.start("search three times", single_turn=True)
        assert (await handle.result()).last_reply == "[scripted model] done"
        transcript = await agent.transcript(handle)

    results = [json.loads(m.content or "") for m in transcript if m.role == "tool"]
    limited = [r["error"] for r in results if not r["ok"]]
    assert sum(r["ok"] for r in results) == 2 and len(limited) == 1
    assert limited[0]["code"] == "RATE_LIMITED" and "retry in 1000 s" in limited[0]["message"]
    async with db_engine.connect() as conn:
        outcomes = await conn.scalars(
            select(ToolExecution.outcome).where(ToolExecution.workflow_id == handle.id)
        )
        assert sorted(outcomes) == ["executed", "executed", "failed"]
