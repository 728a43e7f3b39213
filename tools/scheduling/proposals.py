"""schedule_meeting: free times proposed to a counterpart in a negotiation session, and its undo."""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select

from countersign.core.effects import Creation, Effect, one_line
from countersign.db.schema import MeetingSession, Notification
from tools.effects import json_fields
from tools.email import EmailContent, cancel_queued_email, email_effect, queued_once
from tools.registry import Plan, ToolContext, ToolFailure, UndoOutcome, compensates, tool
from tools.resolve import Person, locked_row, saved
from tools.scheduling.emails import proposal_email
from tools.scheduling.models import MeetingProposal, PersonView, ScheduleMeetingArgs, Slot, ask_for_missing
from tools.scheduling.slots import MAX_SLOTS, default_window, free_starts, pick_slots
from tools.scheduling.storage import both_parties, lock_calendars, open_duplicate_or_busy
from tools.scheduling.zones import local_span, zone_of

MAX_WINDOW = timedelta(days=31)


SESSION_TTL = timedelta(minutes=30)


# How far ahead of the call the first default proposal lies: the counterpart needs time to answer,
# and a reviewer to decide (a decision taking longer than this may find the first time begun).
MIN_NOTICE = timedelta(hours=1)


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
