"""Scheduling, the counterpart's side and the agent's questions: a user accepts a proposal addressed
to them through their own agent (accept_meeting), people see and resolve their notifications
(list_notifications, resolve_notification, `notifications list|resolve`), a second proposal while
one is open is a CONFLICT naming it, and a missing length or person answers `needs`.

Tools against the seeded PostgreSQL; the CLI as a subprocess; and two users' conversations through
the real workflow (time-skipping server, scripted model over HTTP via the openai client, SMTP)."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.core.contract import EndConversation, SubmitMessage
from countersign.db import schema
from countersign.runtime.config import PROJECT_ROOT
from countersign.scripted_model.scenario import load_scenario
from tests.fixtures.agent import AgentHarness
from tests.fixtures.cli import run_starter
from tests.fixtures.smtp import SmtpServer
from tests.fixtures.updates import execute_update
from tests.tools.test_scheduling_negotiation import MONDAY, propose, utc
from tests.tools.test_tools_catalog import NOW, args_of, call, context, failure, run, undo
from tools.registry import Needs, ToolContext
from workflows.agent import AgentWorkflow

TUESDAY = {"window_start": "2026-12-08T00:00:00Z", "window_end": "2026-12-09T00:00:00Z"}


def bob(session: AsyncSession, call_id: str = "bob-1") -> ToolContext:
    return replace(context(session, user="bob", agent="scheduler"), workflow_id="wf-bob", call_id=call_id)


# --- needs: what only the user can say -------------------------------------------------------------


async def test_a_missing_length_or_person_answers_needs(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    no_length = await call(ctx, "schedule_meeting", **{"with": "bob"} | MONDAY)
    assert isinstance(no_length, Needs) and no_length.fields == {"duration_minutes": True}
    nothing = await call(ctx, "schedule_meeting", **MONDAY)
    assert isinstance(nothing, Needs) and nothing.fields == {"with": True, "duration_minutes": True}
    which = await call(ctx, "schedule_meeting", **{"with": "Sam Lee", "duration_minutes": 30} | MONDAY)
    assert isinstance(which, Needs) and which.fields == {"with": True}
    assert sorted(c["email"] for c in which.candidates) == [
        "sam.lee@initech.example",
        "samuel.lee@umbrella.example",
    ]
    agreed = await call(ctx, "confirm_meeting", **{"with": "bob", "starts_at": "2026-12-07T16:00:00Z"})
    assert isinstance(agreed, Needs) and agreed.fields == {"duration_minutes": True}
    # nothing was opened by any of them
    assert (
        await db_session.scalar(
            select(schema.MeetingSession.id).where(schema.MeetingSession.requested_by == "alice")
        )
        is None
    )


def test_the_length_is_5_to_240_minutes() -> None:
    for tool in ("schedule_meeting", "confirm_meeting"):
        base = (
            {"with": "bob"}
            if tool == "schedule_meeting"
            else {"with": "bob", "starts_at": "2026-12-07T16:00:00Z"}
        )
        for ok in (5, 240):
            assert args_of(tool, **base, duration_minutes=ok).duration_minutes == ok  # type: ignore[attr-defined]
        for bad in (4, 241):
            with pytest.raises(ValidationError):
                args_of(tool, **base, duration_minutes=bad)


# --- a duplicate proposal --------------------------------------------------------------------------


async def test_a_second_proposal_while_one_is_open_is_a_conflict_naming_it(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    first = await propose(ctx)
    again = await failure(
        replace(ctx, call_id="call-2"),
        "schedule_meeting",
        **{"with": "Bob Brennan", "duration_minutes": 60} | MONDAY,
    )
    assert (
        again.code == "CONFLICT"
        and f"session {first['session']} with Bob Brennan is still open" in again.message
    )
    # a retry of the first call is not a duplicate of itself: it finds its own session
    assert (await propose(ctx))["session"] == first["session"]
    # another window, another counterpart, another requester: no conflict
    assert (
        await run(
            replace(ctx, call_id="call-3"),
            "schedule_meeting",
            **{"with": "bob", "duration_minutes": 30} | TUESDAY,
        )
    )["session"]
    assert (await propose(replace(ctx, call_id="call-4"), who="carol"))["session"]
    assert (await propose(replace(context(db_session, user="carol", agent="scheduler"), call_id="call-5")))[
        "session"
    ]
    # once the first is withdrawn, or has expired, proposing again is fine
    args = {"with": "bob", "duration_minutes": 30, "title": "Pricing"} | MONDAY
    assert await undo(ctx, "schedule_meeting", first, **args) == "undone"
    assert (await propose(replace(ctx, call_id="call-6")))["session"]
    later = replace(ctx, call_id="call-7", now=NOW.replace(minute=31))
    assert (await propose(later))["session"]


async def test_a_proposal_to_a_contact_is_the_requesters_notification(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    proposed = await run(ctx, "schedule_meeting", **{"with": "Priya Nair", "duration_minutes": 30} | MONDAY)
    note = await db_session.get(schema.Notification, proposed["notification_id"])
    assert note is not None and note.user_id == "alice"  # not every user of the tenant's
    seen_by_bob = await run(bob(db_session), "list_notifications")
    assert proposed["notification_id"] not in [n["id"] for n in seen_by_bob["notifications"]]


# --- the counterpart accepts -----------------------------------------------------------------------


async def test_the_counterpart_accepts_through_their_own_call(db_session: AsyncSession) -> None:
    alice = context(db_session, agent="scheduler")
    proposed = await propose(alice)
    listed = await run(bob(db_session), "list_notifications")
    (mine,) = [n for n in listed["notifications"] if n["id"] == proposed["notification_id"]]
    assert (mine["kind"], mine["status"]) == ("meeting_proposal", "open")
    assert mine["message"].startswith("Alice Anders proposed 5 times to meet Bob Brennan about Pricing")

    # without a choice, bob's agent is told which times there are
    asked = await call(bob(db_session), "accept_meeting")
    assert isinstance(asked, Needs) and asked.fields == {"selection": True}
    (offer,) = asked.candidates
    assert (
        offer["session"] == proposed["session"] and offer["from"] == "alice" and len(offer["proposals"]) == 5
    )

    # carol (not addressed) cannot accept it, alice (the requester) has confirm_meeting instead
    carol = context(db_session, user="carol", agent="scheduler")
    assert (
        await failure(carol, "accept_meeting", session=proposed["session"], selection=1)
    ).code == "NOT_FOUND"
    assert (
        await failure(alice, "accept_meeting", session=proposed["session"], selection=1)
    ).code == "NOT_FOUND"

    accepting = bob(db_session, "bob-2")
    booked = await run(accepting, "accept_meeting", session=proposed["session"], selection=2)
    second = proposed["slots"][1]
    assert (booked["starts_at"], booked["title"], booked["attendees"]) == (
        second["starts_at"],
        "Pricing",
        ["alice", "bob"],
    )
    assert booked["invited"] == ["alice@acme.example", "bob@acme.example"]
    event = await db_session.get(schema.CalendarEvent, booked["id"])
    assert event is not None and event.owner_user_id == "alice"  # the organiser stays the requester
    invites = await db_session.scalars(
        select(schema.EmailOutbox).where(schema.EmailOutbox.id.in_(booked["outbox_ids"]))
    )
    assert all("Booked by Bob Brennan" in i.body for i in invites)
    session = await db_session.get(schema.MeetingSession, proposed["session"])
    assert session is not None and (session.status, session.event_id) == ("confirmed", booked["id"])
    note = await db_session.get(schema.Notification, proposed["notification_id"])
    assert note is not None and (note.status, note.resolved_by) == ("resolved", "bob")
    alices = await run(alice, "list_notifications")
    (told,) = [n for n in alices["notifications"] if n["id"] == booked["notified"]]
    assert told["kind"] == "meeting_booked" and told["message"].startswith("Bob Brennan booked 'Pricing'")
    # booked once: neither side can book the session again
    assert (
        await failure(bob(db_session, "bob-3"), "accept_meeting", session=proposed["session"], selection=1)
    ).code == "CONFLICT"

    # bob's undo: event cancelled, session and proposal open again, alice's notice withdrawn
    assert (
        await undo(accepting, "accept_meeting", booked, session=proposed["session"], selection=2) == "undone"
    )
    assert event.status == "cancelled" and (session.status, session.event_id) == ("open", None)
    assert (note.status, note.resolved_by) == ("open", None)
    assert await db_session.get(schema.Notification, booked["notified"]) is None


async def test_accept_needs_a_session_when_several_are_open_and_refuses_an_expired_one(
    db_session: AsyncSession,
) -> None:
    first = await propose(context(db_session, agent="scheduler"))
    second = await propose(replace(context(db_session, user="carol", agent="scheduler"), call_id="call-c"))
    which = await call(bob(db_session), "accept_meeting", selection=1)
    assert isinstance(which, Needs) and which.fields == {"session": True}
    assert sorted(c["session"] for c in which.candidates) == sorted([first["session"], second["session"]])
    late = replace(bob(db_session), now=NOW.replace(minute=30))
    expired = await call(late, "accept_meeting", session=first["session"], selection=1)
    assert isinstance(expired, Needs) and expired.fields == {"session": True}
    assert expired.candidates[0]["next"] == "ask Alice Anders to propose again"
    # another tenant's user finds nothing
    dave = context(db_session, tenant="globex", user="dave", agent="scheduler")
    assert (await failure(dave, "accept_meeting", session=first["session"], selection=1)).code == "NOT_FOUND"
    # a requester deactivated since cannot be booked with
    alice = await db_session.get(schema.User, ("acme", "alice"))
    assert alice is not None
    alice.deactivated_at = NOW
    gone = await failure(bob(db_session), "accept_meeting", session=first["session"], selection=1)
    assert gone.code == "NOT_FOUND" and "no longer active" in gone.message


# --- notifications, scoped to the user -------------------------------------------------------------


async def test_a_user_sees_and_resolves_only_their_own_notifications(db_session: AsyncSession) -> None:
    proposed = await propose(context(db_session, agent="scheduler"))
    note_id = proposed["notification_id"]
    for outsider in (
        context(db_session, agent="scheduler"),  # alice, the requester: the notification is bob's
        context(db_session, user="carol", agent="scheduler"),
        context(db_session, tenant="globex", user="dave", agent="scheduler"),
    ):
        seen = await run(outsider, "list_notifications", status="all")
        assert note_id not in [n["id"] for n in seen["notifications"]]
        assert (
            await failure(outsider, "resolve_notification", notification=str(note_id))
        ).code == "NOT_FOUND"
    resolved = await run(
        bob(db_session), "resolve_notification", notification=str(note_id), resolution="declined by phone"
    )
    assert (resolved["status"], resolved["resolved_by"], resolved["changed"]) == ("resolved", "bob", True)
    open_now = await run(bob(db_session), "list_notifications")
    assert note_id not in [n["id"] for n in open_now["notifications"]]
    done = await run(bob(db_session), "list_notifications", status="resolved")
    assert note_id in [n["id"] for n in done["notifications"]]


async def notifications_cli(engine: AsyncEngine, *args: str) -> tuple[int, str]:
    url = engine.url.render_as_string(hide_password=False)
    done = await run_starter("notifications", *args, env={"DATABASE_URL": url})
    return done.returncode, done.stdout + done.stderr


async def test_the_notifications_cli_lists_and_resolves_a_users_own(
    db_engine: AsyncEngine, scratch: list[str]
) -> None:
    async with db_engine.begin() as conn:
        note_id = (
            await conn.execute(
                text(
                    "INSERT INTO notifications (tenant_id, user_id, kind, message) "
                    "VALUES ('acme', 'bob', 'meeting_proposal', 'Alice Anders proposed 2 times') RETURNING id"
                )
            )
        ).scalar_one()
    code, out = await notifications_cli(db_engine, "list", "--tenant", "acme", "--user", "bob", "--json")
    assert code == 0, out
    (row,) = [r for r in json.loads(out) if r["id"] == note_id]
    assert (row["kind"], row["status"]) == ("meeting_proposal", "open")
    code, out = await notifications_cli(db_engine, "list", "--tenant", "acme", "--user", "carol", "--json")
    assert code == 0 and note_id not in [r["id"] for r in json.loads(out)]
    # another user, or the same id from another tenant, cannot resolve it
    for tenant, user in (("acme", "carol"), ("globex", "dave")):
        code, out = await notifications_cli(
            db_engine, "resolve", str(note_id), "--tenant", tenant, "--as", user
        )
        assert code != 0 and f"no notification {note_id}" in out
    # in signed mode `--as` is a name nobody proved: the CLI refuses, and the notification stays open
    async with db_engine.begin() as conn:
        mode = (
            await conn.execute(text("SELECT value FROM deployment_settings WHERE name = 'auth_mode'"))
        ).scalar()
        await conn.execute(
            text(
                "INSERT INTO deployment_settings (name, value) VALUES ('auth_mode', 'signed') "
                "ON CONFLICT (name) DO UPDATE SET value = 'signed'"
            )
        )
    try:
        code, out = await notifications_cli(
            db_engine, "resolve", str(note_id), "--tenant", "acme", "--as", "bob"
        )
    finally:
        async with db_engine.begin() as conn:
            restore = "UPDATE deployment_settings SET value = :mode WHERE name = 'auth_mode'"
            forget = "DELETE FROM deployment_settings WHERE name = 'auth_mode'"
            await conn.execute(text(restore if mode else forget), {"mode": mode} if mode else {})
    assert code != 0 and "COUNTERSIGN_AUTH=signed" in out, out
    code, out = await notifications_cli(db_engine, "resolve", str(note_id), "--tenant", "acme", "--as", "bob")
    assert (code, out.strip()) == (0, f"notification {note_id} resolved")
    code, out = await notifications_cli(
        db_engine, "list", "--tenant", "acme", "--user", "bob", "--status", "resolved"
    )
    assert code == 0 and "Alice Anders proposed 2 times" in out
    code, out = await notifications_cli(db_engine, "list", "--tenant", "acme", "--user", "nobody")
    assert code != 0 and "no user 'nobody'" in out


# --- two users' agents, end to end -----------------------------------------------------------------


def tool_data(messages: list[Any], tool_name: str) -> dict[str, Any]:
    """The data of the latest result of `tool_name` in a transcript."""
    ids = {c.id for m in messages if m.tool_calls for c in m.tool_calls if c.name == tool_name}
    (last,) = [m for m in messages if m.role == "tool" and m.tool_call_id in ids][-1:]
    data: dict[str, Any] = json.loads(last.content or "")["data"]
    return data


async def test_alice_proposes_and_bob_accepts_through_his_own_agent(
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
                        "arguments": {"with": "bob", "duration_minutes": 45, "title": "Roadmap", **window},
                    }
                ]
            },
        },
        {"when": {"after_tool": "schedule_meeting"}, "reply": {"content": "Proposed to Bob."}},
        {
            "when": {"user_contains": "what is waiting"},
            "reply": {"tool_calls": [{"name": "list_notifications", "arguments": {}}]},
        },
        {"when": {"after_tool": "list_notifications"}, "reply": {"content": "Alice proposed a meeting."}},
        {
            "when": {"user_contains": "take the second"},
            "reply": {"tool_calls": [{"name": "accept_meeting", "arguments": {"selection": 2}}]},
        },
        {"when": {"after_tool": "accept_meeting"}, "reply": {"content": "Booked with Alice."}},
    )
    alices = await agent.start("meet bob about the roadmap", agent="scheduler")
    assert (
        await execute_update(alices, AgentWorkflow.wait_turn, 1)
    ).reply == "[scripted model] Proposed to Bob."  # type: ignore[union-attr]
    proposal = tool_data(await agent.transcript(alices), "schedule_meeting")
    assert proposal["session"] is not None

    bobs = await agent.start("what is waiting for me?", user="bob", agent="scheduler")
    assert (
        await execute_update(bobs, AgentWorkflow.wait_turn, 1)
    ).reply == "[scripted model] Alice proposed a meeting."  # type: ignore[union-attr]
    listed = tool_data(await agent.transcript(bobs), "list_notifications")
    assert proposal["notification_id"] in [n["id"] for n in listed["notifications"]]

    await bobs.signal(AgentWorkflow.submit_message, SubmitMessage(user_id="bob", text="take the second"))
    assert (
        await execute_update(bobs, AgentWorkflow.wait_turn, 2)
    ).reply == "[scripted model] Booked with Alice."  # type: ignore[union-attr]
    booked = tool_data(await agent.transcript(bobs), "accept_meeting")
    assert (
        booked["starts_at"] == proposal["slots"][1]["starts_at"] and booked["session"] == proposal["session"]
    )
    for handle, user in ((alices, "alice"), (bobs, "bob")):
        await handle.signal(AgentWorkflow.end, EndConversation(requested_by=user))
        await handle.result()  # the undo windows pass; every queued email is delivered

    async with db_engine.connect() as conn:
        event = (
            await conn.execute(
                select(
                    schema.CalendarEvent.attendees,
                    schema.CalendarEvent.owner_user_id,
                    schema.CalendarEvent.status,
                ).where(schema.CalendarEvent.id == booked["id"])
            )
        ).one()
        session_status = await conn.scalar(
            select(schema.MeetingSession.status).where(schema.MeetingSession.id == proposal["session"])
        )
        note = (
            await conn.execute(
                select(schema.Notification.status, schema.Notification.resolved_by).where(
                    schema.Notification.id == proposal["notification_id"]
                )
            )
        ).one()
        told = await conn.scalar(
            select(schema.Notification.user_id).where(schema.Notification.id == booked["notified"])
        )
    assert (event.attendees, event.owner_user_id, event.status) == (["alice", "bob"], "alice", "confirmed")
    assert session_status == "confirmed" and tuple(note) == ("resolved", "bob") and told == "alice"
    assert utc(booked["ends_at"]) - utc(booked["starts_at"]) == utc(proposal["slots"][0]["ends_at"]) - utc(
        proposal["slots"][0]["starts_at"]
    )
    sent = sorted((m["To"], m["Subject"]) for m in smtp_server.messages)
    assert sent == [
        ("alice@acme.example", "Invitation: Roadmap"),
        ("bob@acme.example", "Invitation: Roadmap"),
        ("bob@acme.example", "Meeting request from Alice Anders: Roadmap"),
    ]


async def test_the_shipped_scheduler_script_shows_bobs_notifications_and_accepts(
    agent: AgentHarness, db_engine: AsyncEngine, smtp_server: SmtpServer, scratch: list[str]
) -> None:
    """countersign/scenarios/scheduler.yaml, as `make demo`'s scripted model serves it."""
    async with AsyncSession(db_engine, expire_on_commit=False) as session, session.begin():
        alice = replace(context(session, agent="scheduler"), workflow_id=f"wf-{uuid.uuid4()}")
        proposed = await propose(alice)
    agent.model.set_scenario(load_scenario(PROJECT_ROOT / "countersign" / "scenarios" / "scheduler.yaml"))
    bobs = await agent.start("show my notifications", user="bob", agent="scheduler")
    first = await execute_update(bobs, AgentWorkflow.wait_turn, 1)
    assert first is not None and (first.reply or "").startswith("[scripted model] Your open notifications")
    await bobs.signal(
        AgentWorkflow.submit_message, SubmitMessage(user_id="bob", text="accept the first time")
    )
    second = await execute_update(bobs, AgentWorkflow.wait_turn, 2)
    assert second is not None and (second.reply or "").startswith("[scripted model] Booked (above)"), second
    booked = tool_data(await agent.transcript(bobs), "accept_meeting")
    assert (
        booked["session"] == proposed["session"] and booked["starts_at"] == proposed["slots"][0]["starts_at"]
    )
    async with db_engine.connect() as conn:
        status = await conn.scalar(
            select(schema.Notification.status).where(schema.Notification.id == proposed["notification_id"])
        )
    assert status == "resolved"
    await bobs.signal(AgentWorkflow.end, EndConversation(requested_by="bob"))
    await bobs.result()
