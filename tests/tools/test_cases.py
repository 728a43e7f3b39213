"""The case-researcher's tools against the seeded PostgreSQL, and its flow on the real workflow
(time-skipping server, scripted model over HTTP): update_case waits for a reviewer, runs once,
and a rollback puts the case back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.core.approvals import Decision
from countersign.core.saga import RollbackRequest
from countersign.db.schema import Case, ToolExecution
from countersign.db.seed import seed
from countersign.scripted_model.scenario import load_scenario
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import pending
from tests.fixtures.updates import execute_update
from tests.tools.test_tools_catalog import call, context, failure, run, undo
from tests.workflows.test_saga import rolled_back
from tools import REGISTRY
from tools.registry import Needs
from workflows.agent import AgentWorkflow

INITECH = "Initech security review"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_update_case_is_a_high_risk_compensable_write_that_needs_approval() -> None:
    tool = REGISTRY["update_case"]
    assert (tool.risk, tool.category, tool.default_tier) == ("high", "write", "needs_approval")
    assert tool.compensation is not None
    assert REGISTRY["search_cases"].default_tier == REGISTRY["get_case"].default_tier == "always_allow"


async def test_search_finds_cases_by_client_name_within_the_tenant(db_session: AsyncSession) -> None:
    acme = context(db_session, agent="case-researcher")
    found = await run(acme, "search_cases", query="jane doe")
    assert [c["title"] for c in found["cases"]] == ["Doe Consulting onboarding"]
    assert found["cases"][0]["client"]["company"] == "Doe Consulting"  # acme's Jane, not globex's

    globex = context(db_session, tenant="globex", user="dave", agent="case-researcher")
    theirs = await run(globex, "search_cases", query="jane doe")
    assert [c["title"] for c in theirs["cases"]] == ["Doe & Daughters onboarding"]
    assert theirs["cases"][0]["client"]["company"] == "Doe & Daughters"

    on_hold = await run(globex, "search_cases", status="on_hold")
    assert [c["title"] for c in on_hold["cases"]] == ["Vandelay contract dispute"]
    assert (await run(acme, "search_cases", query="Vandelay"))["count"] == 0


async def test_get_case_by_title_or_id_and_not_across_tenants(db_session: AsyncSession) -> None:
    acme = context(db_session, agent="case-researcher")
    case = await run(acme, "get_case", case=INITECH.upper())
    assert case["status"] == "in_progress" and case["client"]["name"] == "John Smith"
    assert (await run(acme, "get_case", case=str(case["id"])))["title"] == INITECH

    globex = context(db_session, tenant="globex", user="dave", agent="case-researcher")
    assert (await failure(globex, "get_case", case=str(case["id"]))).code == "NOT_FOUND"
    assert (await failure(globex, "get_case", case=INITECH)).code == "NOT_FOUND"


async def test_update_case_records_the_change_and_its_undo_restores_it(db_session: AsyncSession) -> None:
    acme = context(db_session, agent="case-researcher")
    changed = await run(acme, "update_case", case=INITECH, status="closed", notes="SOC 2 received.")
    assert changed["changed"] == {"status": "closed", "notes": "SOC 2 received."}
    assert changed["previous"]["status"] == "in_progress"
    args = {"case": INITECH, "status": "closed", "notes": "SOC 2 received."}
    assert await undo(acme, "update_case", changed, **args) == "undone"
    restored = await run(acme, "get_case", case=INITECH)
    assert restored["status"] == "in_progress" and restored["notes"].startswith("Security questionnaire")
    assert await undo(acme, "update_case", changed, **args) == "already_undone"

    # a later human change is never overwritten
    again = await run(acme, "update_case", case=INITECH, status="on_hold")
    await run(acme, "update_case", case=INITECH, status="open")
    assert await undo(acme, "update_case", again, case=INITECH, status="on_hold") == "irreversible"
    assert (await run(acme, "get_case", case=INITECH))["status"] == "open"


async def test_an_ambiguous_title_answers_needs_with_the_candidates(db_session: AsyncSession) -> None:
    acme = context(db_session, agent="case-researcher")
    db_session.add(Case(tenant_id="acme", title="Duplicate", status="open"))
    db_session.add(Case(tenant_id="acme", title="duplicate", status="closed"))
    await db_session.flush()
    result = await call(acme, "get_case", case="Duplicate")
    assert isinstance(result, Needs) and result.fields == {"case": True} and len(result.candidates) == 2


@pytest_asyncio.fixture
async def reseeded(database_url: str) -> AsyncIterator[None]:
    yield
    await seed(database_url, reset=True)  # the flow committed: put the seeded case back


async def case_status(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        status = await conn.scalar(select(Case.status).where(Case.tenant_id == "acme", Case.title == INITECH))
    assert status is not None
    return status


async def test_case_researcher_flow_approval_then_rollback(
    agent: AgentHarness, db_engine: AsyncEngine, reseeded: None
) -> None:
    update: dict[str, Any] = {"case": INITECH, "status": "closed", "notes": None}
    agent.script(
        {
            "when": {"user_contains": "initech"},
            "reply": {"tool_calls": [{"name": "search_cases", "arguments": {"query": "initech"}}]},
        },
        {
            "when": {"after_tool": "search_cases"},
            "reply": {"tool_calls": [{"name": "update_case", "arguments": update}]},
        },
        {"when": {"after_tool": "update_case"}, "reply": {"content": "The Initech case is closed."}},
    )
    handle = await agent.start("close the initech case", agent="case-researcher")
    (waiting,) = (await pending(handle)).pending_approvals
    assert (waiting.tool, waiting.risk) == ("update_case", "high")
    assert await case_status(db_engine) == "in_progress", "nothing runs before a decision"

    decision = Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    assert (await execute_update(handle, AgentWorkflow.decide, decision)).state == "approved"
    turn = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert turn is not None and turn.reply == "[scripted model] The Initech case is closed."
    assert await case_status(db_engine) == "closed"

    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="conversation"))
    saga = await rolled_back(agent, handle)
    assert [(e.tool, e.state) for e in saga.entries] == [("update_case", "done")]
    assert await case_status(db_engine) == "in_progress"
    async with db_engine.connect() as conn:
        rows = (
            await conn.execute(
                select(
                    ToolExecution.tool,
                    ToolExecution.outcome,
                    ToolExecution.approved_by,
                    ToolExecution.rolled_back,
                )
                .where(ToolExecution.workflow_id == handle.id)
                .order_by(ToolExecution.id)
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        ("search_cases", "executed", None, False),
        ("update_case", "executed", "bob", True),
    ]


async def test_the_case_research_scenario_drives_the_agent(agent: AgentHarness) -> None:
    """The scenario the documentation points at, through the real workflow: a read-only question."""
    agent.model.set_scenario(
        load_scenario(PROJECT_ROOT / "countersign" / "scenarios" / "case-researcher.yaml")
    )
    result = await agent.converse("What is open with Initech?", agent="case-researcher")
    assert result.last_reply is not None and "in progress with John Smith" in result.last_reply
    assert result.usage.tool_calls == 2
