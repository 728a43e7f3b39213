"""The scripted model exercises every tool of the catalog through the real loop, then the whole
conversation is rolled back: every write's compensation runs, and the database is as before."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

import tools
from countersign.core.contract import EndConversation, Limits
from countersign.core.policy import ASK_HUMAN
from countersign.core.saga import RollbackRequest
from countersign.db.schema import (
    AgentProfile,
    AgentToolPermission,
    EmailDraft,
    Lead,
    MeetingSession,
    Notification,
)
from tests.fixtures.agent import AgentHarness
from tests.fixtures.chat import Receiver, acme_channel
from tests.fixtures.postgres import JANE, reset_jane
from tests.fixtures.updates import execute_update
from tests.workflows.test_saga import LIVE
from workflows.agent import AgentWorkflow

AGENT = "catalog-test"


def first_round(
    lead_id: int, notification_id: int, draft_id: int, session_id: int
) -> dict[str, dict[str, Any]]:
    """The calls of one model message (they may run together: what depends on one is in SECOND_ROUND)."""
    return {
        "search_leads": {"query": "Jane"},
        "get_lead": {"lead": JANE},
        "update_lead_status": {"lead": JANE, "new_status": "contacted", "reason": "catalog check"},
        "search_contacts": {"query": "Jane"},
        "send_email": {"to": JANE, "subject": "Catalog check", "body": "Hello from the catalog test"},
        "list_tasks": {},
        "create_task": {"title": "Catalog check task"},
        "list_projects": {},
        "create_project": {"name": "Catalog check project"},
        "list_events": {},
        "create_event": {
            "title": "Catalog check event",
            "starts_at": "2026-12-22T09:00:00Z",
            "ends_at": "2026-12-22T09:30:00Z",
        },
        "query_records": {"collection": "leads", "limit": 2},
        "get_record": {"collection": "leads", "id": lead_id},
        "count_records": {"collection": "leads"},
        "describe_collection": {"collection": "tasks"},
        "search_text": {"query": "Jane"},
        "write_record": {
            "collection": "tasks",
            "values": [{"field": "title", "value": "Catalog check via admin"}],
        },
        "schedule_meeting": {"with": "bob", "duration_minutes": 30},
        "confirm_meeting": {"with": "bob", "starts_at": "2026-12-23T15:00:00Z", "duration_minutes": 30},
        "accept_meeting": {"session": session_id, "selection": 1},
        "list_notifications": {"status": "all"},
        "resolve_notification": {"notification": str(notification_id)},
        "search_cases": {"query": "Initech"},
        "get_case": {"case": "Initech security review"},
        "update_case": {"case": "Initech security review", "status": "closed"},
        "draft_email": {"to": JANE, "subject": "Draft check", "body": "Draft", "lead": JANE},
        "send_email_to_contact": {"contact": "Priya Nair", "subject": "Catalog check", "body": "Hello"},
        "get_lead_score": {"lead": JANE},
        "record_lead_reply": {"lead": JANE, "summary": "Catalog check reply"},
        "list_drafts": {},
        "get_draft": {"draft": draft_id},
        "update_draft": {"draft": draft_id, "subject": "Catalog check draft, edited"},
        "send_chat_message": {"text": "Catalog check"},  # posted, not undone: it cannot be taken back
    }


def second_round(draft_id: int) -> dict[str, dict[str, Any]]:
    return {**SECOND_ROUND, "send_draft": {"draft": draft_id}}  # after update_draft edited it


SECOND_ROUND = {
    "update_task": {"task": "Catalog check task", "status": "in_progress"},
    "update_project": {"project": "Catalog check project", "status": "active"},
    "update_event": {"event": "Catalog check event", "location": "Room 1"},
}

STATE = {
    "leads": "SELECT id, status, score, last_engaged_at FROM leads WHERE tenant_id = 'acme' ORDER BY id",
    "tasks": f"SELECT id, title, status FROM tasks WHERE {LIVE}",
    "projects": f"SELECT id, name, status FROM projects WHERE {LIVE}",
    "events": f"SELECT id, title, status FROM calendar_events WHERE {LIVE}",
    "notifications": "SELECT id, status FROM notifications WHERE tenant_id = 'acme' ORDER BY id",
    "cases": "SELECT id, status, notes FROM cases WHERE tenant_id = 'acme' ORDER BY id",
    "drafts": "SELECT id, subject, sent_outbox_id FROM email_drafts WHERE tenant_id = 'acme'",
    "sessions": "SELECT id FROM meeting_sessions WHERE tenant_id = 'acme' AND status <> 'cancelled'",
    "outbox": "SELECT id FROM email_outbox WHERE tenant_id = 'acme' AND status IN ('queued', 'sent')",
}


async def state(engine: AsyncEngine) -> dict[str, list[Any]]:
    async with engine.connect() as conn:
        return {k: sorted(tuple(r) for r in await conn.execute(text(q))) for k, q in STATE.items()}


async def catalog_agent(engine: AsyncEngine) -> tuple[int, int, int, int]:
    """An agent with every tool but ask_human, all always_allow; and ids the model will name (a
    notification and a saved draft of the test's own, and alice's proposal to carol with its own
    notification)."""
    async with engine.begin() as conn:
        await conn.execute(
            insert(AgentProfile)
            .values(name=AGENT, description="tests", system_prompt="You check the catalog.")
            .on_conflict_do_nothing()
        )
        for name in tools.REGISTRY:
            if name != ASK_HUMAN:
                row = {"agent": AGENT, "tool": name, "tier": "always_allow"}
                await conn.execute(insert(AgentToolPermission).values(**row).on_conflict_do_nothing())
        lead_id = (
            await conn.execute(select(Lead.id).where(Lead.tenant_id == "acme", Lead.email == JANE))
        ).scalar_one()
        notification = insert(Notification).values(
            tenant_id="acme", user_id="carol", kind="test", message="Catalog check notification"
        )
        notification_id = (await conn.execute(notification.returning(Notification.id))).scalar_one()
        draft = insert(EmailDraft).values(
            tenant_id="acme", idempotency_key=f"{AGENT}-draft", created_by="carol", to_address=JANE,
            subject="Catalog check draft", body="Saved for later",
        ).on_conflict_do_nothing()  # fmt: skip
        await conn.execute(draft)
        draft_id = (
            await conn.execute(select(EmailDraft.id).where(EmailDraft.idempotency_key == f"{AGENT}-draft"))
        ).scalar_one()
        proposal = insert(Notification).values(
            tenant_id="acme", user_id="carol", kind="meeting_proposal", message="Catalog check proposal"
        )
        proposal_id = (await conn.execute(proposal.returning(Notification.id))).scalar_one()
        slot = {"index": 1, "starts_at": "2026-12-24T10:00:00+00:00", "ends_at": "2026-12-24T10:30:00+00:00"}
        session = insert(MeetingSession).values(
            tenant_id="acme",
            idempotency_key=f"{AGENT}:proposal",
            requested_by="alice",
            counterpart_name="Carol",
            counterpart_email="carol@acme.example",
            counterpart_user_id="carol",
            counterpart_tz="UTC",
            duration_minutes=30,
            window_start=datetime(2026, 12, 24, tzinfo=UTC),
            window_end=datetime(2026, 12, 25, tzinfo=UTC),
            proposals=[slot | {"time_zone": "UTC", "counterpart_local": "Thu", "user_local": "Thu"}],
            expires_at=datetime(2030, 1, 1, tzinfo=UTC),
            notification_id=proposal_id,
        )
        session_id = (await conn.execute(session.returning(MeetingSession.id))).scalar_one()
    return lead_id, notification_id, draft_id, session_id


def calls(round_: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": name, "arguments": args} for name, args in round_.items()]


async def test_every_tool_runs_through_the_model_and_rolls_back(
    agent: AgentHarness, db_engine: AsyncEngine, scratch: list[str], chat_receiver: Receiver
) -> None:
    async with acme_channel(db_engine, chat_receiver, "slack"):
        await every_tool_runs_and_rolls_back(agent, db_engine, scratch)
    assert [p["json"] for p in chat_receiver.posts] == [{"text": "Catalog check"}]


async def every_tool_runs_and_rolls_back(
    agent: AgentHarness, db_engine: AsyncEngine, scratch: list[str]
) -> None:
    scratch.append(AGENT)
    await reset_jane(db_engine)
    lead_id, notification_id, draft_id, session_id = await catalog_agent(db_engine)
    first, second = first_round(lead_id, notification_id, draft_id, session_id), second_round(draft_id)
    assert set(first) | set(second) | {ASK_HUMAN} == set(tools.REGISTRY), "a tool is missing from this test"
    agent.script(
        {"when": {"user_contains": "everything"}, "reply": {"tool_calls": calls(first)}},
        {"when": {"after_tool": list(first)[-1]}, "reply": {"tool_calls": calls(second)}},
        {"when": {"after_tool": list(second)[-1]}, "reply": {"content": "checked"}},
    )
    before = await state(db_engine)
    # carol is an admin: write_record is hers
    handle = await agent.start("run everything", user="carol", agent=AGENT, limits=Limits(max_tool_calls=40))
    turn = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert turn is not None and turn.reply == "[scripted model] checked"

    transcript = await agent.transcript(handle)
    results = {m.name: json.loads(m.content or "") for m in transcript if m.role == "tool"}
    failed = {name: r for name, r in results.items() if not r["ok"]}
    assert not failed, failed
    assert set(results) == set(first) | set(second)

    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="carol", scope="conversation"))
    for _ in range(300):
        saga = await handle.query(AgentWorkflow.saga)
        if all(e.state != "registered" for e in saga.entries):
            break
        await asyncio.sleep(0.05)
    assert {e.tool: e.state for e in saga.entries} == dict.fromkeys(
        [
            "update_lead_status",
            "send_email",
            "create_task",
            "create_project",
            "create_event",
            "write_record",
            "schedule_meeting",
            "confirm_meeting",
            "accept_meeting",
            "resolve_notification",
            "update_case",
            "draft_email",
            "send_email_to_contact",
            "record_lead_reply",
            "update_draft",
            *second,
        ],
        "done",
    )
    assert await state(db_engine) == before
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="carol"))
    await handle.result()
    async with db_engine.begin() as conn:
        await conn.execute(delete(EmailDraft).where(EmailDraft.id == draft_id))
