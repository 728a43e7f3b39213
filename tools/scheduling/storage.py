"""The scheduling tools' SQL: both calendars (busy times, and the per-person advisory locks that
serialize bookings), the caller and the counterpart, and the negotiation sessions (an open one
for the same request, the one a booking answers).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    DateTime,
    Select,
    String,
    and_,
    bindparam,
    func,
    or_,
    select,
)

from countersign.db.schema import CalendarEvent, MeetingSession, User
from tools.registry import ToolContext, ToolFailure
from tools.resolve import Person, belongs_to, caller_and_person, events_of, match_first, overlapping


def busy_during(
    tenant_id: Any, calendars: Sequence[ColumnElement[bool]], start: Any, end: Any
) -> ColumnElement[bool]:
    """The tenant's events on any of `calendars` (`belongs_to`) that are live during [start, end)."""
    return and_(CalendarEvent.tenant_id == tenant_id, overlapping(start, end), or_(*calendars))


async def busy_times(
    ctx: ToolContext, people: Sequence[Person], start: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """When any of `people` has a live event overlapping [start, end)."""
    rows = await ctx.session.execute(
        select(CalendarEvent.starts_at, CalendarEvent.ends_at).where(
            busy_during(ctx.tenant_id, [belongs_to(person) for person in people], start, end)
        )
    )
    return [(start, end) for start, end in rows]


async def lock_calendars(ctx: ToolContext, people: Sequence[Person]) -> None:
    """Serialize bookings and proposals per person until this transaction ends; sorted keys keep
    the lock order fixed, so two calls never deadlock."""
    for key in sorted({person.key for person in people}):
        name = f"countersign:calendar:{ctx.tenant_id}:{key}"
        await ctx.session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(name, 0))))


async def both_parties(ctx: ToolContext, counterpart: str) -> tuple[Person, Person]:
    """The caller and the counterpart they named, who must be someone else."""
    caller, other = await caller_and_person(ctx, counterpart, field="with")
    if other.key == caller.key:
        raise ToolFailure("VALIDATION_ERROR", "`with` names the user themself; name the other person")
    return caller, other


def counterpart_handle(person: Person) -> tuple[bool, str]:
    """How a session names its counterpart: (True, their user id) or (False, the contact's email,
    lowercased)."""
    if person.user_id is not None:
        return True, person.user_id
    return False, (person.email or "").lower()


def counterpart_is(user: bool, handle: str | BindParameter[str]) -> ColumnElement[bool]:
    """Sessions whose counterpart is `handle` (`counterpart_handle`: a value or a bound parameter)."""
    if user:
        return MeetingSession.counterpart_user_id == handle
    return func.lower(MeetingSession.counterpart_email) == handle


def same_counterpart(person: Person) -> ColumnElement[bool]:
    return counterpart_is(*counterpart_handle(person))


@functools.lru_cache(maxsize=8)
def duplicate_or_busy_statement(counterpart_user: bool, handles: tuple[int, ...]) -> Select[Any]:
    """`open_duplicate_or_busy`'s statement for a counterpart of this kind and people with this
    many handles each (the caller first), built once with every value a bound parameter: built per
    call, its Python cost more than its round trip (docs/benchmark.md, "schedule_meeting, third
    pass"). An aggregate answers one row even without events (arrays of NULL)."""
    moment = DateTime(timezone=True)
    start, end = bindparam("start", type_=moment), bindparam("end", type_=moment)
    duplicate = (
        select(MeetingSession.id)
        .where(
            MeetingSession.tenant_id == bindparam("tenant_id"),
            MeetingSession.requested_by == bindparam("caller_id"),
            MeetingSession.status == "open",
            MeetingSession.expires_at > bindparam("now", type_=moment),
            MeetingSession.idempotency_key != bindparam("idempotency_key"),
            counterpart_is(counterpart_user, bindparam("counterpart", type_=String)),
            MeetingSession.window_start < end,
            MeetingSession.window_end > start,
        )
        .order_by(MeetingSession.id)
        .limit(1)
        .scalar_subquery()
    )
    calendars = [
        events_of(
            bindparam(f"user_{j}", type_=String) if j == 0 or counterpart_user else None,
            [bindparam(f"handle_{j}_{k}", type_=String) for k in range(n)],
        )
        for j, n in enumerate(handles)
    ]
    return select(
        duplicate, func.array_agg(CalendarEvent.starts_at), func.array_agg(CalendarEvent.ends_at)
    ).where(busy_during(bindparam("tenant_id"), calendars, start, end))


async def open_duplicate_or_busy(
    ctx: ToolContext, caller: Person, other: Person, start: datetime, end: datetime
) -> tuple[MeetingSession | None, list[tuple[datetime, datetime]]]:
    """The caller's session with the same counterpart that is still open and whose window overlaps
    [start, end) (the counterpart has these proposals already, and must not get two competing
    sets), else `busy_times` of both: the session's id and both calendars in one round trip (the
    session itself is read only when there is one). A retry of this very call finds its own
    session instead (same idempotency key), so it is not this one."""
    counterpart_user, counterpart = counterpart_handle(other)
    values: dict[str, Any] = {
        "tenant_id": ctx.tenant_id,
        "caller_id": ctx.caller.user_id,
        "now": ctx.now,
        "idempotency_key": ctx.idempotency_key,
        "counterpart": counterpart,
        "start": start,
        "end": end,
    }
    people = [caller, other]
    for j, person in enumerate(people):
        values |= {f"handle_{j}_{k}": handle for k, handle in enumerate(person.handles)}
        if person.user_id is not None:
            values[f"user_{j}"] = person.user_id
    statement = duplicate_or_busy_statement(counterpart_user, tuple(len(p.handles) for p in people))
    session_id, starts, ends = (await ctx.session.execute(statement, values)).one()
    if session_id is not None:
        return await ctx.session.get_one(MeetingSession, session_id), []
    return None, list(zip(starts or [], ends or [], strict=True))


async def user_person(ctx: ToolContext, user_id: str) -> Person | None:
    user = await ctx.session.get(User, (ctx.tenant_id, user_id))
    return Person.of_user(user) if user is not None else None


async def session_counterpart(ctx: ToolContext, session: MeetingSession) -> Person:
    if session.counterpart_user_id is not None:
        person = await user_person(ctx, session.counterpart_user_id)
        if person is not None:
            return person
    email = session.counterpart_email.lower()
    return Person(f"email:{email}", session.counterpart_name, session.counterpart_email, None, (email,))


async def session_answered(
    ctx: ToolContext, other: Person, start: datetime, end: datetime, *, lock: bool
) -> MeetingSession | None:
    """The caller's open session with `other` whose window holds [start, end) (`lock`: locked): a
    booking with them agreed without naming it answers that negotiation, so it closes it as a
    selection would (left open, it would answer the next request for them with its stale times)."""
    rows = await match_first(
        ctx,
        MeetingSession,
        (MeetingSession.requested_by == ctx.caller.user_id)
        & (MeetingSession.status == "open")
        & (MeetingSession.expires_at > ctx.now)
        & same_counterpart(other)
        & (MeetingSession.window_start <= start)
        & (MeetingSession.window_end >= end),
        lock=lock,
    )
    return rows[0] if rows else None
