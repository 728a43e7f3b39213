"""Email drafting: send_email's sanitised HTML and lead, draft_email, lead score and last engagement,
and send_email_to_contact through the outbox, approval, undo window and a real SMTP server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest_asyncio
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.core.approvals import Decision
from countersign.core.calls import call_key, queued_emails
from countersign.core.contract import EndConversation
from countersign.core.saga import RollbackRequest
from countersign.db.instances import instance_of
from countersign.db.schema import EmailDraft, EmailOutbox, Lead
from countersign.db.seed import seed
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import pending
from tests.fixtures.postgres import JANE
from tests.fixtures.smtp import SmtpServer
from tests.fixtures.updates import execute_update
from tests.tools.test_tools_catalog import call, context, failure, run, undo
from tests.workflows.test_saga import rolled_back
from tools import REGISTRY
from tools.registry import Needs
from workflows.agent import AgentWorkflow

HOSTILE_HTML = (
    '<p onclick="steal()">Hello <b>Jane</b><script>alert(1)</script>'
    '<a href="javascript:evil()">click</a> <a href="https://example.com/x">site</a>'
    '<img src=x onerror="evil()"><style>body{display:none}</style></p>'
)


def assert_clean(html: str) -> None:
    for unsafe in ("<script", "onclick", "onerror", "javascript:", "<style", "alert(1)"):
        assert unsafe not in html, (unsafe, html)
    assert "<b>Jane</b>" in html and 'href="https://example.com/x"' in html


async def test_send_email_sanitises_html_and_records_the_lead(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="lead-qualifier")
    queued = await run(
        ctx, "send_email", to=JANE, subject="Hi", body="Hello Jane", html_body=HOSTILE_HTML, lead=JANE
    )
    row = await db_session.get(EmailOutbox, queued["outbox_id"])
    assert row is not None and row.html_body is not None and row.body == "Hello Jane"
    assert_clean(row.html_body)
    jane = await db_session.scalar(select(Lead).where(Lead.tenant_id == "acme", Lead.email == JANE))
    assert jane is not None and row.lead_id == jane.id

    # the core arguments alone still work (CONTRACT.md), with neither html nor lead
    plain = await run(replace(ctx, call_id="call-2"), "send_email", to=JANE, subject="S", body="B")
    plain_row = await db_session.get(EmailOutbox, plain["outbox_id"])
    assert plain_row is not None and (plain_row.html_body, plain_row.lead_id) == (None, None)


async def test_an_email_about_a_lead_goes_to_that_lead_only(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="lead-qualifier")
    refused = await failure(ctx, "send_email", to="attacker@evil.example", subject="S", body="B", lead=JANE)
    assert refused.code == "VALIDATION_ERROR" and JANE in refused.message
    globex = await db_session.scalar(select(Lead.id).where(Lead.tenant_id == "globex", Lead.email == JANE))
    missing = await failure(ctx, "send_email", to=JANE, subject="S", body="B", lead=str(globex))
    assert missing.code == "NOT_FOUND"


async def test_draft_email_stores_a_draft_and_sends_nothing(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="lead-qualifier")
    outbox_before = await db_session.scalar(select(func.count()).select_from(EmailOutbox))
    args = {"to": JANE, "subject": "Draft", "body": "Plain", "html_body": HOSTILE_HTML, "lead": JANE}
    draft = await run(ctx, "draft_email", **args)
    assert draft["to"] == JANE and draft["has_html"] and draft["lead_id"] is not None
    assert await run(ctx, "draft_email", **args) == draft, "a retried call finds its own draft"
    stored = await db_session.get(EmailDraft, draft["draft_id"])
    assert stored is not None and stored.created_by == "alice" and stored.html_body is not None
    assert_clean(stored.html_body)
    assert await db_session.scalar(select(func.count()).select_from(EmailOutbox)) == outbox_before

    assert await undo(ctx, "draft_email", draft, **args) == "undone"
    assert await db_session.get(EmailDraft, draft["draft_id"]) is None
    assert await undo(ctx, "draft_email", draft, **args) == "already_undone"
    assert (REGISTRY["draft_email"].category, REGISTRY["draft_email"].default_tier) == (
        "write",
        "needs_approval",
    )


async def test_lead_tools_show_score_and_last_engagement(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="lead-qualifier")
    maria = await run(ctx, "get_lead", lead="maria.garcia@umbrella.example")
    # computed from the facts (other tests' emails and changes count too): the score tool agrees
    scored = await run(ctx, "get_lead_score", lead="maria.garcia@umbrella.example")
    assert maria["score"] == scored["score"] >= 45 and maria["last_engaged_at"] == "2026-12-02T11:00:00Z"
    found = await run(ctx, "search_leads", query="Jane")
    jane = await run(ctx, "get_lead_score", lead=JANE)
    assert [(lead["score"], lead["last_engaged_at"]) for lead in found["leads"]] == [(jane["score"], None)]


async def test_send_email_to_contact_resolves_the_name_or_asks(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="admin-assistant")
    queued = await run(ctx, "send_email_to_contact", contact="priya nair", subject="Hi", body="Hello")
    assert queued["to"] == "priya.nair@acmepartners.example" and queued["status"] == "queued"
    ambiguous = await call(ctx, "send_email_to_contact", contact="Sam Lee", subject="Hi", body="Hello")
    assert isinstance(ambiguous, Needs) and ambiguous.fields == {"contact": True}
    assert {c["email"] for c in ambiguous.candidates} == {
        "sam.lee@initech.example",
        "samuel.lee@umbrella.example",
    }
    globex_only = await failure(ctx, "send_email_to_contact", contact="Tom Becker", subject="Hi", body="x")
    assert globex_only.code == "NOT_FOUND"


@pytest_asyncio.fixture
async def reseeded(database_url: str) -> AsyncIterator[None]:
    yield
    await seed(database_url, reset=True)  # delivery stamped a lead's last engagement: put the seed back


async def delivered_to(engine: AsyncEngine, workflow_id: str) -> tuple[str, str | None]:
    async with engine.connect() as conn:
        key = call_key(workflow_id, await instance_of(conn, workflow_id), "c1")
        row = (
            await conn.execute(
                select(EmailOutbox.status, EmailOutbox.html_body).where(EmailOutbox.idempotency_key == key)
            )
        ).one()
    return row.status, row.html_body


async def test_admin_assistant_emails_a_contact_after_approval_and_the_undo_window(
    agent: AgentHarness, db_engine: AsyncEngine, smtp_server: SmtpServer, reseeded: None
) -> None:
    send = {"contact": "Priya Nair", "subject": "Partner update", "body": "Plain", "html_body": HOSTILE_HTML}
    agent.script(
        {
            "when": {"user_contains": "priya"},
            "reply": {"tool_calls": [{"name": "send_email_to_contact", "arguments": send}]},
        },
        {"when": {"after_tool": "send_email_to_contact"}, "reply": {"content": "queued"}},
    )
    handle = await agent.start("email priya", agent="admin-assistant", user="carol", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    assert (waiting.tool, waiting.risk) == ("send_email_to_contact", "high")
    decision = Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    await execute_update(handle, AgentWorkflow.decide, decision)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert (await delivered_to(db_engine, handle.id))[0] == "queued" and not smtp_server.messages
    await handle.result()  # the time-skipping server jumps the undo window
    status, html = await delivered_to(db_engine, handle.id)
    assert status == "sent" and html is not None
    (message,) = smtp_server.messages
    assert message["To"] == "priya.nair@acmepartners.example"
    assert message.get_content_type() == "multipart/alternative"
    plain, rich = (part.get_content() for part in message.iter_parts())
    assert plain.strip() == "Plain"
    assert_clean(rich)


async def test_an_email_about_a_lead_stamps_its_last_engagement_when_delivered(
    agent: AgentHarness, db_engine: AsyncEngine, smtp_server: SmtpServer, reseeded: None
) -> None:
    send = {"to": JANE, "subject": "Hello", "body": "Hi Jane", "lead": JANE}
    agent.script(
        {
            "when": {"user_contains": "email"},
            "reply": {"tool_calls": [{"name": "send_email", "arguments": send}]},
        },
        {"when": {"after_tool": "send_email"}, "reply": {"content": "sent"}},
    )
    handle = await agent.start("email jane", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    decision = Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    await execute_update(handle, AgentWorkflow.decide, decision)
    await handle.result()
    async with db_engine.connect() as conn:
        engaged = dict(
            (await conn.execute(select(Lead.tenant_id, Lead.last_engaged_at).where(Lead.email == JANE))).all()
        )
    assert engaged["acme"] is not None and engaged["globex"] is None
    assert len(smtp_server.messages) == 1


async def test_rolling_back_cancels_a_contact_email_within_the_window(
    agent: AgentHarness, db_engine: AsyncEngine, smtp_server: SmtpServer
) -> None:
    send = {"contact": "Priya Nair", "subject": "Oops", "body": "Not this one"}
    agent.script(
        {
            "when": {"user_contains": "priya"},
            "reply": {"tool_calls": [{"name": "send_email_to_contact", "arguments": send}]},
        },
        {"when": {"after_tool": "send_email_to_contact"}, "reply": {"content": "queued"}},
    )
    handle = await agent.start("email priya", agent="admin-assistant", user="carol")
    (waiting,) = (await pending(handle)).pending_approvals
    decision = Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    await execute_update(handle, AgentWorkflow.decide, decision)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="carol", scope="turn"))
    saga = await rolled_back(agent, handle)
    assert [(e.tool, e.state) for e in saga.entries] == [("send_email_to_contact", "done")]
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="carol"))
    await handle.result()
    assert (await delivered_to(db_engine, handle.id))[0] == "cancelled" and not smtp_server.messages


def test_the_workflow_delivers_only_what_its_email_tools_queued() -> None:
    assert queued_emails("send_email", {"outbox_id": 7, "status": "queued"}) == [7]
    assert queued_emails("send_email", {"outbox_id": 7, "status": "sent"}) == []
    assert queued_emails("confirm_meeting", {"outbox_ids": [3, 4], "status": "confirmed"}) == [3, 4]
    assert queued_emails("confirm_meeting", {"outbox_ids": ["3", None, 5]}) == [5]
    assert queued_emails("mcp__crm__send", {"outbox_id": 7, "status": "queued"}) == []  # any server's shape
    assert queued_emails("get_lead", {"outbox_ids": [1]}) == []
