"""Scheduling tools: propose free slots with a counterpart, book one safely, close notifications.

Business hours are 09:00-17:00 UTC, Monday to Friday. A person is busy during every event that is
not cancelled and that they own or attend (listed by user id or email). The only clock is `ctx.now`,
so proposals are deterministic.

confirm_meeting cannot double-book: it takes a transaction-scoped advisory lock per person (in a
fixed order, so two bookings never deadlock) before checking the slot again, and the lock is held
until its transaction commits. A concurrent booking for either person therefore waits, then sees the
committed event and fails with CONFLICT.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import func, or_, select

from countersign.db.schema import CalendarEvent, Notification
from tools.operations import EventView
from tools.registry import ToolArgs, ToolContext, ToolFailure, UndoOutcome, compensates, record_id, tool
from tools.resolve import (
    Person,
    UtcDatetime,
    answers_needs,
    belongs_to,
    cancel_created,
    containing,
    locked_row,
    match_first,
    needs,
    overlapping,
    resolve_caller,
    resolve_person,
    restore_fields,
    saved,
)

DAY_START, DAY_END = time(9, tzinfo=UTC), time(17, tzinfo=UTC)
SLOT_STEP = timedelta(minutes=30)
DEFAULT_DAYS = 5
MAX_WINDOW = timedelta(days=31)
MAX_SLOTS = 5

WITH_HELP = "The counterpart: a contact's name or email, or a user's id, name or email"
DURATION = Field(ge=15, le=480, description="Length of the meeting in minutes")


# --- business hours --------------------------------------------------------------------------------


def is_business_day(day: date) -> bool:
    return day.weekday() < 5


def day_bounds(day: date) -> tuple[datetime, datetime]:
    return datetime.combine(day, DAY_START), datetime.combine(day, DAY_END)


def default_window(now: datetime) -> tuple[datetime, datetime]:
    """From now to the end of the fifth business day that still has working time left."""
    day, days = now.date(), 0
    while True:
        if is_business_day(day) and day_bounds(day)[1] > now:
            days += 1
            if days == DEFAULT_DAYS:
                return now, day_bounds(day)[1]
        day += timedelta(days=1)


def round_up(moment: datetime) -> datetime:
    """The first slot boundary (a multiple of SLOT_STEP past midnight UTC) at or after `moment`."""
    midnight = datetime.combine(moment.date(), time(tzinfo=UTC))
    steps = -(-(moment - midnight) // SLOT_STEP)  # ceiling division
    return midnight + steps * SLOT_STEP


def candidate_starts(start: datetime, end: datetime, length: timedelta) -> Iterator[datetime]:
    """Slot starts inside business hours and the window, in time order."""
    day = start.date()
    while day <= end.date():
        opens, closes = day_bounds(day)
        moment, closes = max(opens, round_up(start)), min(closes, end)
        while is_business_day(day) and moment + length <= closes:
            yield moment
            moment += SLOT_STEP
        day += timedelta(days=1)


def is_free(start: datetime, end: datetime, busy: Sequence[tuple[datetime, datetime]]) -> bool:
    return all(not (b_start < end and b_end > start) for b_start, b_end in busy)


def pick_slots(starts: Sequence[datetime], limit: int) -> list[datetime]:
    """Spread proposals: the first free slot of each day, then the earliest others, in time order."""
    firsts = [s for i, s in enumerate(starts) if i == 0 or starts[i - 1].date() != s.date()]
    others = [s for s in starts if s not in set(firsts)]
    return sorted((firsts + others)[:limit])


async def busy_times(
    ctx: ToolContext, people: Sequence[Person], start: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """When any of `people` has a live event overlapping [start, end)."""
    rows = await ctx.session.execute(
        select(CalendarEvent.starts_at, CalendarEvent.ends_at).where(
            CalendarEvent.tenant_id == ctx.tenant_id,
            overlapping(start, end),
            or_(*(belongs_to(person) for person in people)),
        )
    )
    return [(start, end) for start, end in rows]


async def both_parties(ctx: ToolContext, counterpart: str) -> tuple[Person, Person]:
    """The caller and the counterpart they named, who must be someone else."""
    caller = await resolve_caller(ctx)
    other = await resolve_person(ctx, counterpart, field="with")
    if other.key == caller.key:
        raise ToolFailure("VALIDATION_ERROR", "`with` names the user themself; name the other person")
    return caller, other


# --- schedule_meeting ------------------------------------------------------------------------------


class ScheduleMeetingArgs(ToolArgs):
    model_config = ConfigDict(serialize_by_alias=True)

    counterpart: str = Field(alias="with", min_length=1, max_length=320, description=WITH_HELP)
    duration_minutes: int = DURATION
    window_start: UtcDatetime | None = Field(None, description="Earliest start, ISO date-time (default: now)")
    window_end: UtcDatetime | None = Field(
        None, description="Latest end, ISO date-time (default: the end of the fifth business day)"
    )
    title: str | None = Field(None, max_length=200, description="What the meeting is about")

    @model_validator(mode="after")
    def _window_in_order(self) -> ScheduleMeetingArgs:
        if self.window_start and self.window_end and self.window_end <= self.window_start:
            raise ValueError("window_end must be after window_start")
        return self


class PersonView(BaseModel):
    name: str
    email: str | None
    user_id: str | None

    @classmethod
    def of(cls, person: Person) -> PersonView:
        return cls(name=person.name, email=person.email, user_id=person.user_id)


class Slot(BaseModel):
    starts_at: datetime
    ends_at: datetime


class MeetingProposal(BaseModel):
    counterpart: PersonView
    title: str | None
    duration_minutes: int
    window_start: datetime
    window_end: datetime
    slots: list[Slot]  # empty: nobody is free long enough in the window


def proposal_window(ctx: ToolContext, args: ScheduleMeetingArgs) -> tuple[datetime, datetime]:
    start, end = default_window(ctx.now)
    start = args.window_start or start
    end = args.window_end or (default_window(start)[1] if args.window_start else end)
    if end <= start:
        raise ToolFailure("VALIDATION_ERROR", "the window ends before it starts")
    if end - start > MAX_WINDOW:
        raise ToolFailure("VALIDATION_ERROR", "the window may span at most 31 days")
    return start, end


@tool(risk="low", category="read")
@answers_needs
async def schedule_meeting(ctx: ToolContext, args: ScheduleMeetingArgs) -> MeetingProposal:
    """Propose up to 5 slots when both the user and `with` (a contact's name or email, or a user) are
    free, within business hours (09:00-17:00 UTC, Monday-Friday) and the window (default: the next 5
    business days). Books nothing: confirm the chosen slot with confirm_meeting."""
    caller, other = await both_parties(ctx, args.counterpart)
    start, end = proposal_window(ctx, args)
    length = timedelta(minutes=args.duration_minutes)
    busy = await busy_times(ctx, [caller, other], start, end)
    free = [s for s in candidate_starts(start, end, length) if is_free(s, s + length, busy)]
    return MeetingProposal(
        counterpart=PersonView.of(other),
        title=args.title,
        duration_minutes=args.duration_minutes,
        window_start=start,
        window_end=end,
        slots=[Slot(starts_at=s, ends_at=s + length) for s in pick_slots(free, MAX_SLOTS)],
    )


# --- confirm_meeting -------------------------------------------------------------------------------


class ConfirmMeetingArgs(ToolArgs):
    model_config = ConfigDict(serialize_by_alias=True)

    counterpart: str = Field(alias="with", min_length=1, max_length=320, description=WITH_HELP)
    starts_at: UtcDatetime = Field(
        description="Start, ISO date-time with time zone, e.g. 2026-12-08T16:00:00Z"
    )
    duration_minutes: int = DURATION
    title: str | None = Field(None, max_length=200, description="Title (default: 'Meeting: <user> / <them>')")


async def lock_calendars(ctx: ToolContext, people: Sequence[Person]) -> None:
    """Serialize bookings per person until this transaction ends; sorted keys keep lock order fixed."""
    for key in sorted({person.key for person in people}):
        name = f"countersign:calendar:{ctx.tenant_id}:{key}"
        await ctx.session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(name, 0))))


@tool(risk="medium", category="write")
@answers_needs
async def confirm_meeting(ctx: ToolContext, args: ConfirmMeetingArgs) -> EventView:
    """Book a confirmed meeting between the user and `with` (a contact's name or email, or a user) at
    `starts_at` for `duration_minutes`. Fails with CONFLICT if either of them is no longer free then:
    propose new slots with schedule_meeting. Only confirm a time the counterpart agreed to."""
    caller, other = await both_parties(ctx, args.counterpart)
    start = args.starts_at
    end = start + timedelta(minutes=args.duration_minutes)
    if start < ctx.now:
        raise ToolFailure("VALIDATION_ERROR", "starts_at is in the past")
    await lock_calendars(ctx, [caller, other])
    clashes = await busy_times(ctx, [caller, other], start, end)
    if clashes:
        first = min(clashes)
        raise ToolFailure(
            "CONFLICT",
            f"not free: an event from {first[0].isoformat()} to {first[1].isoformat()} overlaps; "
            "propose other slots with schedule_meeting",
        )
    event = CalendarEvent(
        tenant_id=ctx.tenant_id,
        title=args.title or f"Meeting: {caller.name} / {other.name}",
        starts_at=start,
        ends_at=end,
        attendees=[caller.attendee(), other.attendee()],
        owner_user_id=caller.user_id,
        status="confirmed",
    )
    return EventView.of(await saved(ctx, event))


@compensates(confirm_meeting)
async def cancel_confirmed_meeting(
    ctx: ToolContext, args: ConfirmMeetingArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Cancel the booked event (kept, marked cancelled), unless someone changed its status since."""
    return await cancel_created(ctx, CalendarEvent, result)


# --- resolve_notification --------------------------------------------------------------------------

RESOLUTION_FIELDS = {"status", "resolved_at", "resolved_by"}


class ResolveNotificationArgs(ToolArgs):
    notification: str = Field(
        min_length=1, max_length=200, description="The notification's id, or words from its message"
    )
    resolution: str | None = Field(None, max_length=500, description="What was done about it")


class NotificationView(BaseModel):
    id: int
    kind: str
    message: str
    status: str
    resolved_at: datetime | None
    resolved_by: str | None
    resolution: str | None
    changed: bool  # False when it was already resolved


async def find_notification(ctx: ToolContext, ref: str) -> Notification:
    """A notification for the user (or for everyone in the tenant): by id, or by text among open ones."""
    visible = or_(Notification.user_id == ctx.caller.user_id, Notification.user_id.is_(None))
    number = record_id(ref)
    by_id = [visible & (Notification.id == number)] if number is not None else []
    by_text = visible & (Notification.status == "open") & containing(Notification.message, ref)
    rows = await match_first(ctx, Notification, *by_id, by_text, lock=True)
    if not rows:
        raise ToolFailure("NOT_FOUND", f"no notification {ref!r} for this user")
    if len(rows) > 1:
        raise needs("notification", [{"id": n.id, "kind": n.kind, "message": n.message[:160]} for n in rows])
    return rows[0]


@tool(risk="low", category="write")
@answers_needs
async def resolve_notification(ctx: ToolContext, args: ResolveNotificationArgs) -> NotificationView:
    """Mark one of the user's open notifications resolved, named by its id or by words from its
    message, with an optional note on what was done. An already resolved one is left as it is."""
    notification = await find_notification(ctx, args.notification)
    changed = notification.status == "open"
    if changed:
        notification.status = "resolved"
        notification.resolved_at = ctx.now
        notification.resolved_by = ctx.caller.user_id
        notification = await saved(ctx, notification)
    return NotificationView(
        id=notification.id,
        kind=notification.kind,
        message=notification.message,
        status=notification.status,
        resolved_at=notification.resolved_at,
        resolved_by=notification.resolved_by,
        resolution=args.resolution,
        changed=changed,
    )


@compensates(resolve_notification)
async def reopen_notification(
    ctx: ToolContext, args: ResolveNotificationArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Reopen the notification, only while it is still resolved by this very call."""
    if result is None or not result.get("changed"):
        return "never_happened"
    notification = await locked_row(ctx, Notification, result["id"])
    if notification is None:
        return "irreversible"
    previous = {"status": "open", "resolved_at": None, "resolved_by": None}
    changed = {name: result[name] for name in RESOLUTION_FIELDS}
    return restore_fields(notification, previous, changed, together=[RESOLUTION_FIELDS])
