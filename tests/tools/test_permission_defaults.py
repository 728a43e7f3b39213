"""Restrictive defaults and per-agent limits, against the real PostgreSQL, the real CLI in a
subprocess, and (for limits) the real workflow on the time-skipping server with the scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.contract import AgentLimits, Limits
from countersign.core.limits import within_agent_bounds
from countersign.db import schema
from countersign.db.seed import AGENTS, APPROVAL_TIMEOUT_S, seed
from tests.fixtures.agent import AgentHarness
from tools.registry import REGISTRY, default_tier_for
from workflows.agent import AgentWorkflow

PROJECT_ROOT = Path(__file__).resolve().parents[2]


async def starter(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url}
    command = [sys.executable, str(PROJECT_ROOT / "starter.py"), *args]
    return await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=60, env=env, cwd=PROJECT_ROOT
    )


# --- restrictive defaults --------------------------------------------------------------------------


def test_every_write_and_external_tool_defaults_to_needs_approval() -> None:
    for tool in REGISTRY.values():
        expected = "always_allow" if tool.category == "read" else "needs_approval"
        assert tool.default_tier == expected, tool.name
    assert default_tier_for("low", "write") == "needs_approval"
    assert default_tier_for("high", "read") == "needs_approval"
    assert default_tier_for("low", "read") == "always_allow"


async def test_a_write_with_no_tier_set_waits_for_approval(
    agent: AgentHarness, database_url: str, db_engine: AsyncEngine
) -> None:
    """operations' create_task with its seeded tier removed: the call waits instead of running."""
    permission = schema.AgentToolPermission
    row = (permission.agent == "operations") & (permission.tool == "create_task")
    async with db_engine.begin() as conn:
        await conn.execute(update(permission).where(row).values(tier=None))
    try:
        agent.script(
            {
                "when": {"user_contains": "task"},
                "reply": {"tool_calls": [{"name": "create_task", "arguments": {"title": "Unasked write"}}]},
            },
        )
        handle = await agent.start("a task, please", agent="operations", single_turn=True)
        for _ in range(100):
            status = await handle.query(AgentWorkflow.status)
            if status.state == "awaiting_approval":
                break
            await asyncio.sleep(0.05)
        assert [p.tool for p in status.pending_approvals] == ["create_task"]
        async with db_engine.connect() as conn:
            created = await conn.scalar(select(schema.Task.id).where(schema.Task.title == "Unasked write"))
        assert created is None
    finally:
        await seed(database_url)  # puts the seeded tier back (it fills only NULL tiers)
    async with db_engine.connect() as conn:
        assert await conn.scalar(select(permission.tier).where(row)) == "always_allow"


