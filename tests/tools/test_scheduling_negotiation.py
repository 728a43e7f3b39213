"""Scheduling negotiation: schedule_meeting opens a 30-minute session with proposals in business
hours of both people's zones, notifies and emails the counterpart; confirm_meeting books a selection
or a custom time under the calendar lock and invites both. Tools against the seeded PostgreSQL, and
the whole negotiation through the real workflow (time-skipping server, scripted model over HTTP,
real SMTP server)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from activities.tools import EffectChanged, approved_plan
from countersign.core.contract import EndConversation, SubmitMessage
from countersign.core.effects import Effect
from countersign.db import schema
from countersign.db.engine import session_factory
from countersign.db.seed import seed
from tests.fixtures.agent import AgentHarness
from tests.fixtures.smtp import SmtpServer
from tests.fixtures.updates import execute_update
from tests.tools.test_tools_catalog import NOW, args_of, call, context, failure, run, undo
from tools import REGISTRY
from tools.registry import Needs, ToolContext
from workflows.agent import AgentWorkflow

MONDAY = {"window_start": "2026-12-07T00:00:00Z", "window_end": "2026-12-08T00:00:00Z"}


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


async def outbox(session: AsyncSession, ids: list[int]) -> list[schema.EmailOutbox]:
    rows = await session.scalars(select(schema.EmailOutbox).where(schema.EmailOutbox.id.in_(ids)))
    return sorted(rows, key=lambda r: r.id)


# --- proposals in each person's zone ---------------------------------------------------------------


async def test_proposals_fit_business_hours_in_both_zones(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    # Berlin is UTC+1 in December: its 09:00-17:00 is 08:00-16:00 UTC; alice works 09:00-17:00 UTC.
    berlin = await run(
        ctx,
        "schedule_meeting",
        **{"with": "Priya Nair", "duration_minutes": 60, "tz_hint": "Europe/Berlin"} | MONDAY,
    )
    assert (berlin["user_time_zone"], berlin["counterpart_time_zone"]) == ("UTC", "Europe/Berlin")
    assert 1 <= len(berlin["slots"]) <= 5
    for i, slot in enumerate(berlin["slots"], start=1):
        start, end = utc(slot["starts_at"]), utc(slot["ends_at"])
        assert slot["index"] == i and slot["time_zone"] == "Europe/Berlin"
        assert start.hour >= 9 and (end.hour, end.minute) <= (16, 0), slot
        assert slot["counterpart_local"].startswith(f"Mon 2026-12-07 {start.hour + 1:02d}:")
        assert slot["counterpart_local"].endswith("Europe/Berlin")
    # Tokyo's working day (00:00-08:00 UTC) never meets alice's: nothing to propose, no session
    tokyo = await run(
        ctx,
        "schedule_meeting",
        **{"with": "Priya Nair", "duration_minutes": 30, "tz_hint": "Asia/Tokyo"} | MONDAY,
    )
    assert tokyo["slots"] == [] and tokyo["session"] is None and tokyo["outbox_ids"] == []


async def test_users_zones_come_from_the_database(db_session: AsyncSession) -> None:
    dave = context(db_session, tenant="globex", user="dave", agent="scheduler")
    # dave works in London (UTC in December), erin in New York (14:00-22:00 UTC): 14:00-17:00 UTC
    # remains. A tz_hint does not override a user's own zone.
    found = await run(
        dave, "schedule_meeting", **{"with": "erin", "duration_minutes": 30, "tz_hint": "Asia/Tokyo"} | MONDAY
    )
    assert (found["user_time_zone"], found["counterpart_time_zone"]) == ("Europe/London", "America/New_York")
    assert found["slots"]
    for slot in found["slots"]:
        assert 14 <= utc(slot["starts_at"]).hour and utc(slot["ends_at"]) <= datetime(
            2026, 12, 7, 17, tzinfo=UTC
        )
        assert "America/New_York" in slot["counterpart_local"] and "Europe/London" in slot["user_local"]


def test_a_time_zone_hint_must_be_an_iana_name() -> None:
    for bad in ("Mars/Olympus", "../../etc/passwd", "UTC+2", ""):
        with pytest.raises(ValidationError, match="IANA"):
            args_of("schedule_meeting", **{"with": "bob", "duration_minutes": 30, "tz_hint": bad})


# --- the session, the notification, the email ------------------------------------------------------


async def propose(ctx: ToolContext, who: str = "bob") -> dict[str, Any]:
    return await run(
        ctx, "schedule_meeting", **{"with": who, "duration_minutes": 30, "title": "Pricing"} | MONDAY
    )


async def test_a_proposal_opens_a_session_and_tells_the_counterpart(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    proposed = await propose(ctx)
    assert proposed["status"] == "queued" and proposed["expires_at"] == "2026-12-07T08:30:00Z"  # NOW + 30 min
    session = await db_session.get(schema.MeetingSession, proposed["session"])
    assert session is not None and session.status == "open" and session.requested_by == "alice"
    assert [p["starts_at"] for p in session.proposals] == [s["starts_at"] for s in proposed["slots"]]

    notification = await db_session.get(schema.Notification, proposed["notification_id"])
    assert notification is not None
    assert (notification.user_id, notification.kind, notification.status) == (
        "bob",
        "meeting_proposal",
        "open",
    )
    (email,) = await outbox(db_session, proposed["outbox_ids"])
    assert (email.to_address, email.status) == ("bob@acme.example", "queued")
    assert "Meeting request from Alice Anders: Pricing" == email.subject
    assert proposed["slots"][0]["counterpart_local"] in email.body

    args = {"with": "bob", "duration_minutes": 30, "title": "Pricing"} | MONDAY
    assert await undo(ctx, "schedule_meeting", proposed, **args) == "undone"
    assert session.status == "cancelled"
    assert await db_session.get(schema.Notification, proposed["notification_id"]) is None
    assert (await outbox(db_session, proposed["outbox_ids"]))[0].status == "cancelled"


# --- the effect a reviewer approves does not move with the clock ------------------------------------

ASKED = datetime(2026, 12, 7, 10, 20, tzinfo=UTC)  # the call is put to a reviewer at 10:20 on Monday
DEFAULT_WINDOW = {"with": "bob", "duration_minutes": 30, "title": "Pricing"}


async def test_an_approval_across_a_half_hour_runs_the_times_approved(db_session: AsyncSession) -> None:
    """The reviewer is shown the proposals at 10:20 and approves; the call runs at 10:40, past the
    10:30 step that candidate slots are counted from. It proposes the times approved: the default
    window starts from when the call was asked, not from when it runs."""
    tool, args = REGISTRY["schedule_meeting"], args_of("schedule_meeting", **DEFAULT_WINDOW)
    asked = replace(context(db_session, agent="scheduler"), now=ASKED, asked_at=ASKED)
    approved = (await tool.plan(asked, args)).effect()
    shown = approved.creates[0].fields["slots"]
    assert isinstance(shown, list) and shown[0] == "Mon 2026-12-07 11:30-12:00 UTC"  # an hour after 10:20

    runs = replace(asked, now=ASKED + timedelta(minutes=20))
    assert (await approved_plan(tool, runs, args, approved.digest))[1] == approved
    ran = await run(runs, "schedule_meeting", **DEFAULT_WINDOW)
    assert [slot["counterpart_local"] for slot in ran["slots"]] == shown
    # anchored at the run's own clock instead, the same call would be another effect
    unanchored = (await tool.plan(replace(runs, asked_at=None), args)).effect()
    assert unanchored.digest != approved.digest


async def test_a_proposed_time_taken_or_begun_since_the_approval_is_a_changed_effect(
    db_session: AsyncSession,
) -> None:
    tool, args = REGISTRY["schedule_meeting"], args_of("schedule_meeting", **DEFAULT_WINDOW)
    asked = replace(context(db_session, agent="scheduler"), now=ASKED, asked_at=ASKED)
    approved = (await tool.plan(asked, args)).effect()
    first = datetime(2026, 12, 7, 11, 30, tzinfo=UTC)
    # the first time has begun when the call runs: it is no longer proposed
    with pytest.raises(EffectChanged) as begun:
        await approved_plan(tool, replace(asked, now=first + timedelta(minutes=1)), args, approved.digest)
    assert "11:30" not in json.dumps(begun.value.effect.model_dump(mode="json"))
    # the first time was booked by someone else meanwhile
    db_session.add(
        schema.CalendarEvent(
            tenant_id="acme",
            title="Booked meanwhile",
            starts_at=first,
            ends_at=first + timedelta(minutes=30),
            attendees=["bob"],
            owner_user_id="bob",
        )
    )
    await db_session.flush()
    with pytest.raises(EffectChanged):
        await approved_plan(tool, replace(asked, now=ASKED + timedelta(minutes=5)), args, approved.digest)


# --- confirming ------------------------------------------------------------------------------------


async def test_confirm_a_selection_books_it_invites_both_and_closes_the_session(
    db_session: AsyncSession,
) -> None:
    ctx = context(db_session, agent="scheduler")
    proposed = await propose(ctx)
    confirm = replace(ctx, call_id="call-2")
    booked = await run(confirm, "confirm_meeting", session=proposed["session"], selection=2)
    second = proposed["slots"][1]
    assert (booked["starts_at"], booked["ends_at"]) == (second["starts_at"], second["ends_at"])
    assert booked["title"] == "Pricing" and booked["attendees"] == ["alice", "bob"]
    assert booked["invited"] == ["alice@acme.example", "bob@acme.example"] and booked["delivery"] == "queued"
    invites = await outbox(db_session, booked["outbox_ids"])
    assert [i.to_address for i in invites] == booked["invited"]
    assert all(i.subject == "Invitation: Pricing" and i.status == "queued" for i in invites)
    session = await db_session.get(schema.MeetingSession, proposed["session"])
    assert session is not None and (session.status, session.event_id) == ("confirmed", booked["id"])
    # the booking answered bob's proposal notification, and tells him who booked what
    proposal_note = await db_session.get(schema.Notification, proposed["notification_id"])
    assert proposal_note is not None and (proposal_note.status, proposal_note.resolved_by) == (
        "resolved",
        "alice",
    )
    told = await db_session.get(schema.Notification, booked["notified"])
    assert told is not None and (told.user_id, told.kind) == ("bob", "meeting_booked")
    assert told.message.startswith("Alice Anders booked 'Pricing': Mon 2026-12-07")

    again = await failure(
        replace(ctx, call_id="call-3"), "confirm_meeting", session=proposed["session"], selection=1
    )
    assert again.code == "CONFLICT" and "already booked" in again.message

    # undo: the event is cancelled, the invites too, and the session can be confirmed again
    assert (
        await undo(confirm, "confirm_meeting", booked, session=proposed["session"], selection=2) == "undone"
    )
    assert (await db_session.get(schema.CalendarEvent, booked["id"])).status == "cancelled"  # type: ignore[union-attr]
    assert [i.status for i in await outbox(db_session, booked["outbox_ids"])] == ["cancelled", "cancelled"]
    assert (session.status, session.event_id) == ("open", None)
    assert (proposal_note.status, proposal_note.resolved_by) == ("open", None)
    assert await db_session.get(schema.Notification, booked["notified"]) is None


async def test_confirm_a_custom_time_rechecks_both_calendars(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    proposed = await propose(ctx)
    confirm = replace(ctx, call_id="call-2")
    # 09:00 on Monday is the standup both attend: the re-check refuses it
    clash = await failure(
        confirm, "confirm_meeting", session=proposed["session"], starts_at="2026-12-07T09:00:00Z"
    )
    assert clash.code == "CONFLICT"
    custom = await run(
        confirm, "confirm_meeting", session=proposed["session"], starts_at="2026-12-07T16:30:00Z"
    )
    assert (custom["starts_at"], custom["ends_at"]) == ("2026-12-07T16:30:00Z", "2026-12-07T17:00:00Z")


async def test_a_proposal_taken_in_the_meantime_is_refused(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    proposed = await propose(ctx)
    first = proposed["slots"][0]
    db_session.add(
        schema.CalendarEvent(
            tenant_id="acme",
            title="Booked meanwhile",
            starts_at=utc(first["starts_at"]),
            ends_at=utc(first["ends_at"]),
            attendees=["bob"],
            owner_user_id="bob",
        )
    )
    await db_session.flush()
    refused = await failure(
        replace(ctx, call_id="call-2"), "confirm_meeting", session=proposed["session"], selection=1
    )
    assert refused.code == "CONFLICT"


async def test_an_expired_session_answers_needs(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    proposed = await propose(ctx)
    late = replace(ctx, call_id="call-2", now=NOW + timedelta(minutes=30))
    answer = await call(late, "confirm_meeting", session=proposed["session"], selection=1)
    assert isinstance(answer, Needs) and answer.fields == {"session": True}
    (candidate,) = answer.candidates
    assert candidate["session"] == proposed["session"] and candidate["state"].startswith("expired at")
    assert "schedule_meeting" in candidate["next"]
    in_time = replace(ctx, call_id="call-3", now=NOW + timedelta(minutes=29))
    assert (await run(in_time, "confirm_meeting", session=proposed["session"], selection=1))[
        "status"
    ] == "confirmed"


async def test_only_the_requester_may_confirm_their_session(db_session: AsyncSession) -> None:
    proposed = await propose(context(db_session, agent="scheduler"))
    bob = context(db_session, user="bob", agent="scheduler")
    assert (
        await failure(bob, "confirm_meeting", session=proposed["session"], selection=1)
    ).code == "NOT_FOUND"
    dave = context(db_session, tenant="globex", user="dave", agent="scheduler")
    assert (
        await failure(dave, "confirm_meeting", session=proposed["session"], selection=1)
    ).code == "NOT_FOUND"


# --- the scheduler's first hour, repeatable (issue 41) ------------------------------------------------

SMITH = {"with": "John Smith", "duration_minutes": 30, "title": "Security questionnaire"} | MONDAY
SMITH_AT_TEN = {
    "with": "John Smith",
    "starts_at": "2026-12-07T10:00:00Z",
    "duration_minutes": 30,
    "title": "Security questionnaire",
}


async def previewed(ctx: ToolContext, tool: str, raw: dict[str, Any]) -> Effect:
    return (await REGISTRY[tool].plan(ctx, args_of(tool, **raw))).effect()


async def test_asking_again_while_a_session_is_open_answers_it(db_session: AsyncSession) -> None:
    """Asked twice, "Find a slot with John Smith": the second answers the open session, sends nothing again
    (he has those times already), and its undo leaves the first call's session alone."""
    ctx = context(db_session, agent="scheduler")
    first = await run(ctx, "schedule_meeting", **SMITH)
    again_ctx = replace(ctx, call_id="call-2", now=NOW + timedelta(minutes=10))
    effect = await previewed(again_ctx, "schedule_meeting", SMITH)
    assert effect.changes_nothing and f"proposal {first['session']}" in effect.summary
    notes = await db_session.scalar(select(func.count()).select_from(schema.Notification))
    emails = await db_session.scalar(select(func.count()).select_from(schema.EmailOutbox))
    again = await run(again_ctx, "schedule_meeting", **SMITH)
    assert again["status"] == "still_open" and again["outbox_ids"] == []
    assert {k: again[k] for k in ("session", "slots", "expires_at", "notification_id")} == {
        k: first[k] for k in ("session", "slots", "expires_at", "notification_id")
    }
    assert await db_session.scalar(select(func.count()).select_from(schema.Notification)) == notes
    assert await db_session.scalar(select(func.count()).select_from(schema.EmailOutbox)) == emails
    assert await undo(again_ctx, "schedule_meeting", again, **SMITH) == "never_happened"
    session = await db_session.get(schema.MeetingSession, first["session"])
    assert session is not None and session.status == "open"
    # another length is another request: that one is still refused while the session is open
    longer = await failure(again_ctx, "schedule_meeting", **SMITH | {"duration_minutes": 60})
    assert longer.code == "CONFLICT" and f"session {first['session']}" in longer.message


