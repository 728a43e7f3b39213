"""Saga rollback on real parts: compensations recorded in workflow state, undone newest first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import delete, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from temporalio.client import WorkflowFailureError

from activities.saga import SagaActivities
from countersign.cli.records import audit_cell
from countersign.core.calls import CallerContext
from countersign.core.contract import EndConversation, SubmitMessage
from countersign.core.saga import CompensationRequest, RollbackRequest
from countersign.db.audit import audit_rows
from countersign.db.engine import session_factory
from countersign.db.schema import (
    AgentProfile,
    AgentToolPermission,
    Compensation,
    ConversationEvent,
    EmailOutbox,
    Lead,
    RollbackRecord,
)
from tests.fixtures.agent import AgentHarness
from tests.fixtures.postgres import reset_jane
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow

AGENT = "saga-test"
TOOLS = ("update_lead_status", "create_task", "create_event", "send_email", "update_task")
JANE = "jane.doe@example.com"

WRITES = [
    {
        "name": "update_lead_status",
        "arguments": {"lead": JANE, "new_status": "contacted", "reason": "called"},
    },
    {"name": "create_task", "arguments": {"title": "Saga follow-up", "description": "call back"}},
    {
        "name": "create_event",
        "arguments": {
            "title": "Saga demo",
            "starts_at": "2026-12-15T10:00:00Z",
            "ends_at": "2026-12-15T10:30:00Z",
        },
    },
    {"name": "send_email", "arguments": {"to": JANE, "subject": "Hello", "body": "Nice to meet you"}},
]


async def make_agent(engine: AsyncEngine, atomic: bool = False) -> str:
    """An agent with every write, all always_allow, so the saga is tested without approvals."""
    name = f"{AGENT}-atomic" if atomic else AGENT
    async with engine.begin() as conn:
        await conn.execute(
            insert(AgentProfile)
            .values(name=name, description="tests", system_prompt="You test sagas.", atomic_turns=atomic)
            .on_conflict_do_nothing()
        )
        for tool in TOOLS:
            await conn.execute(
                insert(AgentToolPermission)
                .values(agent=name, tool=tool, tier="always_allow")
                .on_conflict_do_nothing()
            )
    return name


# The affected rows as a person sees them: created rows that were undone are cancelled, not deleted.
LIVE = "tenant_id = 'acme' AND status <> 'cancelled' ORDER BY id"
SNAPSHOT = {
    "leads": "SELECT id, status, updated_at FROM leads WHERE tenant_id = 'acme' ORDER BY id",
    "tasks": f"SELECT id, title, status FROM tasks WHERE {LIVE}",
    "events": f"SELECT id, title, status FROM calendar_events WHERE {LIVE}",
    "outbox": "SELECT id, status FROM email_outbox WHERE tenant_id = 'acme' AND status = 'queued' ORDER BY id",  # noqa: E501
}


async def snapshot(engine: AsyncEngine) -> dict[str, list[Any]]:
    async with engine.connect() as conn:
        return {name: [tuple(r) for r in await conn.execute(text(q))] for name, q in SNAPSHOT.items()}


@pytest.fixture
async def clean(db_engine: AsyncEngine, scratch: list[str]) -> Any:
    """Jane is new before and after; rows and agents these tests create are removed."""
    scratch += [AGENT, f"{AGENT}-atomic"]
    await reset_jane(db_engine)
    yield
    await reset_jane(db_engine)


async def after_one_write(agent: AgentHarness, engine: AsyncEngine, write: dict[str, Any]) -> Any:
    """A conversation whose first turn made `write` and finished."""
    name = await make_agent(engine)
    agent.script(
        {"when": {"user_contains": "please"}, "reply": {"tool_calls": [write]}},
        {"when": {"after_tool": write["name"]}, "reply": {"content": "ok"}},
    )
    handle = await agent.start("please", agent=name)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    return handle


async def rolled_back(agent: AgentHarness, handle: Any) -> Any:
    for _ in range(200):
        saga = await handle.query(AgentWorkflow.saga)
        status = await handle.query(AgentWorkflow.status)
        if (
            saga.entries
            and all(e.state != "registered" for e in saga.entries)
            and status.state != "rolling_back"
        ):
            return saga
        await asyncio.sleep(0.05)
    raise AssertionError(f"rollback did not finish: {saga}")


async def test_conversation_rollback_restores_rows_and_cancels_queued_email(
    agent: AgentHarness, db_engine: AsyncEngine, clean: None
) -> None:
    name = await make_agent(db_engine)
    agent.script(
        {"when": {"user_contains": "do it all"}, "reply": {"tool_calls": WRITES}},
        {"when": {"after_tool": "send_email"}, "reply": {"content": "all done"}},
    )
    before = await snapshot(db_engine)
    handle = await agent.start("do it all", agent=name)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    during = await snapshot(db_engine)
    assert during != before and len(during["outbox"]) == len(before["outbox"]) + 1

    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="conversation"))
    saga = await rolled_back(agent, handle)
    assert [e.state for e in saga.entries] == ["done", "done", "done", "done"]
    after = await snapshot(db_engine)
    assert after["tasks"] == before["tasks"] and after["events"] == before["events"]
    assert after["outbox"] == before["outbox"]
    assert [(i, s) for i, s, _ in after["leads"]] == [(i, s) for i, s, _ in before["leads"]]
    async with db_engine.connect() as conn:
        undone = (
            (
                await conn.execute(
                    select(Compensation.call_id)
                    .where(Compensation.workflow_id == handle.id)
                    .order_by(Compensation.id)
                )
            )
            .scalars()
            .all()
        )
        cancelled = (
            await conn.execute(select(EmailOutbox.status).order_by(EmailOutbox.id.desc()).limit(1))
        ).scalar()
    assert undone == ["c4", "c3", "c2", "c1"], "compensations run newest first"
    assert cancelled == "cancelled"
    transcript = await handle.query(AgentWorkflow.transcript)
    assert transcript[-1].role == "system" and "Rolled back" in (transcript[-1].content or "")
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()


async def test_turn_and_call_scopes(agent: AgentHarness, db_engine: AsyncEngine, clean: None) -> None:
    name = await make_agent(db_engine)
    agent.script(
        {"when": {"user_contains": "first"}, "reply": {"tool_calls": [WRITES[1]]}},
        {"when": {"user_contains": "second"}, "reply": {"tool_calls": [WRITES[0], WRITES[2]]}},
        {"when": {"after_tool": "create_task"}, "reply": {"content": "ok"}},
        {"when": {"after_tool": "create_event"}, "reply": {"content": "ok"}},
    )
    handle = await agent.start("first", agent=name)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    await handle.signal(AgentWorkflow.submit_message, SubmitMessage(user_id="alice", text="second"))
    await execute_update(handle, AgentWorkflow.wait_turn, 2)
    await handle.signal(
        AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="call", call_id="c2")
    )
    for _ in range(200):
        states = {e.call_id: e.state for e in (await handle.query(AgentWorkflow.saga)).entries}
        if states["c2"] != "registered":
            break
        await asyncio.sleep(0.05)
    assert states == {"c1": "registered", "c2": "done", "c3": "registered"}
    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="turn"))
    for _ in range(200):
        states = {e.call_id: e.state for e in (await handle.query(AgentWorkflow.saga)).entries}
        if states["c3"] != "registered":
            break
        await asyncio.sleep(0.05)
    assert states == {"c1": "registered", "c2": "done", "c3": "done"}, "turn scope: only the latest turn"
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()


async def test_only_the_user_or_an_admin_may_roll_back(
    agent: AgentHarness, db_engine: AsyncEngine, clean: None
) -> None:
    handle = await after_one_write(agent, db_engine, WRITES[1])
    for who in ("bob", "erin"):
        await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by=who, scope="conversation"))
    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="carol", scope="conversation"))
    saga = await rolled_back(agent, handle)
    assert saga.entries[0].state == "done"
    async with db_engine.connect() as conn:
        rows = (
            await conn.execute(
                select(RollbackRecord.requested_by, RollbackRecord.accepted)
                .where(RollbackRecord.workflow_id == handle.id)
                .order_by(RollbackRecord.id)
            )
        ).all()
    # signal handlers run concurrently: the rows' order is the activities' completion order
    assert sorted(tuple(r) for r in rows) == [("bob", False), ("carol", True), ("erin", False)]
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()


async def test_cancelling_the_conversation_stops_it_and_undoes_nothing(
    agent: AgentHarness, db_engine: AsyncEngine, clean: None
) -> None:
    """A Temporal cancel is an operator's stop, not an undo (docs/explanation/security.md): an undo is a
    `rollback`, authorized and recorded."""
    handle = await after_one_write(agent, db_engine, WRITES[0])
    async with db_engine.connect() as conn:
        status = select(Lead.status).where(Lead.tenant_id == "acme", Lead.email == JANE)
        assert (await conn.execute(status)).scalar() == "contacted"
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    async with db_engine.connect() as conn:
        assert (await conn.execute(status)).scalar() == "contacted"


async def test_atomic_turn_undoes_earlier_writes_when_one_fails(
    agent: AgentHarness, db_engine: AsyncEngine, clean: None
) -> None:
    name = await make_agent(db_engine, atomic=True)
    missing = {"name": "update_task", "arguments": {"task": "no such task anywhere", "status": "done"}}
    agent.script(
        {"when": {"user_contains": "atomic"}, "reply": {"tool_calls": [WRITES[1]]}},
        {"when": {"after_tool": "create_task"}, "reply": {"tool_calls": [missing]}},
        {"when": {"after_tool": "update_task"}, "reply": {"content": "should not get here"}},
    )
    before = await snapshot(db_engine)
    handle = await agent.start("atomic please", agent=name, single_turn=True)
    result = await handle.result()
    assert result.last_reply is not None and "writes were undone" in result.last_reply
    saga = await handle.query(AgentWorkflow.saga)
    assert [(e.tool, e.state) for e in saga.entries] == [("create_task", "done"), ("update_task", "skipped")]
    assert (await snapshot(db_engine))["tasks"] == before["tasks"]
    # the conversation's readers (the chat page) are told how each undo ended, and why (issue 41)
    async with db_engine.connect() as conn:
        told = await conn.execute(
            select(ConversationEvent.data)
            .where(ConversationEvent.workflow_id == handle.id, ConversationEvent.kind == "rollback")
            .order_by(ConversationEvent.id)
        )
        assert [(d["tool"], d["state"], d["why"]) for (d,) in told] == [
            ("update_task", "skipped", "it never took effect: there was nothing to undo"),
            ("create_task", "done", "its change was reversed"),
        ]
    # the audit says why the skipped one is not rolled back, never a bare False (issue 50)
    async with AsyncSession(db_engine) as session:
        rows = {r["tool"]: r for r in await audit_rows(session, handle.id)}
    skipped = rows["update_task"]
    assert (skipped["rolled_back"], skipped["undo"]) == (False, "skipped")
    assert audit_cell(skipped, "rolled_back") == (
        "False (undo skipped: it never took effect: there was nothing to undo)"
    )
    assert audit_cell(rows["create_task"], "rolled_back") == "True"


async def test_a_failing_compensation_is_reported_and_the_rest_still_run(
    agent: AgentHarness, db_engine: AsyncEngine, clean: None
) -> None:
    name = await make_agent(db_engine)
    agent.script(
        {"when": {"user_contains": "both"}, "reply": {"tool_calls": [WRITES[1], WRITES[3]]}},
        {"when": {"after_tool": "send_email"}, "reply": {"content": "ok"}},
    )
    handle = await agent.start("both please", agent=name)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    async with db_engine.begin() as conn:  # the email is being delivered: it cannot be cancelled now
        await conn.execute(update(EmailOutbox).where(EmailOutbox.status == "queued").values(status="sending"))
    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="conversation"))
    saga = await rolled_back(agent, handle)
    assert [(e.tool, e.state) for e in saga.entries] == [("create_task", "done"), ("send_email", "failed")]
    status = await handle.query(AgentWorkflow.status)
    assert status.compensation_failures and "send_email" in status.compensation_failures[0]
    async with db_engine.begin() as conn:
        failed = await conn.execute(
            select(Compensation.state, Compensation.error).where(Compensation.workflow_id == handle.id)
        )
        assert "failed" in {r.state for r in failed}
        await conn.execute(delete(EmailOutbox).where(EmailOutbox.status == "sending"))
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()


async def test_a_compensation_retried_after_commit_changes_nothing_twice(
    agent: AgentHarness, db_engine: AsyncEngine, clean: None
) -> None:
    name = await make_agent(db_engine)
    agent.script(
        {"when": {"user_contains": "lead"}, "reply": {"tool_calls": [WRITES[0]]}},
        {"when": {"after_tool": "update_lead_status"}, "reply": {"content": "ok"}},
    )
    handle = await agent.start("lead please", agent=name, single_turn=True)
    await handle.result()
    (entry,) = (await handle.query(AgentWorkflow.saga)).entries
    activities = SagaActivities(session_factory(db_engine))
    caller = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent=name)
    request = CompensationRequest(
        caller=caller,
        workflow_id=handle.id,
        conversation_id=handle.first_execution_run_id or "",
        entry=entry,
    )
    first = await activities.compensate_call(request)
    async with db_engine.begin() as conn:  # a person changes the lead after the undo
        await conn.execute(
            update(Lead).where(Lead.tenant_id == "acme", Lead.email == JANE).values(status="qualified")
        )
    second = await activities.compensate_call(request)
    assert (first.state, second.state, second.detail) == ("done", "done", "recorded earlier")
    async with db_engine.connect() as conn:
        status = select(Lead.status).where(Lead.tenant_id == "acme", Lead.email == JANE)
        assert (await conn.execute(status)).scalar() == "qualified", "the retry did not undo twice"
