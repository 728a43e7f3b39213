"""confirm_meeting, and the booking it shares with accept_meeting (tools/meeting_accept.py): who
meets when, checked free under both calendars' locks, booked, and undone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete

from countersign.core.effects import Creation, Effect, RecordChange, one_line
from countersign.db.leads import rescore_attendees
from countersign.db.notifications import RESOLUTION_FIELDS, mark_resolved
from countersign.db.schema import CalendarEvent, MeetingSession, Notification
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
    cancel_created,
    locked_row,
    match_first,
    resolve_caller,
    restore_fields,
    saved,
)
from tools.scheduling.emails import invite_email
from tools.scheduling.models import BookedMeeting, ConfirmMeetingArgs, ResolvedMark, ask_for_missing
from tools.scheduling.storage import (
    both_parties,
    busy_times,
    lock_calendars,
    session_answered,
    session_counterpart,
)
from tools.scheduling.zones import local_span, zone_of


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
        when = local_span(self.start, self.end, zone)
        return invite_email(self.title, when, (self.organiser, self.other), self.booker)

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
