"""Ratings of replies, summed: `starter.py stats` (text and `--json`, through the real CLI) per agent
and per tool the rated turn called, and the worker's metrics endpoint
(`countersign_reply_ratings_total{agent, rating}`), against known ratings in the real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest_asyncio
from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import session_factory
from countersign.db.ratings import rating_totals
from countersign.db.schema import ReplyRating, Tenant, User
from countersign.observability.metrics import CountersignMetrics, MetricsServer
from countersign.runtime.ports import free_port
from tests.observability.test_stats import stats

# (agent, turn, rating, tools the turn called, age)
RATED = [
    ("lead-qualifier", 1, "helpful", ["search_leads"], timedelta(0)),
    ("lead-qualifier", 2, "not_helpful", ["search_leads", "update_lead_status"], timedelta(0)),
    ("lead-qualifier", 3, "helpful", [], timedelta(0)),
    ("operations", 1, "not_helpful", ["create_task"], timedelta(0)),
    ("operations", 2, "helpful", ["create_task"], timedelta(days=3)),  # outside --since 24h
]


@pytest_asyncio.fixture
async def rated(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """A tenant of its own with a user who rated the replies above, committed."""
    tenant = f"rated-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    async with db_engine.begin() as conn:
        await conn.execute(insert(Tenant).values(id=tenant, name=tenant))
        await conn.execute(
            insert(User).values(tenant_id=tenant, id="rita", display_name="Rita", email="rita@example.com")
        )
        await conn.execute(
            insert(ReplyRating),
            [
                {
                    "tenant_id": tenant,
                    "workflow_id": f"w-{agent}",
                    "conversation_id": "run",
                    "turn": turn,
                    "reply_seq": turn * 3,
                    "agent": agent,
                    "user_id": "rita",
                    "rating": rating,
                    "rated_via": "session",
                    "tools": tools,
                    "created_at": now - age,
                    "updated_at": now - age,
                }
                for agent, turn, rating, tools, age in RATED
            ],
        )
    yield tenant
    async with db_engine.begin() as conn:
        await conn.execute(delete(ReplyRating).where(ReplyRating.tenant_id == tenant))
        await conn.execute(delete(User).where(User.tenant_id == tenant))
        await conn.execute(delete(Tenant).where(Tenant.id == tenant))


async def test_stats_sum_ratings_per_agent_and_per_tool_the_turn_called(
    rated: str, database_url: str, tmp_path: Path
) -> None:
    code, out = await stats(database_url, tmp_path, "--tenant", rated, "--since", "24h", "--json")
    assert code == 0, out
    summary = json.loads(out)
    agents = {a["agent"]: (a["rated_helpful"], a["rated_not_helpful"]) for a in summary["agents"]}
    assert agents == {"lead-qualifier": (2, 1), "operations": (0, 1)}, agents
    tools = {t["tool"]: (t["rated_helpful"], t["rated_not_helpful"], t["calls"]) for t in summary["tools"]}
    assert tools == {"search_leads": (1, 1, 0), "update_lead_status": (0, 1, 0), "create_task": (0, 1, 0)}
    code, out = await stats(database_url, tmp_path, "--tenant", rated, "--since", "7d")
    assert code == 0, out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("AGENT")).split()
    row = next(line for line in lines if line.startswith("operations")).split()
    assert dict(zip(header, row, strict=True))["HELPFUL"] == "1"  # the older rating is in the window
    assert dict(zip(header, row, strict=True))["NOT_HELPFUL"] == "1"
    tool_header = next(line for line in lines if line.startswith("TOOL")).split()
    assert tool_header[-2:] == ["HELPFUL", "NOT_HELPFUL"], tool_header


async def test_the_metrics_endpoint_counts_the_ratings_per_agent(rated: str, db_engine: AsyncEngine) -> None:
    metrics = CountersignMetrics(tenant_label=True)
    metrics.watch_ratings(lambda: rating_totals(session_factory(db_engine)))
    server = MetricsServer(metrics, f"http://127.0.0.1:{free_port()}/metrics", "127.0.0.1", 0)
    port = await server.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    finally:
        await server.stop()
    mine = sorted(
        line
        for line in text.splitlines()
        if line.startswith("countersign_reply_ratings_total{") and rated in line
    )
    name = "countersign_reply_ratings_total"
    assert mine == [
        f'{name}{{agent="lead-qualifier",rating="helpful",tenant="{rated}"}} 2.0',
        f'{name}{{agent="lead-qualifier",rating="not_helpful",tenant="{rated}"}} 1.0',
        f'{name}{{agent="operations",rating="helpful",tenant="{rated}"}} 1.0',
        f'{name}{{agent="operations",rating="not_helpful",tenant="{rated}"}} 1.0',
    ], mine