async def test_catalog_lists_every_tool_with_its_agents(database_url: str) -> None:
    done = await starter(database_url, "permissions", "catalog", "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    by_name = {r["tool"]: r for r in rows}
    assert set(by_name) == set(REGISTRY)
    assert by_name["update_lead_status"] | {"agents": None} == {
        "tool": "update_lead_status",
        "risk": "high",
        "category": "write",
        "default_tier": "needs_approval",
        "required_roles": [],
        "compensable": True,
        "agents": None,
    }
    assert by_name["update_lead_status"]["agents"] == {"lead-qualifier": "needs_approval"}
    assert by_name["create_task"]["default_tier"] == "needs_approval"
    assert by_name["create_task"]["agents"] == {"operations": "always_allow"}  # set by the seed
    assert by_name["search_contacts"]["agents"] == {
        "case-researcher": "always_allow",
        "lead-qualifier": "always_allow",
        "scheduler": "always_allow",
    }
    for agent_name, (_, _, tools) in AGENTS.items():
        for tool in tools:
            assert agent_name in by_name[tool]["agents"], (agent_name, tool)

    text = await starter(database_url, "permissions", "catalog")
    assert text.returncode == 0, text.stderr
    header, *lines = text.stdout.splitlines()
    assert header.split() == ["tool", "risk", "category", "default", "tier", "agents", "(tier)"]
    assert any(line.split()[:4] == ["send_email", "high", "external", "needs_approval"] for line in lines)


# --- per-agent limits ------------------------------------------------------------------------------


def test_agent_bounds_cap_a_conversation_but_never_loosen_it() -> None:
    bounds = AgentLimits(max_iterations=7, turn_timeout_s=50)
    assert within_agent_bounds(Limits(), bounds) == Limits(max_iterations=7, turn_timeout_s=50)
    asked_more = Limits(max_iterations=20, turn_timeout_s=600, max_tool_calls=3)
    assert within_agent_bounds(asked_more, bounds) == Limits(
        max_iterations=7, turn_timeout_s=50, max_tool_calls=3
    )
    assert within_agent_bounds(Limits(max_iterations=2), bounds).max_iterations == 2
    assert within_agent_bounds(Limits(), AgentLimits()) == Limits()
    # an approval timeout left to the per-risk default takes the agent's bound
    assert within_agent_bounds(Limits(), AgentLimits(approval_timeout_s=60)).approval_timeout_s == 60
    asked_less = within_agent_bounds(Limits(approval_timeout_s=30), AgentLimits(approval_timeout_s=60))
    assert asked_less.approval_timeout_s == 30


async def test_admin_assistant_turn_stops_at_its_seeded_seven_iterations(agent: AgentHarness) -> None:
    agent.script(
        {
            "when": {"user_contains": "count"},
            "reply": {"tool_calls": [{"name": "count_records", "arguments": {"collection": "leads"}}]},
        },
        {
            "when": {"after_tool": "count_records"},
            "reply": {"tool_calls": [{"name": "count_records", "arguments": {"collection": "tasks"}}]},
        },
    )
    # The conversation asks for 20 iterations and 10 minutes: the agent's bounds win.
    handle = await agent.start(
        "count forever",
        agent="admin-assistant",
        user="carol",
        single_turn=True,
        limits=Limits(max_iterations=20, turn_timeout_s=600),
    )
    result = await handle.result()
    assert result.last_reply is not None and "max_iterations (7" in result.last_reply
    assert result.usage.model_calls == 7
    limits = (await handle.query(AgentWorkflow.status)).limits
    assert (limits.max_iterations, limits.turn_timeout_s) == (7, 50)

    tighter = await agent.start(
        "count", agent="admin-assistant", user="carol", single_turn=True, limits=Limits(max_iterations=2)
    )
    assert (await tighter.result()).usage.model_calls == 2


async def test_permissions_limits_and_show(database_url: str, db_engine: AsyncEngine) -> None:
    shown = await starter(database_url, "permissions", "show", "admin-assistant")
    assert shown.returncode == 0, shown.stderr
    assert (
        "limits (a conversation may ask for less, never more): "
        "approval_timeout_s=86400, max_iterations=7, turn_timeout_s=50" in shown.stdout.splitlines()
    )
    try:
        changed = await starter(database_url, "permissions", "limits", "operations", "max_tool_calls=4")
        assert changed.returncode == 0, changed.stderr
        assert changed.stdout.strip() == "operations limits: approval_timeout_s=86400, max_tool_calls=4"
        refused = await starter(database_url, "permissions", "limits", "operations", "max_iterations=0")
        assert refused.returncode != 0 and "max_iterations" in refused.stderr
        unknown = await starter(database_url, "permissions", "limits", "operations", "tenant_id=x")
        assert unknown.returncode != 0 and "KEY=VALUE" in unknown.stderr
        async with db_engine.connect() as conn:
            stored = await conn.scalar(
                select(schema.AgentProfile.limits).where(schema.AgentProfile.name == "operations")
            )
        assert stored == {"approval_timeout_s": 86_400, "max_tool_calls": 4}
        cleared = await starter(
            database_url, "permissions", "limits", "operations", "max_tool_calls=", "approval_timeout_s="
        )
        assert cleared.stdout.strip() == "operations limits: none (built-in defaults)"
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(
                update(schema.AgentProfile)
                .where(schema.AgentProfile.name == "operations")
                .values(limits={"approval_timeout_s": APPROVAL_TIMEOUT_S})
            )


@pytest.mark.parametrize("broken", [{"max_iterations": 0}, {"no_such_limit": 1}])
def test_broken_agent_limits_are_refused_by_the_model(broken: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        AgentLimits.model_validate(broken)