async def test_a_booking_with_the_same_person_closes_their_session(db_session: AsyncSession) -> None:
    """The scripted "Book the 10:00 slot" books with `with` and `starts_at`, not naming the
    session: it still answers that negotiation (session confirmed, its notification resolved), so
    the next "Find a slot" proposes afresh around the booking; undoing the booking reopens it."""
    ctx = context(db_session, agent="scheduler")
    proposed = await run(ctx, "schedule_meeting", **SMITH)
    book = replace(ctx, call_id="call-2")
    effect = await previewed(book, "confirm_meeting", SMITH_AT_TEN)
    assert next((c.kind, c.id, c.fields["status"].after) for c in effect.changes) == (
        "meeting proposal",
        str(proposed["session"]),
        "confirmed",
    )
    booked = await run(book, "confirm_meeting", **SMITH_AT_TEN)
    assert booked["session"] == proposed["session"]
    session = await db_session.get(schema.MeetingSession, proposed["session"])
    assert session is not None and (session.status, session.event_id) == ("confirmed", booked["id"])
    note = await db_session.get(schema.Notification, proposed["notification_id"])
    assert note is not None and note.status == "resolved"

    afresh = await run(replace(ctx, call_id="call-3"), "schedule_meeting", **SMITH)
    assert afresh["status"] == "queued" and afresh["session"] != proposed["session"]
    assert "2026-12-07T10:00:00Z" not in [slot["starts_at"] for slot in afresh["slots"]]

    assert await undo(book, "confirm_meeting", booked, **SMITH_AT_TEN) == "undone"
    assert (session.status, session.event_id) == ("open", None)


