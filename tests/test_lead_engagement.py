"""Lead scores kept current by the tools that record engagement, in their own transaction; drafts found,
edited and sent again; calendar event types. Tools called directly on the seeded PostgreSQL."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.db.schema import EmailDraft, EmailOutbox, Lead, LeadEvent
from tests.test_approvals import JANE
from tests.test_tools_catalog import context, failure, run, undo
from tools.registry import ToolContext

JOHN = "john.smith@initech.example"


async def score_of(session: AsyncSession, email: str, tenant: str = "acme") -> int | None:
    return await session.scalar(
        select(Lead.score)
        .where(Lead.tenant_id == tenant, Lead.email == email)
        .execution_options(populate_existing=True)
    )


def lead_ctx(session: AsyncSession, call_id: str) -> ToolContext:
    return replace(context(session, agent="lead-qualifier"), call_id=call_id)


async def test_the_seed_computes_scores_and_the_tool_shows_their_parts(db_session: AsyncSession) -> None:
    ctx = lead_ctx(db_session, "c1")
    john = await run(ctx, "get_lead_score", lead=JOHN)
    parts = {part["name"]: part["points"] for part in john["parts"]}
    # referral, company, contacted, and the seeded intro call (a "call" event with John as attendee)
    assert parts["source"] == 25 and parts["meetings_booked"] == 20 and parts["status"] == 5
    assert john["score"] == sum(parts.values()) == 60 == await score_of(db_session, JOHN)
    assert (await run(ctx, "get_lead_score", lead="li.wei@hooli.example"))["score"] == 0  # disqualified


async def test_a_status_change_is_history_and_its_undo_removes_it(db_session: AsyncSession) -> None:
    ctx = lead_ctx(db_session, "c1")
    args = {"lead": JANE, "new_status": "contacted", "reason": "Called her"}
    changed = await run(ctx, "update_lead_status", **args)
    assert changed["lead"]["score"] == 30 == await score_of(db_session, JANE)  # 25 + contacted 5
    history = (
        await db_session.scalars(select(LeadEvent).where(LeadEvent.lead_id == changed["lead"]["id"]))
    ).all()
    assert [(e.kind, e.previous_status, e.status, e.note) for e in history] == [
        ("status_changed", "new", "contacted", "Called her")
    ]
    back = await run(
        lead_ctx(db_session, "c2"), "update_lead_status", lead=JANE, new_status="new", reason="x"
    )
    assert back["lead"]["score"] == 15, "a step back costs 10"
    assert await undo(ctx, "update_lead_status", back, lead=JANE, new_status="new", reason="x") == "undone"
    assert await score_of(db_session, JANE) == 30, "the undone change left no history"


async def test_a_reply_raises_the_score_and_its_undo_lowers_it_again(db_session: AsyncSession) -> None:
    ctx = lead_ctx(db_session, "c1")
    reply = await run(ctx, "record_lead_reply", lead=JANE, summary="Wants a demo next week")
    assert reply["score"] == 40 == await score_of(db_session, JANE)  # 25 + one answer 15
    lead = await db_session.scalar(select(Lead).where(Lead.tenant_id == "acme", Lead.email == JANE))
    assert lead is not None and lead.last_engaged_at is not None
    args = {"lead": JANE, "summary": "Wants a demo next week"}
    assert await undo(ctx, "record_lead_reply", reply, **args) == "undone"
    assert await score_of(db_session, JANE) == 25
    assert await undo(ctx, "record_lead_reply", reply, **args) == "already_undone"
    refused = await failure(
        context(db_session, tenant="globex", user="dave"), "get_lead_score", lead=str(lead.id)
    )
    assert refused.code == "NOT_FOUND", "another tenant's lead is not found by id"


async def test_meetings_booked_count_by_type_and_cancelling_one_uncounts_it(db_session: AsyncSession) -> None:
    ctx = replace(context(db_session), call_id="c1")
    when = {"starts_at": "2026-12-20T10:00:00Z", "ends_at": "2026-12-20T10:30:00Z"}
    demo = await run(
        ctx, "create_event", title="Demo for Jane", attendees=["alice", JANE.upper()], type="demo", **when
    )
    assert demo["type"] == "demo" and await score_of(db_session, JANE) == 45  # 25 + a meeting 20
    deadline = await run(
        replace(ctx, call_id="c2"),
        "create_event",
        title="Quote due",
        attendees=[JANE],
        type="deadline",
        **when,
    )
    assert deadline["type"] == "deadline" and await score_of(db_session, JANE) == 45, (
        "a deadline is no meeting"
    )
    moved = await run(replace(ctx, call_id="c3"), "update_event", event=str(demo["id"]), type="reminder")
    assert moved["changed"] == {"type": "reminder"} and await score_of(db_session, JANE) == 25
    assert await undo(ctx, "update_event", moved, event=str(demo["id"]), type="reminder") == "undone"
    assert await score_of(db_session, JANE) == 45
    args = {"title": "Demo for Jane", "attendees": ["alice", JANE.upper()], "type": "demo", **when}
    assert await undo(ctx, "create_event", demo, **args) == "undone"
    assert await score_of(db_session, JANE) == 25
    default = await run(replace(ctx, call_id="c4"), "create_event", title="Sync", **when)
    assert default["type"] == "meeting"


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
