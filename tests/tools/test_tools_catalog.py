"""The catalog's lead, contact, operations and scheduling tools against the real, seeded PostgreSQL.

Tools are called directly with a `ToolContext` over the `db_session` fixture (one transaction rolled
back after each test). Compensations are called the way the saga calls them: with the forward call's
arguments and its recorded result data (JSON), and compared against snapshots of the rows.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.core.calls import CallerContext
from countersign.db import schema
from tools import REGISTRY
from tools.arguments import parse_arguments
from tools.registry import IDENTITY_FIELDS, Needs, ToolArgs, ToolContext, ToolFailure

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)  # a Monday, before business hours


def context(
    session: AsyncSession, tenant: str = "acme", user: str = "alice", agent: str = "operations"
) -> ToolContext:
    caller = CallerContext(tenant_id=tenant, user_id=user, roles=["sales"], agent=agent)
    return ToolContext(caller=caller, session=session, workflow_id="wf-test", call_id="call-1", now=NOW)


def args_of(tool: str, **raw: Any) -> ToolArgs:
    return parse_arguments(REGISTRY[tool], raw)


async def call(ctx: ToolContext, tool: str, **raw: Any) -> BaseModel:
    return await REGISTRY[tool].run(ctx, args_of(tool, **raw))


async def run(ctx: ToolContext, tool: str, **raw: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its result data as the audit records it (JSON)."""
    result = await call(ctx, tool, **raw)
    assert not isinstance(result, Needs), result
    return result.model_dump(mode="json")


async def undo(ctx: ToolContext, tool: str, result: dict[str, Any] | None, **raw: Any) -> str:
    compensation = REGISTRY[tool].compensation
    assert compensation is not None
    return await compensation(ctx, args_of(tool, **raw), result)


async def failure(ctx: ToolContext, tool: str, **raw: Any) -> ToolFailure:
    with pytest.raises(ToolFailure) as caught:
        await call(ctx, tool, **raw)
    return caught.value


async def snapshot(session: AsyncSession, model: type[schema.Base], row_id: int) -> dict[str, Any]:
    """The row as stored, without `updated_at` (an undo is a change too, and stamps it)."""
    table = model.__table__
    row = (await session.execute(select(table).where(table.c.id == row_id))).mappings().one()
    return {k: v for k, v in row.items() if k != "updated_at"}


async def row_id(session: AsyncSession, model: type[Any], tenant: str, **match: Any) -> int:
    found = await session.scalar(select(model.id).filter_by(tenant_id=tenant, **match))
    assert found is not None, match
    return int(found)


# --- the registry ----------------------------------------------------------------------------------


def test_every_args_model_forbids_extra_keys_and_identity_fields() -> None:
    for name, registered in REGISTRY.items():
        model = registered.args_model
        assert model.model_config.get("extra") == "forbid", name
        names = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
        assert not names & IDENTITY_FIELDS, name
        with pytest.raises(ValidationError, match="extra"):
            model.model_validate({"tenant_id": "globex"})


def test_writes_are_compensable_and_update_lead_status_needs_approval() -> None:
    for name in ("update_lead_status", "create_task", "update_task", "create_project", "update_project"):
        assert REGISTRY[name].compensation is not None, name
    for name in ("create_event", "update_event", "confirm_meeting", "resolve_notification"):
        assert REGISTRY[name].compensation is not None, name
    assert REGISTRY["update_lead_status"].default_tier == "needs_approval"
    assert REGISTRY["create_task"].default_tier == "needs_approval"  # restrictive until an operator sets it


def test_naive_datetimes_are_refused_with_a_hint() -> None:
    with pytest.raises(ValidationError, match="time zone"):
        args_of("create_event", title="x", starts_at="2026-12-08T10:00:00", ends_at="2026-12-08T11:00:00Z")
    args = args_of(
        "create_event", title="x", starts_at="2026-12-08T11:00:00+01:00", ends_at="2026-12-08T11:00Z"
    )
    assert args.model_dump()["starts_at"] == datetime(2026, 12, 8, 10, tzinfo=UTC)


def test_update_tools_need_a_change() -> None:
    with pytest.raises(ValidationError, match="at least one field"):
        args_of("update_task", task="Review pricing page", status=None)


# --- leads -----------------------------------------------------------------------------------------