async def test_a_booking_outside_every_open_window_leaves_the_sessions_alone(
    db_session: AsyncSession,
) -> None:
    ctx = context(db_session, agent="scheduler")
    proposed = await run(ctx, "schedule_meeting", **SMITH)
    later = SMITH_AT_TEN | {"starts_at": "2026-12-09T10:00:00Z"}  # Wednesday: outside Monday's window
    booked = await run(replace(ctx, call_id="call-2"), "confirm_meeting", **later)
    assert booked["session"] is None
    session = await db_session.get(schema.MeetingSession, proposed["session"])
    assert session is not None and session.status == "open"


async def test_seed_reset_clears_the_schedulers_state(database_url: str, db_engine: AsyncEngine) -> None:
    """After "Find a slot", "Book the 10:00 slot" and "Find a slot" again, `db seed --reset` cancels
    the sessions, the booking they made and their notifications: the same commands run as first."""
    sessions = session_factory(db_engine)
    results: list[dict[str, Any]] = []

    async def step(tool: str, call_id: str, raw: dict[str, Any]) -> dict[str, Any]:
        async with sessions() as session, session.begin():
            ctx = replace(context(session, agent="scheduler"), workflow_id="wf-reset", call_id=call_id)
            results.append(await run(ctx, tool, **raw))
        return results[-1]

    try:
        proposed = await step("schedule_meeting", "c1", SMITH)
        booked = await step("confirm_meeting", "c2", SMITH_AT_TEN)
        open_again = await step("schedule_meeting", "c3", SMITH)
        await seed(database_url, reset=True)
        async with sessions() as session:
            ids = [proposed["session"], open_again["session"]]
            found = await session.scalars(
                select(schema.MeetingSession).where(schema.MeetingSession.id.in_(ids))
            )
            assert {row.status for row in found} == {"cancelled"}
            event = await session.get(schema.CalendarEvent, booked["id"])
            assert event is not None and event.status == "cancelled"
            note = await session.get(schema.Notification, open_again["notification_id"])
            assert note is not None and note.status == "resolved"
        first_again = await step("schedule_meeting", "c4", SMITH)
        assert first_again["status"] == "queued" and first_again["slots"] == proposed["slots"]
        assert (await step("confirm_meeting", "c5", SMITH_AT_TEN))["status"] == "confirmed"
    finally:
        async with db_engine.begin() as conn:
            key = schema.MeetingSession.idempotency_key
            await conn.execute(delete(schema.MeetingSession).where(key.like("wf-reset:%")))
            events = [r["id"] for r in results if "attendees" in r]
            await conn.execute(delete(schema.CalendarEvent).where(schema.CalendarEvent.id.in_(events)))
            notes = [r[k] for r in results for k in ("notification_id", "notified") if r.get(k)]
            await conn.execute(delete(schema.Notification).where(schema.Notification.id.in_(notes)))
            emails = [i for r in results for i in r["outbox_ids"]]
            await conn.execute(delete(schema.EmailOutbox).where(schema.EmailOutbox.id.in_(emails)))
        await seed(database_url, reset=True)  # the leads' scores, rescored with the bookings gone


