"""Scheduling tools: negotiate a meeting with a counterpart, book it safely, close notifications.

schedule_meeting opens a negotiation session (stored in `meeting_sessions`, open for 30 minutes)
with up to 5 proposals when both people are free, inside business hours (09:00-17:00, Monday to
Friday) in *each* person's time zone: a user's `tz` from the database, a contact's from the
caller's `tz_hint` (UTC without one). The counterpart is told: a notification row (theirs when
they are a user) and an email through the outbox, delivered after the turn's undo window.
confirm_meeting books proposal N of a session, or a custom time, and emails an invite to both.
A session past its 30 minutes answers `needs` (propose again): calendars move. Asking again for the
same person and length while a session for an overlapping window is open answers that session
(`still_open`, nothing sent twice); a booking with the same person inside its window, with or
without naming the session, closes it.

A person is busy during every event that is not cancelled and that they own or attend (listed by
user id or email). The clocks are `ctx.now` and `ctx.asked` (when the call was put to a reviewer),
so proposals are deterministic. The default window starts MIN_NOTICE after the call was asked, not
after now: the run after an approval proposes exactly the times the reviewer saw, as long as they
are still free and still ahead; a time taken or begun meanwhile is a changed effect, asked again.

confirm_meeting cannot double-book: it takes a transaction-scoped advisory lock per person (in a
fixed order, so two bookings never deadlock) before checking the slot again, and the lock is held
until its transaction commits. A concurrent booking for either person therefore waits, then sees the
committed event and fails with CONFLICT.
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import (
    BindParameter,
    ColumnElement,
    DateTime,
    Select,
    String,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
)

from countersign.core.effects import Creation, Effect, RecordChange, one_line
from countersign.db.leads import rescore_attendees
from countersign.db.notifications import RESOLUTION_FIELDS, mark_resolved
from countersign.db.schema import CalendarEvent, MeetingSession, Notification, User
from tools.effects import field_changes, json_fields
from tools.email import EmailContent, cancel_queued_email, email_effect, queued_once
from tools.operations import EventView
from tools.registry import (
    Needs,
    NeedsInput,
    Plan,
    ToolArgs,
    ToolContext,
    ToolFailure,
    UndoOutcome,
    compensates,
    tool,
)
from tools.resolve import (
    Person,
    RowView,
    UtcDatetime,
    belongs_to,
    caller_and_person,
    cancel_created,
    events_of,
    locked_row,
    match_first,
    overlapping,
    resolve_caller,
    restore_fields,
    saved,
)

DAY_START, DAY_END = time(9), time(17)  # local business hours, in each person's zone
SLOT_STEP = timedelta(minutes=30)
DEFAULT_DAYS = 5
MAX_WINDOW = timedelta(days=31)
MAX_SLOTS = 5
SESSION_TTL = timedelta(minutes=30)
# How far ahead of the call the first default proposal lies: the counterpart needs time to answer,
# and a reviewer to decide (a decision taking longer than this may find the first time begun).
MIN_NOTICE = timedelta(hours=1)

WITH_HELP = "The counterpart: a contact's name or email, or a user's id, name or email"
MIN_MINUTES, MAX_MINUTES = 5, 240
DURATION_HELP = f"Length of the meeting in minutes, {MIN_MINUTES}-{MAX_MINUTES}"


@functools.cache
def known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _iana_zone(name: str) -> str:
    if name not in known_zones():
        raise ValueError("must be an IANA time zone name, e.g. Europe/Berlin or America/New_York")
    return name


IanaZone = Annotated[str, AfterValidator(_iana_zone)]


# --- business hours --------------------------------------------------------------------------------


def is_business_day(day: date) -> bool:
    return day.weekday() < 5


def default_window(start: datetime) -> tuple[datetime, datetime]:
    """From `start` to the end of the fifth business day (UTC) that still has working time left."""
    day, days = start.date(), 0
    while True:
        closes = datetime.combine(day, DAY_END, tzinfo=UTC)
        if is_business_day(day) and closes > start:
            days += 1
            if days == DEFAULT_DAYS:
                return start, closes
        day += timedelta(days=1)


def round_up(moment: datetime) -> datetime:
    """The first slot boundary (a multiple of SLOT_STEP past midnight UTC) at or after `moment`."""
    midnight = datetime.combine(moment.date(), time(tzinfo=UTC))
    steps = -(-(moment - midnight) // SLOT_STEP)  # ceiling division
    return midnight + steps * SLOT_STEP


def business_spans(
    zone: zoneinfo.ZoneInfo, start: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """09:00-17:00 of each business day in `zone` from `start`'s local date to `end`'s, in UTC, in
    time order."""
    spans = []
    day, last = start.astimezone(zone).date(), end.astimezone(zone).date()
    while day <= last:
        if is_business_day(day):
            opens = datetime.combine(day, DAY_START, tzinfo=zone).astimezone(UTC)
            spans.append((opens, datetime.combine(day, DAY_END, tzinfo=zone).astimezone(UTC)))
        day += timedelta(days=1)
    return spans


def intersect(
    a: Sequence[tuple[datetime, datetime]], b: Sequence[tuple[datetime, datetime]]
) -> list[tuple[datetime, datetime]]:
    """Where two lists of disjoint spans in time order overlap, in time order."""
    both: list[tuple[datetime, datetime]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            both.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return both


def without(
    spans: Sequence[tuple[datetime, datetime]], busy: Sequence[tuple[datetime, datetime]]
) -> list[tuple[datetime, datetime]]:
    """`spans` (disjoint, in time order) less the `busy` times (in any order, overlapping or not)."""
    taken = sorted(busy)
    left: list[tuple[datetime, datetime]] = []
    for lo, hi in spans:
        for b_lo, b_hi in taken:
            if b_lo >= hi:
                break
            if b_hi <= lo:
                continue
            if b_lo > lo:
                left.append((lo, b_lo))
            lo = max(lo, b_hi)
        if lo < hi:
            left.append((lo, hi))
    return left


def free_starts(
    start: datetime,
    end: datetime,
    length: timedelta,
    zones: Sequence[zoneinfo.ZoneInfo],
    busy: Sequence[tuple[datetime, datetime]],
) -> Iterator[datetime]:
    """Slot starts (multiples of SLOT_STEP past midnight UTC) whose whole slot lies inside the
    window, inside one business day's 09:00-17:00 in every zone, and outside every busy time, in
    time order.

    Found span by span (the window intersected with each zone's working days, less the busy times),
    not by testing every step of the window in each zone and against each busy time: a week's
    nights and weekend are most of its steps (docs/benchmark.md, "schedule_meeting, second pass")."""
    spans = [(start, end)]
    for zone in zones:
        spans = intersect(spans, business_spans(zone, start, end))
    for opens, closes in without(spans, busy):
        moment = round_up(opens)
        while moment + length <= closes:
            yield moment
            moment += SLOT_STEP


def pick_slots(starts: Sequence[datetime], limit: int) -> list[datetime]:
    """Spread proposals: the first free slot of each day, then the earliest others, in time order."""
    firsts = [s for i, s in enumerate(starts) if i == 0 or starts[i - 1].date() != s.date()]
    chosen = set(firsts)
    others = [s for s in starts if s not in chosen]
    return sorted((firsts + others)[:limit])


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


def zone_of(person: Person, hint: str | None) -> str:
    """A user's zone, as read with them from the database; a contact's from the caller's hint, else UTC."""
    if person.user_id is not None:
        return person.tz or "UTC"
    return hint or "UTC"


# --- schedule_meeting ------------------------------------------------------------------------------


class ScheduleMeetingArgs(ToolArgs):
    model_config = ConfigDict(serialize_by_alias=True)

    # Both optional in the schema: a request that leaves one out answers `needs`, so the model asks
    # the user instead of inventing a length or a person (a VALIDATION_ERROR invites a guess).
    counterpart: str | None = Field(None, alias="with", min_length=1, max_length=320, description=WITH_HELP)
    duration_minutes: int | None = Field(None, ge=MIN_MINUTES, le=MAX_MINUTES, description=DURATION_HELP)
    window_start: UtcDatetime | None = Field(
        None, description="Earliest start, ISO date-time (default: an hour from now)"
    )
    window_end: UtcDatetime | None = Field(
        None, description="Latest end, ISO date-time (default: the end of the fifth business day)"
    )
    title: str | None = Field(None, max_length=200, description="What the meeting is about")
    tz_hint: IanaZone | None = Field(
        None,
        max_length=64,
        description="The counterpart's IANA time zone (e.g. Europe/Berlin) when they are a contact; "
        "a user's zone comes from the workspace",
    )

    @model_validator(mode="after")
    def _window_in_order(self) -> ScheduleMeetingArgs:
        if self.window_start and self.window_end and self.window_end <= self.window_start:
            raise ValueError("window_end must be after window_start")
        return self


class PersonView(RowView):
    name: str
    email: str | None
    user_id: str | None


class Slot(BaseModel):
    """One proposal: its UTC start and end, and the local times in each person's zone."""

    index: int  # what confirm_meeting's `selection` names, from 1
    starts_at: datetime
    ends_at: datetime
    time_zone: str  # the counterpart's
    counterpart_local: str  # e.g. "Tue 2026-12-08 10:00-10:30 Europe/Berlin"
    user_local: str


class MeetingProposal(BaseModel):
    session: int | None  # None when there is nothing to propose (no session is opened)
    expires_at: datetime | None
    counterpart: PersonView
    title: str | None
    duration_minutes: int
    window_start: datetime
    window_end: datetime
    user_time_zone: str
    counterpart_time_zone: str
    slots: list[Slot]  # empty: nobody is free long enough in the window
    notification_id: int | None
    outbox_ids: list[int]  # the email telling the counterpart, queued until the turn's undo window ends
    status: str  # "queued" when an email waits in the outbox


def proposal_window(ctx: ToolContext, args: ScheduleMeetingArgs) -> tuple[datetime, datetime]:
    """The window asked for; by default from MIN_NOTICE after the call was asked (`ctx.asked`: the
    same for the plan a reviewer decides on and the one that runs after it) to the fifth business
    day's end."""
    start, end = default_window(ctx.asked + MIN_NOTICE)
    start = args.window_start or start
    end = args.window_end or (default_window(start)[1] if args.window_start else end)
    if end <= start:
        raise ToolFailure("VALIDATION_ERROR", "the window ends before it starts")
    if end - start > MAX_WINDOW:
        raise ToolFailure("VALIDATION_ERROR", "the window may span at most 31 days")
    return start, end


def local_span(start: datetime, end: datetime, zone: str) -> str:
    local_start, local_end = (
        start.astimezone(zoneinfo.ZoneInfo(zone)),
        end.astimezone(zoneinfo.ZoneInfo(zone)),
    )
    return f"{local_start:%a %Y-%m-%d %H:%M}-{local_end:%H:%M} {zone}"


def proposal_email(caller: Person, title: str | None, minutes: int, slots: Sequence[Slot]) -> EmailContent:
    lines = [f"{slot.index}. {slot.counterpart_local}" for slot in slots]
    subject = f"Meeting request from {caller.name}" + (f": {title}" if title else "")
    body = (
        f"{caller.name} would like to meet for {minutes} minutes"
        + (f" about {title}" if title else "")
        + ". Proposed times (your time zone):\n\n"
        + "\n".join(lines)
        + f"\n\nReply to {caller.email or caller.name} with the one that suits you."
    )
    return EmailContent(subject=subject[:200], body=body)


@dataclass(frozen=True)
class Proposing:
    """What a schedule_meeting call resolves to before it writes anything."""

    caller: Person
    other: Person
    proposal: MeetingProposal  # without session, notification and outbox ids; or the open one's
    still_open: bool = False  # the proposal is a session already open for the same request

    def message(self) -> str:
        """The counterpart's notification."""
        p = self.proposal
        return (
            f"{self.caller.name} proposed {len(p.slots)} times to meet {self.other.name}"
            + (f" about {p.title}" if p.title else "")
            + f": {'; '.join(slot.counterpart_local for slot in p.slots)}"
        )

    def email(self) -> EmailContent:
        return proposal_email(
            self.caller, self.proposal.title, self.proposal.duration_minutes, self.proposal.slots
        )


async def proposing(ctx: ToolContext, args: ScheduleMeetingArgs, *, lock: bool) -> Proposing:
    """Who, when and which free slots a schedule_meeting call proposes (`lock`: the calendars too,
    so two proposals at once do not both see them free)."""
    ask_for_missing({"with": args.counterpart, "duration_minutes": args.duration_minutes})
    assert args.counterpart is not None and args.duration_minutes is not None
    caller, other = await both_parties(ctx, args.counterpart)
    start, end = proposal_window(ctx, args)
    if lock:
        await lock_calendars(ctx, [caller, other])
    user_tz, other_tz = zone_of(caller, None), zone_of(other, args.tz_hint)
    duplicate, busy = await open_duplicate_or_busy(ctx, caller, other, start, end)
    if duplicate is not None:
        if duplicate.duration_minutes != args.duration_minutes:
            raise ToolFailure(
                "CONFLICT",
                f"session {duplicate.id} with {duplicate.counterpart_name} is still open until "
                f"{duplicate.expires_at.isoformat()} for an overlapping window and "
                f"{duplicate.duration_minutes} minutes: confirm one of its proposals with "
                f"confirm_meeting (session {duplicate.id}) instead of proposing again",
            )
        return Proposing(caller, other, open_proposal(duplicate, other, user_tz), still_open=True)
    zones = [zoneinfo.ZoneInfo(user_tz), zoneinfo.ZoneInfo(other_tz)]
    length = timedelta(minutes=args.duration_minutes)
    begun = max(start, ctx.now)  # a time already begun is not proposed
    free = list(free_starts(begun, end, length, zones, busy))
    slots = [
        Slot(
            index=i,
            starts_at=s,
            ends_at=s + length,
            time_zone=other_tz,
            counterpart_local=local_span(s, s + length, other_tz),
            user_local=local_span(s, s + length, user_tz),
        )
        for i, s in enumerate(pick_slots(free, MAX_SLOTS), start=1)
    ]
    proposal = MeetingProposal(
        session=None,
        expires_at=None,
        counterpart=PersonView.model_validate(other),
        title=args.title,
        duration_minutes=args.duration_minutes,
        window_start=start,
        window_end=end,
        user_time_zone=user_tz,
        counterpart_time_zone=other_tz,
        slots=slots,
        notification_id=None,
        outbox_ids=[],
        status="no_slots",
    )
    return Proposing(caller, other, proposal)


@dataclass(kw_only=True)
class ProposalPlan(Plan):
    """A schedule_meeting call's plan: the proposal as `proposing` resolved it."""

    args: ScheduleMeetingArgs
    proposing: Proposing
    requester: str  # the user notified when the counterpart is no user

    def effect(self) -> Effect:
        return proposal_effect(self.proposing, self.requester)


async def plan_schedule_meeting(ctx: ToolContext, args: ScheduleMeetingArgs) -> ProposalPlan:
    proposed = await proposing(ctx, args, lock=ctx.lock_reads)
    return ProposalPlan(args=args, proposing=proposed, requester=ctx.caller.user_id)


def proposal_effect(plan: Proposing, requester: str) -> Effect:
    """The times proposed (from the calendars as the plan read them) and the email that offers them."""
    p = plan.proposal
    if plan.still_open:
        return Effect(
            summary=one_line(
                f"Changes nothing: proposal {p.session} to {plan.other.name} is still open until "
                f"{p.expires_at:%Y-%m-%d %H:%M} UTC; its {len(p.slots)} times are answered again"
            )
        )
    if not p.slots:
        return Effect(summary=one_line(f"Nothing: {plan.other.name} and the user have no common free time"))
    assert plan.other.email is not None  # resolve_person refuses a contact without one
    email = email_effect(plan.other.email, plan.email(), plan.other.name)
    session = Creation(
        kind="meeting proposal",
        label=f"meeting proposal to {plan.other.name}, open for 30 minutes",
        fields=json_fields({"title": p.title, "slots": [slot.counterpart_local for slot in p.slots]}),
    )
    notice = Creation(
        kind="notification",
        label=f"notification for {plan.other.user_id or requester}",
        fields={"message": plan.message()},
    )
    return Effect(
        summary=one_line(f"Proposes {len(p.slots)} times to {plan.other.name} ({plan.other.email}) by email"),
        messages=email.messages,
        creates=[session, notice],
    )


@tool(
    risk="medium",
    category="external",
    scopes=("calendar:availability", "calendar:propose"),
    plan=plan_schedule_meeting,
)
async def schedule_meeting(ctx: ToolContext, planned: ProposalPlan) -> MeetingProposal:
    """Open a scheduling negotiation with `with` (a contact's name or email, or a user): up to 5
    proposals when both are free, within 09:00-17:00 Monday-Friday in *each* person's time zone
    (a contact's from `tz_hint`, else UTC) and the window (default: the next 5 business days). The
    counterpart is notified and emailed the proposals. Books nothing: confirm_meeting books one
    with the returned `session` within 30 minutes. Asked again for the same person and length while
    that session is open, it answers the open session (status `still_open`) and sends nothing."""
    plan, args = planned.proposing, planned.args
    if plan.still_open or not plan.proposal.slots:
        return plan.proposal
    session = await open_session(ctx, plan, args)
    assert plan.other.email is not None
    queued = await queued_once(ctx, plan.other.email, plan.email())
    return plan.proposal.model_copy(
        update={
            "session": session.id,
            "expires_at": session.expires_at,
            "notification_id": session.notification_id,
            "outbox_ids": [queued.outbox_id],
            "status": "queued",
        }
    )


def ask_for_missing(values: dict[str, object]) -> None:
    """Stop with `needs` naming every argument the user has yet to give."""
    missing = {name: True for name, value in values.items() if value is None}
    if missing:
        raise NeedsInput(Needs(fields=missing))


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


def open_proposal(session: MeetingSession, other: Person, user_tz: str) -> MeetingProposal:
    """An open session as schedule_meeting answers it when asked again: nothing new was sent."""
    return MeetingProposal(
        session=session.id,
        expires_at=session.expires_at,
        counterpart=PersonView.model_validate(other),
        title=session.title,
        duration_minutes=session.duration_minutes,
        window_start=session.window_start,
        window_end=session.window_end,
        user_time_zone=user_tz,
        counterpart_time_zone=session.counterpart_tz,
        slots=[Slot.model_validate(slot) for slot in session.proposals],
        notification_id=session.notification_id,
        outbox_ids=[],
        status="still_open",
    )


async def open_session(ctx: ToolContext, plan: Proposing, args: ScheduleMeetingArgs) -> MeetingSession:
    """Store the negotiation (once per call) and the counterpart's notification."""
    existing = await ctx.session.scalar(
        select(MeetingSession).where(MeetingSession.idempotency_key == ctx.idempotency_key)
    )
    if existing is not None:
        return existing
    other, p = plan.other, plan.proposal
    assert other.email is not None  # resolve_person refuses a contact without one
    notification = await saved(
        ctx,
        Notification(
            tenant_id=ctx.tenant_id,
            # a contact has no inbox here: the requester's own record of the open request
            user_id=other.user_id or ctx.caller.user_id,
            kind="meeting_proposal",
            message=plan.message(),
            workflow_id=ctx.workflow_id,
            call_id=ctx.call_id,
        ),
    )
    return await saved(
        ctx,
        MeetingSession(
            tenant_id=ctx.tenant_id,
            idempotency_key=ctx.idempotency_key,
            requested_by=ctx.caller.user_id,
            counterpart_name=other.name,
            counterpart_email=other.email,
            counterpart_user_id=other.user_id,
            counterpart_tz=p.counterpart_time_zone,
            title=args.title,
            duration_minutes=p.duration_minutes,
            window_start=p.window_start,
            window_end=p.window_end,
            proposals=[slot.model_dump(mode="json") for slot in p.slots],
            expires_at=ctx.now + SESSION_TTL,
            notification_id=notification.id,
        ),
    )


@compensates(schedule_meeting)
async def withdraw_proposal(
    ctx: ToolContext, args: ScheduleMeetingArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Cancel the session, delete its notification and cancel the email while still queued; an
    email already delivered cannot be taken back ("irreversible")."""
    if result is None or result.get("session") is None or result.get("status") == "still_open":
        return "never_happened"  # nothing proposed, or another call's open session answered again
    session = await locked_row(ctx, MeetingSession, result["session"])
    if session is None:
        return "never_happened"
    if session.status == "confirmed":
        return "irreversible"  # a meeting was booked from it: undo that call instead
    already = session.status == "cancelled"
    session.status = "cancelled"
    if session.notification_id is not None:
        await ctx.session.execute(
            delete(Notification).where(
                Notification.id == session.notification_id, Notification.tenant_id == ctx.tenant_id
            )
        )
    emails = [await cancel_queued_email(ctx, {"outbox_id": i}) for i in result.get("outbox_ids", [])]
    if "irreversible" in emails:
        return "irreversible"
    return "already_undone" if already else "undone"


# --- confirm_meeting -------------------------------------------------------------------------------


class ConfirmMeetingArgs(ToolArgs):
    model_config = ConfigDict(serialize_by_alias=True)

    session: int | None = Field(None, ge=1, description="The `session` schedule_meeting returned")
    selection: int | None = Field(
        None, ge=1, le=MAX_SLOTS, description="Which of the session's proposals (its `index`, from 1)"
    )
    counterpart: str | None = Field(
        None,
        alias="with",
        min_length=1,
        max_length=320,
        description=f"{WITH_HELP}; only without a session",
    )
    starts_at: UtcDatetime | None = Field(
        None,
        description="A custom start, ISO date-time with time zone, e.g. 2026-12-08T16:00:00Z (instead of "
        "a selection; without a session, the time agreed with `with`)",
    )
    duration_minutes: int | None = Field(
        None, ge=MIN_MINUTES, le=MAX_MINUTES, description=f"{DURATION_HELP} (default: the session's)"
    )
    title: str | None = Field(None, max_length=200, description="Title (default: 'Meeting: <user> / <them>')")

    @model_validator(mode="after")
    def _one_way_to_name_the_time(self) -> ConfirmMeetingArgs:
        if self.session is not None:
            if (self.selection is None) == (self.starts_at is None):
                raise ValueError("with a session, give either selection or starts_at")
            if self.counterpart is not None:
                raise ValueError("with a session, the counterpart is the session's: leave `with` out")
        elif self.counterpart is None or self.starts_at is None:
            raise ValueError("give a session (and a selection or starts_at), or `with` and starts_at")
        elif self.selection is not None:
            raise ValueError("selection needs a session")
        return self


class ResolvedMark(BaseModel):
    """A notification a booking resolved, as it set it: what its undo puts back, if still so."""

    id: int
    status: str
    resolved_at: datetime | None
    resolved_by: str | None


class BookedMeeting(EventView):
    session: int | None
    invited: list[str]  # the emails an invite went to
    outbox_ids: list[int]  # the invites, queued until the turn's undo window ends
    delivery: str  # "queued"
    resolved_notification: ResolvedMark | None  # the session's proposal, resolved by this booking
    notified: int | None  # the `meeting_booked` notification of the user who did not book


def still_open(session: MeetingSession, now: datetime, next_step: str) -> MeetingSession:
    """The session when it can still be booked; CONFLICT when booked, `needs` when over."""
    if session.status == "confirmed":
        raise ToolFailure("CONFLICT", f"session {session.id} is already booked (event {session.event_id})")
    if session.status == "cancelled" or session.expires_at <= now:
        state = (
            "was cancelled"
            if session.status == "cancelled"
            else f"expired at {session.expires_at.isoformat()}"
        )
        raise NeedsInput(
            Needs(
                fields={"session": True},
                candidates=[{"session": session.id, "state": state, "next": next_step}],
            )
        )
    return session


async def open_session_for(ctx: ToolContext, session_id: int, *, lock: bool) -> MeetingSession:
    """The caller's own session (`lock`: locked), still open and not expired; else a clear refusal."""
    rows = await match_first(
        ctx,
        MeetingSession,
        (MeetingSession.id == session_id) & (MeetingSession.requested_by == ctx.caller.user_id),
        lock=lock,
    )
    if not rows:
        raise ToolFailure("NOT_FOUND", f"no scheduling session {session_id} of yours in this workspace")
    return still_open(rows[0], ctx.now, "propose again with schedule_meeting: calendars may have changed")


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


def proposed_start(session: MeetingSession, selection: int) -> datetime:
    if selection > len(session.proposals):
        raise ToolFailure("VALIDATION_ERROR", f"session {session.id} has {len(session.proposals)} proposals")
    return datetime.fromisoformat(session.proposals[selection - 1]["starts_at"])


async def meeting_parties(
    ctx: ToolContext, args: ConfirmMeetingArgs, *, lock: bool
) -> tuple[Person, Person, datetime, int, MeetingSession | None]:
    """Who meets when, from the session (a selection or a custom start) or from `with` and starts_at
    (the session then being the caller's open one with them whose window holds the meeting)."""
    if args.session is None:
        assert args.counterpart is not None and args.starts_at is not None
        ask_for_missing({"duration_minutes": args.duration_minutes})
        assert args.duration_minutes is not None
        caller, other = await both_parties(ctx, args.counterpart)
        end = args.starts_at + timedelta(minutes=args.duration_minutes)
        answered = await session_answered(ctx, other, args.starts_at, end, lock=lock)
        return caller, other, args.starts_at, args.duration_minutes, answered
    session = await open_session_for(ctx, args.session, lock=lock)
    duration = args.duration_minutes or session.duration_minutes
    start = args.starts_at if args.selection is None else proposed_start(session, args.selection)
    assert start is not None
    return await resolve_caller(ctx), await session_counterpart(ctx, session), start, duration, session


@dataclass(frozen=True)
class Booking:
    """A meeting as a booking call resolves it before writing anything: who meets when, under which
    title, who books it, and each person's time zone (their invite and notice are written in it)."""

    organiser: Person
    other: Person
    booker: Person
    start: datetime
    end: datetime
    title: str
    session: MeetingSession | None
    readers: tuple[tuple[Person, str], ...]  # (person, time zone): the organiser, then the other

    def invites(self) -> list[tuple[int, str, EmailContent]]:
        """(n, address, invite) for each person with an address; `n` keys the invite's outbox row."""
        return [(n, p.email, self.invite(zone)) for n, (p, zone) in enumerate(self.readers) if p.email]

    def invite(self, zone: str) -> EmailContent:
        return EmailContent(
            subject=f"Invitation: {self.title}"[:200],
            body=f"{self.title}\n{local_span(self.start, self.end, zone)}\n"
            f"Attendees: {self.organiser.name}, {self.other.name}\n"
            f"Booked by {self.booker.name} through Countersign.",
        )

    def told(self) -> tuple[Person, str] | None:
        """The user who did not book (with their zone): told by a `meeting_booked` notification."""
        return next(
            ((p, z) for p, z in self.readers if p.user_id is not None and p.key != self.booker.key), None
        )

    def notice(self, zone: str) -> str:
        return (
            f"{self.booker.name} booked {self.title!r}: {local_span(self.start, self.end, zone)}, "
            f"with {self.organiser.name} and {self.other.name}"
        )

    def event_values(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "starts_at": self.start,
            "ends_at": self.end,
            "attendees": [self.organiser.attendee(), self.other.attendee()],
            "owner_user_id": self.organiser.user_id,
            "status": "confirmed",
        }


async def booking(
    ctx: ToolContext,
    organiser: Person,
    other: Person,
    start: datetime,
    duration: int,
    session: MeetingSession | None,
    title: str | None = None,
    *,
    lock: bool,
) -> Booking:
    """Check that `organiser` and `other` are both free at `start` for `duration` minutes (`lock`:
    under their calendars' locks, held until the transaction ends) and resolve the booking."""
    end = start + timedelta(minutes=duration)
    if start < ctx.now:
        raise ToolFailure("VALIDATION_ERROR", "starts_at is in the past")
    if lock:
        await lock_calendars(ctx, [organiser, other])
    clashes = await busy_times(ctx, [organiser, other], start, end)
    if clashes:
        first = min(clashes)
        raise ToolFailure(
            "CONFLICT",
            f"not free: an event from {first[0].isoformat()} to {first[1].isoformat()} overlaps; "
            "propose other slots with schedule_meeting",
        )
    other_tz = session.counterpart_tz if session else zone_of(other, None)
    readers = ((organiser, zone_of(organiser, None)), (other, other_tz))
    return Booking(
        organiser=organiser,
        other=other,
        booker=next((p for p, _ in readers if p.user_id == ctx.caller.user_id), organiser),
        start=start,
        end=end,
        title=title or (session.title if session else None) or f"Meeting: {organiser.name} / {other.name}",
        session=session,
        readers=readers,
    )


async def resolve_proposal(ctx: ToolContext, session: MeetingSession) -> ResolvedMark | None:
    """Close the session's proposal notification: the booking answered it."""
    if session.notification_id is None:
        return None
    notification = await locked_row(ctx, Notification, session.notification_id)
    if notification is None or not mark_resolved(notification, ctx.caller.user_id, ctx.now):
        return None
    return ResolvedMark(
        id=notification.id,
        status=notification.status,
        resolved_at=notification.resolved_at,
        resolved_by=notification.resolved_by,
    )


async def book(ctx: ToolContext, plan: Booking) -> BookedMeeting:
    """Book the meeting `booking` resolved (under its locks), whichever of the two calls.

    Both get an invite by email, the session (if any) is confirmed and its proposal notification
    resolved, and the one who did not book, when a user, gets a `meeting_booked` notification."""
    event = await saved(ctx, CalendarEvent(tenant_id=ctx.tenant_id, **plan.event_values()))
    resolved = None
    session = plan.session
    if session is not None:
        session.status, session.event_id = "confirmed", event.id
        resolved = await resolve_proposal(ctx, session)
    await rescore_attendees(ctx.session, ctx.tenant_id, event.attendees)
    invited, outbox_ids = [], []
    for n, address, content in plan.invites():
        invited.append(address)
        key = f"{ctx.idempotency_key}:invite:{n}"
        outbox_ids.append((await queued_once(ctx, address, content, key=key)).outbox_id)
    told, notified = plan.told(), None
    if told is not None:
        notice = Notification(
            tenant_id=ctx.tenant_id,
            user_id=told[0].user_id,
            kind="meeting_booked",
            message=plan.notice(told[1]),
            workflow_id=ctx.workflow_id,
            call_id=ctx.call_id,
        )
        notified = (await saved(ctx, notice)).id
    return BookedMeeting(
        **EventView.model_validate(event).model_dump(),
        session=session.id if session else None,
        invited=invited,
        outbox_ids=outbox_ids,
        delivery="queued",
        resolved_notification=resolved,
        notified=notified,
    )


@dataclass(kw_only=True)
class BookingPlan(Plan):
    """A booking call's plan: the meeting `booking` resolved, and its session's proposal
    notification as the plan read it (resolved by the booking while open)."""

    booking: Booking
    notification: Notification | None

    def effect(self) -> Effect:
        return booking_effect(self.booking, self.notification)


async def booking_plan(ctx: ToolContext, args: ToolArgs, booked: Booking) -> BookingPlan:
    """The plan of booking `booked`: it reads the session's proposal notification."""
    session = booked.session
    notification = (
        await ctx.session.get(Notification, session.notification_id)
        if session is not None and session.notification_id
        else None
    )
    return BookingPlan(args=args, booking=booked, notification=notification)


def booking_effect(plan: Booking, notification: Notification | None) -> Effect:
    """The event created, the invites as they will leave, the session confirmed and its proposal's
    notification resolved, the other user notified."""
    event = Creation(kind="event", label=f"event “{plan.title}”", fields=json_fields(plan.event_values()))
    creates = [event]
    told = plan.told()
    if told is not None:
        creates.append(
            Creation(
                kind="notification",
                label=f"notification for {told[0].user_id}",
                fields={"message": plan.notice(told[1])},
            )
        )
    changes = []
    if plan.session is not None:
        session = plan.session
        fields = field_changes({"status": session.status}, {"status": "confirmed"})
        changes.append(
            RecordChange(
                kind="meeting proposal",
                id=str(session.id),
                label=f"meeting proposal {session.id}",
                fields=fields,
            )
        )
        if notification is not None and notification.status == "open":
            fields = field_changes({"status": "open"}, {"status": "resolved"})
            label = f"notification {notification.id} ({notification.kind})"
            changes.append(
                RecordChange(kind="notification", id=str(notification.id), label=label, fields=fields)
            )
    messages = [email_effect(address, content).messages[0] for _, address, content in plan.invites()]
    when = local_span(plan.start, plan.end, plan.readers[0][1])
    invited = ", ".join(message.to[0] for message in messages) or "nobody (no addresses)"
    return Effect(
        summary=one_line(
            f"Books “{plan.title}” {when} with {plan.organiser.name} and {plan.other.name}; invites {invited}"
        ),
        changes=changes,
        messages=messages,
        creates=creates,
    )


async def plan_confirm_meeting(ctx: ToolContext, args: ConfirmMeetingArgs) -> BookingPlan:
    caller, other, start, duration, session = await meeting_parties(ctx, args, lock=ctx.lock_reads)
    booked = await booking(ctx, caller, other, start, duration, session, args.title, lock=ctx.lock_reads)
    return await booking_plan(ctx, args, booked)


@tool(
    risk="medium",
    category="external",
    scopes=("calendar:availability", "calendar:book"),
    plan=plan_confirm_meeting,
)
async def confirm_meeting(ctx: ToolContext, plan: BookingPlan) -> BookedMeeting:
    """Book a meeting and email an invite to both people: proposal `selection` of a schedule_meeting
    `session`, or a custom `starts_at` with that session; or, without a session, `with` at
    `starts_at` for `duration_minutes`. Both calendars are checked again under a lock: CONFLICT if
    either is no longer free (propose again). An expired session (30 minutes) answers `needs`.
    Only confirm a time the counterpart agreed to. The counterpart's proposal notification is
    resolved, and a counterpart who is a user is notified of the booking."""
    return await book(ctx, plan.booking)


async def cancel_booking(ctx: ToolContext, args: Any, result: dict[str, Any] | None) -> UndoOutcome:
    """Cancel the booked event (kept, marked cancelled) unless someone changed its status since,
    cancel the invites still queued, reopen the session it came from and its proposal notification
    (unless someone changed it since), and withdraw the booking's notification."""
    outcome = await cancel_created(ctx, CalendarEvent, result)
    if result is None:
        return outcome
    await rescore_attendees(ctx.session, ctx.tenant_id, result.get("attendees", []))
    if result.get("session") is not None and outcome == "undone":
        session = await locked_row(ctx, MeetingSession, result["session"])
        if session is not None and session.status == "confirmed" and session.event_id == result.get("id"):
            session.status, session.event_id = "open", None
        mark = result.get("resolved_notification")
        notification = await locked_row(ctx, Notification, mark["id"]) if mark else None
        if mark and notification is not None:  # reopened only while still resolved by this booking
            previous = {"status": "open", "resolved_at": None, "resolved_by": None}
            changed = {name: mark[name] for name in RESOLUTION_FIELDS}
            restore_fields(notification, previous, changed, together=[RESOLUTION_FIELDS])
    if outcome == "undone" and result.get("notified") is not None:
        await ctx.session.execute(
            delete(Notification).where(
                Notification.id == result["notified"], Notification.tenant_id == ctx.tenant_id
            )
        )
    emails = [await cancel_queued_email(ctx, {"outbox_id": i}) for i in result.get("outbox_ids", [])]
    return "irreversible" if "irreversible" in emails and outcome == "undone" else outcome


compensates(confirm_meeting)(cancel_booking)
