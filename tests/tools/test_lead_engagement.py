"""Lead scores kept current by the tools that record engagement, in their own transaction; drafts found,
edited and sent again; calendar event types. Tools called directly on the seeded PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio
from pydantic import ValidationError
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.core.approvals import Decision
from countersign.db.engine import session_factory
from countersign.db.leads import rescore
from countersign.db.schema import CalendarEvent, EmailDraft, EmailOutbox, Lead, LeadEvent
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import pending
from tests.fixtures.cli import run_starter
from tests.fixtures.inbox import AuthInbox
from tests.fixtures.postgres import JANE
from tests.fixtures.smtp import SmtpServer
from tests.fixtures.updates import execute_update
from tests.server.test_agent_tools_api import token
from tests.tools.test_tools_catalog import args_of, context, failure, run, undo
from tools.registry import ToolContext
from workflows.agent import AgentWorkflow

JOHN = "john.smith@initech.example"
# a lead of the test's own: other tests' emails and changes move the seeded leads' scores
NINA = "nina.new@newco.example"


async def score_of(session: AsyncSession, email: str, tenant: str = "acme") -> int | None:
    return await session.scalar(
        select(Lead.score)
        .where(Lead.tenant_id == tenant, Lead.email == email)
        .execution_options(populate_existing=True)
    )


def lead_ctx(session: AsyncSession, call_id: str) -> ToolContext:
    return replace(context(session, agent="lead-qualifier"), call_id=call_id)


@pytest_asyncio.fixture
async def nina(db_session: AsyncSession) -> Lead:
    """A new lead (rolled back with the test's transaction): website 15 + company 10 + new 0 = 25."""
    lead = Lead(tenant_id="acme", email=NINA, name="Nina New", company="Newco", source="website")
    db_session.add(lead)
    await db_session.flush()
    await rescore(db_session, lead)
    return lead


async def test_the_seed_computes_scores_and_the_tool_shows_their_parts(db_session: AsyncSession) -> None:
    ctx = lead_ctx(db_session, "c1")
    john = await run(ctx, "get_lead_score", lead=JOHN)
    parts = {part["name"]: part["points"] for part in john["parts"]}
    # a referral with a company, and the seeded intro call (a "call" event with John as attendee)
    assert parts["source"] == 25 and parts["company"] == 10 and parts["meetings_booked"] >= 20
    assert john["score"] == min(sum(parts.values()), 100) == await score_of(db_session, JOHN)
    assert (await run(ctx, "get_lead_score", lead="li.wei@hooli.example"))["score"] == 0  # disqualified


async def test_a_status_change_is_history_and_its_undo_removes_it(
    db_session: AsyncSession, nina: Lead
) -> None:
    ctx = lead_ctx(db_session, "c1")
    args = {"lead": NINA, "new_status": "contacted", "reason": "Called her"}
    changed = await run(ctx, "update_lead_status", **args)
    assert changed["lead"]["score"] == 30 == await score_of(db_session, NINA)  # 25 + contacted 5
    history = (
        await db_session.scalars(select(LeadEvent).where(LeadEvent.lead_id == changed["lead"]["id"]))
    ).all()
    assert [(e.kind, e.previous_status, e.status, e.note) for e in history] == [
        ("status_changed", "new", "contacted", "Called her")
    ]
    back = await run(
        lead_ctx(db_session, "c2"), "update_lead_status", lead=NINA, new_status="new", reason="x"
    )
    assert back["lead"]["score"] == 15, "a step back costs 10"
    assert await undo(ctx, "update_lead_status", back, lead=NINA, new_status="new", reason="x") == "undone"
    assert await score_of(db_session, NINA) == 30, "the undone change left no history"


async def test_a_reply_raises_the_score_and_its_undo_lowers_it_again(
    db_session: AsyncSession, nina: Lead
) -> None:
    ctx = lead_ctx(db_session, "c1")
    reply = await run(ctx, "record_lead_reply", lead=NINA, summary="Wants a demo next week")
    assert reply["score"] == 40 == await score_of(db_session, NINA)  # 25 + one answer 15
    lead = await db_session.scalar(select(Lead).where(Lead.tenant_id == "acme", Lead.email == NINA))
    assert lead is not None and lead.last_engaged_at is not None
    args = {"lead": NINA, "summary": "Wants a demo next week"}
    assert await undo(ctx, "record_lead_reply", reply, **args) == "undone"
    assert await score_of(db_session, NINA) == 25
    assert await undo(ctx, "record_lead_reply", reply, **args) == "already_undone"
    refused = await failure(
        context(db_session, tenant="globex", user="dave"), "get_lead_score", lead=str(lead.id)
    )
    assert refused.code == "NOT_FOUND", "another tenant's lead is not found by id"


async def test_meetings_booked_count_by_type_and_cancelling_one_uncounts_it(
    db_session: AsyncSession, nina: Lead
) -> None:
    ctx = replace(context(db_session), call_id="c1")
    when = {"starts_at": "2026-12-20T10:00:00Z", "ends_at": "2026-12-20T10:30:00Z"}
    demo = await run(
        ctx, "create_event", title="Demo for Jane", attendees=["alice", NINA.upper()], type="demo", **when
    )
    assert demo["type"] == "demo" and await score_of(db_session, NINA) == 45  # 25 + a meeting 20
    deadline = await run(
        replace(ctx, call_id="c2"),
        "create_event",
        title="Quote due",
        attendees=[NINA],
        type="deadline",
        **when,
    )
    assert deadline["type"] == "deadline" and await score_of(db_session, NINA) == 45, (
        "a deadline is no meeting"
    )
    moved = await run(replace(ctx, call_id="c3"), "update_event", event=str(demo["id"]), type="reminder")
    assert moved["changed"] == {"type": "reminder"} and await score_of(db_session, NINA) == 25
    assert await undo(ctx, "update_event", moved, event=str(demo["id"]), type="reminder") == "undone"
    assert await score_of(db_session, NINA) == 45
    args = {"title": "Demo for Jane", "attendees": ["alice", NINA.upper()], "type": "demo", **when}
    assert await undo(ctx, "create_event", demo, **args) == "undone"
    assert await score_of(db_session, NINA) == 25
    default = await run(replace(ctx, call_id="c4"), "create_event", title="Sync", **when)
    assert default["type"] == "meeting"
    with pytest.raises(ValidationError, match="type"):
        args_of("create_event", title="Party", type="party", **when)
    with pytest.raises(IntegrityError, match="ck_calendar_events_type"):  # and the database agrees
        async with db_session.begin_nested():
            await db_session.execute(
                update(CalendarEvent).where(CalendarEvent.id == demo["id"]).values(type="x")
            )


async def test_a_draft_is_listed_read_edited_and_sent_once(db_session: AsyncSession) -> None:
    ctx = lead_ctx(db_session, "c1")
    draft = await run(ctx, "draft_email", to=JANE, subject="Hello", body="First", lead=JANE)
    listed = await run(ctx, "list_drafts")
    assert draft["draft_id"] in [d["draft_id"] for d in listed["drafts"]]
    edit = {"draft": draft["draft_id"], "body": "Second", "html_body": "<p onclick='x()'>Hi</p>"}
    edited = await run(lead_ctx(db_session, "c2"), "update_draft", **edit)
    assert edited["record"]["body"] == "Second" and "onclick" not in edited["record"]["html_body"]
    assert edited["previous"] == {"body": "First", "html_body": None}
    elsewhere = await failure(ctx, "update_draft", draft=draft["draft_id"], to="attacker@evil.example")
    assert elsewhere.code == "VALIDATION_ERROR", "a draft about a lead stays addressed to the lead"
    assert await undo(ctx, "update_draft", edited, **edit) == "undone"
    assert (await run(ctx, "get_draft", draft=draft["draft_id"]))["body"] == "First"

    send = lead_ctx(db_session, "c3")
    sent = await run(send, "send_draft", draft=draft["draft_id"])
    assert sent["status"] == "queued" and sent["to"] == JANE
    assert await run(send, "send_draft", draft=draft["draft_id"]) == sent, "a retried call finds its email"
    row = await db_session.get(EmailOutbox, sent["outbox_id"])
    assert row is not None and (row.body, row.lead_id) == ("First", draft["lead_id"])
    again = await failure(lead_ctx(db_session, "c4"), "send_draft", draft=draft["draft_id"])
    assert again.code == "CONFLICT"
    assert (await failure(ctx, "update_draft", draft=draft["draft_id"], body="late")).code == "CONFLICT"
    assert [d["draft_id"] for d in (await run(ctx, "list_drafts", state="sent"))["drafts"]] == [
        draft["draft_id"]
    ]

    assert await undo(send, "send_draft", sent, draft=draft["draft_id"]) == "undone"
    await db_session.refresh(row)
    stored = await db_session.get(EmailDraft, draft["draft_id"], populate_existing=True)
    assert row.status == "cancelled" and stored is not None and stored.sent_outbox_id is None
    other = await failure(
        context(db_session, tenant="globex", user="dave"), "get_draft", draft=draft["draft_id"]
    )
    assert other.code == "NOT_FOUND"


@pytest_asyncio.fixture
async def nina_committed(db_engine: AsyncEngine) -> AsyncIterator[tuple[int, int]]:
    """Nina as a committed lead with one saved draft to her, for a conversation; removed afterwards
    (with her emails and drafts, so no other test sees her)."""
    async with session_factory(db_engine)() as session, session.begin():
        lead = Lead(tenant_id="acme", email=NINA, name="Nina New", company="Newco", source="website")
        session.add(lead)
        await session.flush()
        await rescore(session, lead)
        draft = EmailDraft(
            tenant_id="acme",
            idempotency_key=f"test-draft-{lead.id}",
            created_by="alice",
            to_address=NINA,
            subject="Following up",
            body="Hi Nina, shall we talk next week?",
            lead_id=lead.id,
        )
        session.add(draft)
        await session.flush()
        ids = (lead.id, draft.id)
    yield ids
    async with session_factory(db_engine)() as session, session.begin():
        await session.execute(delete(EmailOutbox).where(EmailOutbox.lead_id == ids[0]))
        await session.execute(delete(EmailDraft).where(EmailDraft.lead_id == ids[0]))
        await session.execute(delete(Lead).where(Lead.id == ids[0]))


async def test_the_qualifier_reads_the_score_and_sends_a_saved_draft_after_approval(
    agent: AgentHarness, db_engine: AsyncEngine, smtp_server: SmtpServer, nina_committed: tuple[int, int]
) -> None:
    """The scripted model, through the openai client, asks for Nina's score, then sends her draft:
    the send waits for a reviewer, is delivered after the undo window, and the delivery raises her
    score in its own transaction (3 points for an email delivered)."""
    lead_id, draft_id = nina_committed
    agent.script(
        {
            "when": {"user_contains": "nina"},
            "reply": {"tool_calls": [{"name": "get_lead_score", "arguments": {"lead": NINA}}]},
        },
        {
            "when": {"after_tool": "get_lead_score"},
            "reply": {"tool_calls": [{"name": "send_draft", "arguments": {"draft": draft_id}}]},
        },
        {"when": {"after_tool": "send_draft"}, "reply": {"content": "sent"}},
    )
    handle = await agent.start("score nina and send her the draft", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    assert waiting.tool == "send_draft"
    decision = Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    await execute_update(handle, AgentWorkflow.decide, decision)
    await handle.result()

    results = {m.name: m.content for m in await agent.transcript(handle) if m.role == "tool"}
    assert '"score":25' in (results["get_lead_score"] or "").replace(" ", "")
    assert [m["Subject"] for m in smtp_server.messages] == ["Following up"]
    async with session_factory(db_engine)() as session:
        lead = await session.get(Lead, lead_id)
        draft = await session.get(EmailDraft, draft_id)
        assert lead is not None and lead.score == 28 and lead.last_engaged_at is not None
        assert draft is not None and draft.sent_outbox_id is not None
        outbox = await session.get(EmailOutbox, draft.sent_outbox_id)
        assert outbox is not None and outbox.status == "sent"


async def starter(database_url: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await run_starter(*args, env={"DATABASE_URL": database_url, "COUNTERSIGN_DATA_DIR": str(data_dir)})


async def test_a_person_reads_the_score_and_lists_reads_and_edits_drafts_from_the_cli(
    database_url: str, nina_committed: tuple[int, int], tmp_path: Path
) -> None:
    _, draft_id = nina_committed
    scored = await starter(database_url, tmp_path, "leads", "score", NINA, "--tenant", "acme")
    assert scored.returncode == 0, scored.stderr
    assert f"{NINA} (new): 25/100" in scored.stdout and "source: website" in scored.stdout
    assert (
        await starter(database_url, tmp_path, "leads", "score", NINA, "--tenant", "globex")
    ).returncode == 1

    listed = await starter(database_url, tmp_path, "drafts", "list", "--tenant", "acme", "--json")
    assert draft_id in [d["draft_id"] for d in json.loads(listed.stdout)]
    edit = ("drafts", "edit", str(draft_id), "--tenant", "acme")
    edited = await starter(database_url, tmp_path, *edit, "--body", "Edited by hand")
    assert edited.returncode == 0 and "Edited by hand" in edited.stdout, edited.stderr
    shown = await starter(database_url, tmp_path, "drafts", "show", str(draft_id), "--tenant", "acme")
    assert "Edited by hand" in shown.stdout and "not sent" in shown.stdout
    misdirected = await starter(database_url, tmp_path, *edit, "--to", "x@evil.example")
    assert misdirected.returncode == 1 and "the lead's own address" in misdirected.stderr
    other = await starter(database_url, tmp_path, "drafts", "show", str(draft_id), "--tenant", "globex")
    assert other.returncode == 1 and "NOT_FOUND" in other.stderr


async def test_a_person_lists_reads_and_edits_drafts_through_the_server(
    auth_inbox: AuthInbox, nina_committed: tuple[int, int]
) -> None:
    """The inbox's session, the tenant's drafts only, the same checks as update_draft; no send route."""
    _, draft_id = nina_committed
    alice = await token(auth_inbox, "alice")
    path = f"/api/drafts/{draft_id}"
    status, listed, _ = await auth_inbox.call("GET", "/api/drafts", alice)
    assert status == 200 and draft_id in [d["draft_id"] for d in listed["drafts"]]
    status, edited, _ = await auth_inbox.call("PATCH", path, alice, {"subject": "Next week?"})
    assert status == 200 and edited["subject"] == "Next week?", edited
    status, shown, _ = await auth_inbox.call("GET", path, alice)
    assert (status, shown["subject"], shown["sent_outbox_id"]) == (200, "Next week?", None)
    assert (await auth_inbox.call("PATCH", path, alice, {"to": "x@evil.example"}))[0] == 400
    assert (await auth_inbox.call("PATCH", path, alice, {}))[0] == 400
    assert (await auth_inbox.call("PATCH", path, alice, {"subject": "a\nBcc: x@evil.example"}))[0] == 400
    assert (await auth_inbox.call("PATCH", path, alice, {"status": "sent"}))[0] == 400  # unknown key
    assert (await auth_inbox.call("GET", "/api/drafts?state=nope", alice))[0] == 400
    assert (await auth_inbox.call("GET", "/api/drafts?limit=" + "9" * 5000, alice))[0] == 400  # not int()ed
    assert (await auth_inbox.call("GET", "/api/drafts/" + "9" * 30, alice))[0] == 404  # past BIGINT
    assert (await auth_inbox.call("POST", path + "/send", alice, {}))[0] in (404, 405)
    dave = await token(auth_inbox, "dave", "globex")
    assert (await auth_inbox.call("GET", path, dave))[0] == 404
    assert (await auth_inbox.call("PATCH", path, dave, {"subject": "mine now"}))[0] == 404
    assert (await auth_inbox.call("GET", "/api/drafts", None))[0] == 401
    async with session_factory(auth_inbox.engine)() as session, session.begin():
        draft = await session.get(EmailDraft, draft_id)
        assert draft is not None
        draft.sent_outbox_id = 1  # as send_draft leaves it
    assert (await auth_inbox.call("PATCH", path, alice, {"subject": "late"}))[0] == 409