def test_confirm_arguments_name_the_time_one_way() -> None:
    for bad in (
        {"session": 1},
        {"session": 1, "selection": 1, "starts_at": "2026-12-07T10:00:00Z"},
        {"session": 1, "selection": 1, "with": "bob"},
        {"selection": 1, "with": "bob", "starts_at": "2026-12-07T10:00:00Z", "duration_minutes": 30},
        {"session": 1, "selection": 6},
    ):
        with pytest.raises(ValidationError):
            args_of("confirm_meeting", **bad)


# --- through the workflow --------------------------------------------------------------------------


async def test_negotiation_through_the_workflow_emails_proposals_then_invites(
    agent: AgentHarness, db_engine: AsyncEngine, smtp_server: SmtpServer, scratch: list[str]
) -> None:
    window = {"window_start": "2031-03-03T00:00:00Z", "window_end": "2031-03-04T00:00:00Z"}
    agent.script(
        {
            "when": {"user_contains": "meet bob"},
            "reply": {
                "tool_calls": [
                    {
                        "name": "schedule_meeting",
                        "arguments": {"with": "bob", "duration_minutes": 30, **window},
                    }
                ]
            },
        },
        {"when": {"after_tool": "schedule_meeting"}, "reply": {"content": "Proposed five times to Bob."}},
    )
    handle = await agent.start("meet bob on Monday", agent="scheduler")
    first = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert first is not None and first.reply == "[scripted model] Proposed five times to Bob."
    transcript = await agent.transcript(handle)
    proposal = json.loads([m for m in transcript if m.role == "tool"][-1].content or "")["data"]
    assert len(proposal["slots"]) == 5 and proposal["session"] is not None

    agent.script(
        {
            "when": {"user_contains": "second"},
            "reply": {
                "tool_calls": [
                    {"name": "confirm_meeting", "arguments": {"session": proposal["session"], "selection": 2}}
                ]
            },
        },
        {"when": {"after_tool": "confirm_meeting"}, "reply": {"content": "Booked."}},
    )
    await handle.signal(
        AgentWorkflow.submit_message, SubmitMessage(user_id="alice", text="bob takes the second")
    )
    second = await execute_update(handle, AgentWorkflow.wait_turn, 2)
    assert second is not None and second.reply == "[scripted model] Booked."
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()  # the time-skipping server jumps both undo windows; every email is delivered

    async with db_engine.connect() as conn:
        event = (
            await conn.execute(
                select(schema.CalendarEvent.starts_at, schema.CalendarEvent.attendees).where(
                    schema.CalendarEvent.starts_at == utc(proposal["slots"][1]["starts_at"]),
                    schema.CalendarEvent.status == "confirmed",
                )
            )
        ).one()
        session_status = await conn.scalar(
            select(schema.MeetingSession.status).where(schema.MeetingSession.id == proposal["session"])
        )
    assert event.attendees == ["alice", "bob"] and session_status == "confirmed"
    sent = sorted((m["To"], m["Subject"]) for m in smtp_server.messages)
    assert sent == [
        ("alice@acme.example", "Invitation: Meeting: Alice Anders / Bob Brennan"),
        ("bob@acme.example", "Invitation: Meeting: Alice Anders / Bob Brennan"),
        ("bob@acme.example", "Meeting request from Alice Anders"),
    ]
