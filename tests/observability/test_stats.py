"""`starter.py stats` against a known audit in the real PostgreSQL, through the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.db.schema import ModelCall, Tenant, ToolExecution
from countersign.observability.stats import collect, parse_duration, render
from countersign.runtime.config import PROJECT_ROOT

AGENT = "lead-qualifier"
OK = {"ok": True, "data": {}}


def failure(code: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": code.lower()}}


# (tool, outcome, result, duration_ms, approved_by, age): the audit `stats` summarises
CALLS: list[tuple[str, str, dict[str, Any], int | None, str | None, timedelta]] = [
    ("get_lead", "executed", OK, 10, None, timedelta(0)),
    ("get_lead", "executed", OK, 20, None, timedelta(0)),
    ("get_lead", "executed", {"ok": False, "needs": {"lead": True}}, 30, None, timedelta(0)),
    ("get_lead", "failed", failure("NOT_FOUND"), 100, None, timedelta(0)),
    ("get_lead", "executed", OK, 5000, None, timedelta(days=2)),  # outside --since 24h
    ("update_lead_status", "executed", OK, 50, "bob", timedelta(0)),
    ("update_lead_status", "rejected", failure("REJECTED"), None, None, timedelta(0)),
    ("update_lead_status", "expired", failure("EXPIRED"), None, None, timedelta(0)),
]
# (workflow, turn, prompt tokens, completion tokens)
MODEL_CALLS = [("w1", 1, 100, 10), ("w1", 1, 120, 5), ("w1", 2, 200, 20), ("w2", 1, 50, 5)]


@pytest_asyncio.fixture
async def known_audit(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """A tenant of its own with the audit above, committed (the CLI reads it from another process)."""
    tenant = f"stats-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    async with db_engine.begin() as conn:
        await conn.execute(insert(Tenant).values(id=tenant, name=tenant))
        await conn.execute(
            insert(ToolExecution),
            [
                {
                    "tenant_id": tenant,
                    "agent": AGENT,
                    "user_id": "alice",
                    "workflow_id": "w1",
                    "run_id": "r1",
                    "call_id": f"c{i}",
                    "tool": tool,
                    "args": {},
                    "result": result,
                    "outcome": outcome,
                    "duration_ms": duration,
                    "approved_by": approver,
                    "created_at": now - age,
                }
                for i, (tool, outcome, result, duration, approver, age) in enumerate(CALLS)
            ],
        )
        await conn.execute(
            insert(ModelCall),
            [
                {
                    "tenant_id": tenant,
                    "agent": AGENT,
                    "workflow_id": f"{tenant}-{workflow}",
                    "turn": turn,
                    "model": "scripted",
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "tool_calls": 0,
                    "duration_ms": 5,
                    "attempt_key": f"{tenant}:{i}",
                }
                for i, (workflow, turn, prompt, completion) in enumerate(MODEL_CALLS)
            ],
        )
    yield tenant
    async with db_engine.begin() as conn:
        await conn.execute(delete(ToolExecution).where(ToolExecution.tenant_id == tenant))
        await conn.execute(delete(ModelCall).where(ModelCall.tenant_id == tenant))
        await conn.execute(delete(Tenant).where(Tenant.id == tenant))


async def stats(database_url: str, tmp_path: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "DATABASE_URL": database_url, "COUNTERSIGN_DATA_DIR": str(tmp_path)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "starter.py", "stats", *args,
        cwd=PROJECT_ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_stats_summarise_the_audit_per_tool_and_agent(
    known_audit: str, database_url: str, tmp_path: Path
) -> None:
    code, out = await stats(database_url, tmp_path, "--tenant", known_audit, "--since", "24h", "--json")
    assert code == 0, out
    summary = json.loads(out)
    assert summary["tenant"] == known_audit
    tools = {t["tool"]: t for t in summary["tools"]}
    assert tools["get_lead"] == {
        "tool": "get_lead",
        "calls": 4,
        "success_rate": 0.5,
        "needs_rate": 0.25,
        "mean_ms": 40.0,
        "p95_ms": 89.5,  # percentile_cont over 10, 20, 30, 100
        "outcomes": {"executed": 3, "failed": 1},
        "error_codes": {"NOT_FOUND": 1},
        "rated_helpful": 0,
        "rated_not_helpful": 0,
    }
    assert tools["update_lead_status"] == {
        "tool": "update_lead_status",
        "calls": 3,
        "success_rate": 1.0,  # the rejected and the expired call are reviewers', not the tool's
        "needs_rate": 0.0,
        "mean_ms": 50.0,
        "p95_ms": 50.0,
        "outcomes": {"executed": 1, "rejected": 1, "expired": 1},
        "error_codes": {"REJECTED": 1, "EXPIRED": 1},
        "rated_helpful": 0,
        "rated_not_helpful": 0,
    }
    assert summary["agents"] == [
        {
            "agent": AGENT,
            "turns": 3,
            "model_calls": 4,
            "prompt_tokens": 470,
            "completion_tokens": 40,
            "tool_calls": 7,
            "approvals_requested": 3,
            "approvals_approved": 1,
            "approvals_rejected": 1,
            "approvals_expired": 1,
            "approvals_pending": None,  # no Temporal to ask
            "rated_helpful": 0,
            "rated_not_helpful": 0,
        }
    ]

    code, out = await stats(database_url, tmp_path, "--tenant", known_audit, "--since", "3d")
    assert code == 0, out
    line = next(row for row in out.splitlines() if row.startswith("get_lead"))
    assert line.split()[:4] == ["get_lead", "5", "60%", "20%"]  # the old call is in the window now
    assert "NOT_FOUND 1" in line

    code, out = await stats(database_url, tmp_path, "--tenant", "no-such-tenant")
    assert code == 0 and "tools: none" in out and "agents: none" in out, out


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("24h", 86400), ("7d", 604800), ("1h30m", 5400)]
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "24", "h", "-1h", "0s", "1y", "24h later", "99999d"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|at most|more than"):
        parse_duration(text)


async def test_a_bad_since_is_a_usage_error(database_url: str, tmp_path: Path) -> None:
    code, out = await stats(database_url, tmp_path, "--since", "yesterday")
    assert code == 2 and "--since" in out and "not a duration" in out, out


async def test_pending_approvals_count_among_the_requested(
    known_audit: str, db_session: AsyncSession
) -> None:
    """A call waiting for a reviewer has no audit row yet: `stats` adds what Temporal says waits."""
    result = await collect(db_session, datetime.now(UTC) - timedelta(days=1), known_audit, {AGENT: 2})
    (agent,) = result.agents
    assert (agent.approvals_requested, agent.approvals_pending) == (3, 2)
    header, row = render(result)[1]
    assert dict(zip(header, row, strict=True))["APPROVALS"] == "5"
    assert dict(zip(header, row, strict=True))["PENDING"] == "2"