async def test_update_lead_status_touches_only_the_callers_tenant_and_undoes(
    db_session: AsyncSession,
) -> None:
    ctx = context(db_session, agent="lead-qualifier")
    acme = await row_id(db_session, schema.Lead, "acme", email="jane.doe@example.com")
    globex = await row_id(db_session, schema.Lead, "globex", email="jane.doe@example.com")
    before, globex_before = (
        await snapshot(db_session, schema.Lead, acme),
        await snapshot(db_session, schema.Lead, globex),
    )
    raw = {"lead": "Jane.Doe@example.com", "new_status": "qualified", "reason": "Budget confirmed"}

    result = await run(ctx, "update_lead_status", **raw)

    assert result["previous_status"] == "new" and result["new_status"] == "qualified" and result["changed"]
    assert result["lead"]["id"] == acme
    assert (await snapshot(db_session, schema.Lead, acme))["status"] == "qualified"
    assert await snapshot(db_session, schema.Lead, globex) == globex_before
    assert await undo(ctx, "update_lead_status", result, **raw) == "undone"
    assert await snapshot(db_session, schema.Lead, acme) == before
    assert await undo(ctx, "update_lead_status", result, **raw) == "already_undone"
    assert await undo(ctx, "update_lead_status", None, **raw) == "never_happened"


async def test_update_lead_status_to_the_same_status_changes_nothing(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    raw = {"lead": "jane.doe@example.com", "new_status": "new", "reason": "still new"}
    result = await run(ctx, "update_lead_status", **raw)
    assert not result["changed"] and result["previous_status"] == "new"
    assert await undo(ctx, "update_lead_status", result, **raw) == "never_happened"


async def test_lead_undo_never_clobbers_a_later_change(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    raw = {"lead": "jane.doe@example.com", "new_status": "contacted", "reason": "called"}
    result = await run(ctx, "update_lead_status", **raw)
    await db_session.execute(
        update(schema.Lead).where(schema.Lead.id == result["lead"]["id"]).values(status="converted")
    )
    assert await undo(ctx, "update_lead_status", result, **raw) == "irreversible"
    assert (await snapshot(db_session, schema.Lead, result["lead"]["id"]))["status"] == "converted"


async def test_update_lead_status_of_another_tenants_lead_is_not_found(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    globex_only = "raj.patel@wonka.example"
    error = await failure(ctx, "update_lead_status", lead=globex_only, new_status="new", reason="x")
    assert error.code == "NOT_FOUND"
    percent = await failure(ctx, "update_lead_status", lead="%@example.com", new_status="new", reason="x")
    assert percent.code == "NOT_FOUND"  # LIKE wildcards are not patterns


# --- contacts --------------------------------------------------------------------------------------


async def test_search_contacts_is_tenant_scoped(db_session: AsyncSession) -> None:
    acme = await run(context(db_session), "search_contacts", query="jane")
    globex = await run(context(db_session, "globex", "dave"), "search_contacts", query="jane")
    assert [c["company"] for c in acme["contacts"]] == ["Doe Consulting"]
    assert [c["company"] for c in globex["contacts"]] == ["Doe & Daughters"]
    sams = await run(context(db_session), "search_contacts", query="sam lee")
    assert {c["email"] for c in sams["contacts"]} == {
        "sam.lee@initech.example",
        "samuel.lee@umbrella.example",
    }


# --- tasks -----------------------------------------------------------------------------------------


async def test_create_task_resolves_people_and_projects_and_undoes(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    raw = {
        "title": "Prepare demo",
        "due_date": "2026-12-11",
        "assignee": "Bob",
        "project": "website relaunch",
    }
    result = await run(ctx, "create_task", **raw)
    assert result["assignee"] == "bob" and result["project"] == "Website relaunch"
    assert (
        result["status"] == "open" and result["created_by"] == "alice" and result["due_date"] == "2026-12-11"
    )
    created = await snapshot(db_session, schema.Task, result["id"])

    assert await undo(ctx, "create_task", result, **raw) == "undone"
    assert await snapshot(db_session, schema.Task, result["id"]) == created | {"status": "cancelled"}
    assert await undo(ctx, "create_task", result, **raw) == "already_undone"
    assert await undo(ctx, "create_task", None, **raw) == "never_happened"
    assert await undo(ctx, "create_task", result | {"id": 10**12}, **raw) == "never_happened"


async def test_create_task_sets_an_initial_status(db_session: AsyncSession) -> None:
    result = await run(context(db_session), "create_task", title="Already running", status="in_progress")
    assert result["status"] == "in_progress"
    assert (await snapshot(db_session, schema.Task, result["id"]))["status"] == "in_progress"


async def test_create_task_needs_an_unambiguous_assignee_of_the_tenant(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    ambiguous = await call(ctx, "create_task", title="x", assignee="an")  # Alice Anders, Bob Brennan
    assert isinstance(ambiguous, Needs) and ambiguous.fields == {"assignee": True}
    assert {c["id"] for c in ambiguous.candidates} == {"alice", "bob"}
    foreign = await call(ctx, "create_task", title="x", assignee="dave")  # a globex user
    assert isinstance(foreign, Needs)
    assert {c["id"] for c in foreign.candidates} == {"alice", "bob", "carol"}
    assert (await failure(ctx, "create_task", title="x", project="Partner portal")).code == "NOT_FOUND"


async def test_list_tasks_filters(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    mine = await run(ctx, "list_tasks", assignee="alice@acme.example", status="open")
    assert [t["title"] for t in mine["tasks"]] == ["Follow up with Initech", "Build outbound target list"]
    site = await run(ctx, "list_tasks", project="Website relaunch")
    assert {t["title"] for t in site["tasks"]} == {"Draft landing page copy", "Review pricing page"}
    everything = await run(ctx, "list_tasks", limit=50)
    assert "Order conveyor sensors" not in {t["title"] for t in everything["tasks"]}


async def test_update_task_records_changes_and_undo_restores_the_row(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    task = await row_id(db_session, schema.Task, "acme", title="Review pricing page")
    before = await snapshot(db_session, schema.Task, task)
    raw = {
        "task": "review pricing page",
        "status": "done",
        "due_date": "2026-12-20",
        "assignee": "carol@acme.example",
    }

    result = await run(ctx, "update_task", **raw)

    assert result["previous"] == {"status": "open", "due_date": "2026-12-14", "assignee_user_id": "bob"}
    assert result["changed"] == {"status": "done", "due_date": "2026-12-20", "assignee_user_id": "carol"}
    assert result["record"]["status"] == "done"
    assert await undo(ctx, "update_task", result, **raw) == "undone"
    assert await snapshot(db_session, schema.Task, task) == before
    assert await undo(ctx, "update_task", result, **raw) == "already_undone"


async def test_update_task_undo_leaves_fields_changed_since(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    raw = {"task": "Review pricing page", "status": "in_progress", "title": "Review pricing page v2"}
    result = await run(ctx, "update_task", **raw)
    task = result["record"]["id"]
    await db_session.execute(update(schema.Task).where(schema.Task.id == task).values(status="done"))

    assert await undo(ctx, "update_task", result, **raw) == "irreversible"
    after = await snapshot(db_session, schema.Task, task)
    assert after["status"] == "done" and after["title"] == "Review pricing page"


async def test_tasks_of_another_tenant_cannot_be_updated(db_session: AsyncSession) -> None:
    globex_task = await row_id(db_session, schema.Task, "globex", title="Order conveyor sensors")
    ctx = context(db_session)
    for ref in ("Order conveyor sensors", str(globex_task)):
        assert (await failure(ctx, "update_task", task=ref, status="done")).code == "NOT_FOUND"


# --- projects --------------------------------------------------------------------------------------


async def test_projects_create_update_and_undo(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    created = await run(ctx, "create_project", name="Holiday party", due_date="2026-12-18")
    assert created["status"] == "planned" and created["owner"] == "alice"
    assert (await failure(ctx, "create_project", name="holiday PARTY")).code == "CONFLICT"
    assert (
        await failure(ctx, "update_project", project="Holiday party", name="CRM data cleanup")
    ).code == "CONFLICT"

    raw = {"project": "CRM data cleanup", "status": "active", "description": ""}
    project = await row_id(db_session, schema.Project, "acme", name="CRM data cleanup")
    before = await snapshot(db_session, schema.Project, project)
    updated = await run(ctx, "update_project", **raw)
    assert updated["changed"] == {"status": "active", "description": None}
    assert await undo(ctx, "update_project", updated, **raw) == "undone"
    assert await snapshot(db_session, schema.Project, project) == before

    assert await undo(ctx, "create_project", created, name="Holiday party") == "undone"
    listed = await run(ctx, "list_projects", status="cancelled")
    assert [p["name"] for p in listed["projects"]] == ["Holiday party"]
    globex = await run(context(db_session, "globex", "dave"), "list_projects")
    assert "Holiday party" not in {p["name"] for p in globex["projects"]}


# --- events ----------------------------------------------------------------------------------------


async def test_list_events_of_an_attendee_in_a_range(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    raw = {"from": "2026-12-01T00:00:00Z", "to": "2026-12-31T00:00:00Z", "attendee": "Bob Brennan"}
    titles = [e["title"] for e in (await run(ctx, "list_events", **raw))["events"]]
    assert titles == ["Website relaunch standup", "Pricing review", "Quarterly planning"]
    upcoming = [e["title"] for e in (await run(ctx, "list_events"))["events"]]  # from NOW (Dec 7, 08:00)
    assert upcoming[0] == "Website relaunch standup" and "Intro call with Initech" not in upcoming


async def test_events_create_update_and_undo(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    created = await run(
        ctx,
        "create_event",
        title="Offsite",
        starts_at="2026-12-21T09:00:00Z",
        ends_at="2026-12-21T12:00:00Z",
        attendees=["Bob", "priya.nair@acmepartners.example", "Guest@Outside.example"],
    )
    assert created["attendees"] == ["bob", "priya.nair@acmepartners.example", "guest@outside.example"]
    ambiguous = await call(
        ctx,
        "create_event",
        title="x",
        starts_at="2026-12-21T09:00Z",
        ends_at="2026-12-21T10:00Z",
        attendees=["Sam Lee"],
    )
    assert isinstance(ambiguous, Needs) and ambiguous.fields == {"attendees": True}

    event = await row_id(db_session, schema.CalendarEvent, "acme", title="Pricing review")
    before = await snapshot(db_session, schema.CalendarEvent, event)
    raw = {"event": "Pricing review", "starts_at": "2026-12-10T14:00:00Z", "ends_at": "2026-12-10T15:00:00Z"}
    moved = await run(ctx, "update_event", **raw)
    assert moved["previous"]["starts_at"] == "2026-12-09T14:00:00Z"
    bad = await failure(ctx, "update_event", event="Pricing review", ends_at="2026-12-01T00:00:00Z")
    assert bad.code == "VALIDATION_ERROR"
    assert await undo(ctx, "update_event", moved, **raw) == "undone"
    assert await snapshot(db_session, schema.CalendarEvent, event) == before
    assert await undo(ctx, "update_event", moved, **raw) == "already_undone"

    assert (
        await undo(ctx, "create_event", created, title="x", starts_at=NOW, ends_at=NOW + timedelta(hours=1))
        == "undone"
    )


async def test_event_undo_moves_start_and_end_together(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    raw = {"event": "Pricing review", "starts_at": "2026-12-10T14:00:00Z", "ends_at": "2026-12-10T15:00:00Z"}
    moved = await run(ctx, "update_event", **raw)
    later_end = datetime(2026, 12, 10, 16, tzinfo=UTC)
    table = schema.CalendarEvent
    await db_session.execute(update(table).where(table.id == moved["record"]["id"]).values(ends_at=later_end))
    assert await undo(ctx, "update_event", moved, **raw) == "irreversible"
    after = await snapshot(db_session, table, moved["record"]["id"])
    assert after["starts_at"] == datetime(2026, 12, 10, 14, tzinfo=UTC) and after["ends_at"] == later_end


# --- scheduling ------------------------------------------------------------------------------------


def overlaps(slot: dict[str, Any], start: datetime, end: datetime) -> bool:
    return datetime.fromisoformat(slot["starts_at"]) < end and datetime.fromisoformat(slot["ends_at"]) > start


async def test_schedule_meeting_avoids_both_calendars(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    window = {"window_start": "2026-12-03T09:00:00Z", "window_end": "2026-12-03T17:00:00Z"}
    tuesday_before = replace(ctx, now=datetime(2026, 12, 1, 8, tzinfo=UTC), call_id="call-0")
    thursday = await run(
        tuesday_before, "schedule_meeting", **{"with": "John Smith", "duration_minutes": 60, **window}
    )
    assert thursday["counterpart"]["email"] == "john.smith@initech.example"
    assert len(thursday["slots"]) == 5
    intro = (datetime(2026, 12, 3, 15, tzinfo=UTC), datetime(2026, 12, 3, 15, 30, tzinfo=UTC))
    assert not any(overlaps(slot, *intro) for slot in thursday["slots"])
    # on the Monday after, that Thursday is past: no time in it is proposed
    past = await run(ctx, "schedule_meeting", **{"with": "John Smith", "duration_minutes": 60, **window})
    assert past["slots"] == [] and past["session"] is None

    week = await run(ctx, "schedule_meeting", **{"with": "bob", "duration_minutes": 30})
    assert week["window_end"] == "2026-12-11T17:00:00Z"
    starts = [slot["starts_at"] for slot in week["slots"]]  # the first free slot of each business day
    assert starts == [
        "2026-12-07T09:30:00Z",  # 09:00-09:15 is the standup
        "2026-12-08T09:00:00Z",
        "2026-12-09T09:00:00Z",
        "2026-12-10T09:00:00Z",
        "2026-12-11T09:00:00Z",
    ]
    again = await run(ctx, "schedule_meeting", **{"with": "bob", "duration_minutes": 30})
    assert again == week


async def test_schedule_meeting_asks_which_sam_lee(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    needs = await call(ctx, "schedule_meeting", **{"with": "Sam Lee", "duration_minutes": 30})
    assert isinstance(needs, Needs) and needs.fields == {"with": True}
    assert {c["email"] for c in needs.candidates} == {
        "sam.lee@initech.example",
        "samuel.lee@umbrella.example",
    }
    assert (
        await failure(ctx, "schedule_meeting", **{"with": "Hank Scorpio", "duration_minutes": 30})
    ).code == "NOT_FOUND"


async def test_confirm_meeting_books_checks_and_undoes(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    raw = {"with": "samuel.lee@umbrella.example", "starts_at": "2026-12-08T10:00:00Z", "duration_minutes": 45}
    booked = await run(ctx, "confirm_meeting", **raw)
    assert booked["attendees"] == ["alice", "samuel.lee@umbrella.example"] and booked["status"] == "confirmed"
    assert (
        booked["ends_at"] == "2026-12-08T10:45:00Z" and booked["title"] == "Meeting: Alice Anders / Sam Lee"
    )

    clash = await failure(ctx, "confirm_meeting", **raw | {"starts_at": "2026-12-08T10:30:00Z"})
    assert clash.code == "CONFLICT"
    standup = await failure(ctx, "confirm_meeting", **raw | {"starts_at": "2026-12-07T09:00:00Z"})
    assert standup.code == "CONFLICT"

    assert await undo(ctx, "confirm_meeting", booked, **raw) == "undone"
    assert (await snapshot(db_session, schema.CalendarEvent, booked["id"]))["status"] == "cancelled"
    assert await undo(ctx, "confirm_meeting", booked, **raw) == "already_undone"
    rebooked = await run(ctx, "confirm_meeting", **raw | {"starts_at": "2026-12-08T10:30:00Z"})
    assert rebooked["id"] != booked["id"]


async def test_concurrent_confirms_of_one_slot_book_it_once(db_engine: AsyncEngine) -> None:
    title = "Race for the slot"
    raw = {"with": "bob", "starts_at": "2031-03-03T10:00:00Z", "duration_minutes": 30, "title": title}

    async def confirm() -> dict[str, Any] | ToolFailure:
        async with AsyncSession(db_engine, expire_on_commit=False) as session, session.begin():
            try:
                return await run(context(session, agent="scheduler"), "confirm_meeting", **raw)
            except ToolFailure as failed:
                return failed

    try:
        outcomes = await asyncio.gather(confirm(), confirm())
        codes = sorted("ok" if isinstance(o, dict) else o.code for o in outcomes)
        assert codes == ["CONFLICT", "ok"]
        async with db_engine.connect() as conn:
            booked = await conn.scalars(
                select(schema.CalendarEvent.id).where(schema.CalendarEvent.title == title)
            )
            assert len(list(booked)) == 1
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(schema.CalendarEvent).where(schema.CalendarEvent.title == title))


# --- notifications ---------------------------------------------------------------------------------


async def test_resolve_notification_and_reopen(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    raw = {"notification": "Maria Garcia", "resolution": "Meeting booked"}
    resolved = await run(ctx, "resolve_notification", **raw)
    assert resolved["status"] == "resolved" and resolved["resolved_by"] == "alice" and resolved["changed"]
    again = await run(ctx, "resolve_notification", notification=str(resolved["id"]))
    assert not again["changed"]
    assert await undo(ctx, "resolve_notification", again, notification="x") == "never_happened"

    assert await undo(ctx, "resolve_notification", resolved, **raw) == "undone"
    row = await snapshot(db_session, schema.Notification, resolved["id"])
    assert (row["status"], row["resolved_at"], row["resolved_by"]) == ("open", None, None)
    assert await undo(ctx, "resolve_notification", resolved, **raw) == "already_undone"

    bobs = await failure(ctx, "resolve_notification", notification="pricing page review")
    assert bobs.code == "NOT_FOUND"


async def test_reopening_never_clobbers_a_later_resolution(db_session: AsyncSession) -> None:
    ctx = context(db_session, agent="scheduler")
    resolved = await run(ctx, "resolve_notification", notification="Maria Garcia")
    table = schema.Notification
    await db_session.execute(update(table).where(table.id == resolved["id"]).values(resolved_by="carol"))
    assert await undo(ctx, "resolve_notification", resolved, notification="x") == "irreversible"
    row = await snapshot(db_session, table, resolved["id"])
    assert (row["status"], row["resolved_by"]) == ("resolved", "carol")
