"""accept_meeting: the counterpart of a proposal, when they are a user, books one of its slots
through their own agent, in their own conversation.

The session stays the requester's (only they may confirm_meeting it, or undo the proposal); this
tool reads only sessions addressed to the caller (`counterpart_user_id`), so a user can never book
someone else's proposal. The booking is the same as the requester's confirm_meeting
(tools/scheduling/bookings.py `book`): both calendars re-checked under the lock, an invite to both, the
proposal notification resolved, and the requester told by a `meeting_booked` notification.
"""

from __future__ import annotations

from pydantic import Field
from sqlalchemy import select

from countersign.db.schema import MeetingSession, User
from tools.registry import Needs, NeedsInput, ToolArgs, ToolContext, ToolFailure, compensates, tool
from tools.resolve import Person, needs, resolve_caller
from tools.scheduling.bookings import (
    Booking,
    BookingPlan,
    book,
    booking,
    booking_plan,
    cancel_booking,
    proposed_start,
    still_open,
)
from tools.scheduling.models import BookedMeeting
from tools.scheduling.slots import MAX_SLOTS


class AcceptMeetingArgs(ToolArgs):
    session: int | None = Field(
        None,
        ge=1,
        description="The proposal's session; leave it out when only one is open (with several, the "
        "answer lists them)",
    )
    selection: int | None = Field(
        None, ge=1, le=MAX_SLOTS, description="Which of its proposed times (its number, from 1)"
    )


def describe(session: MeetingSession) -> dict[str, object]:
    return {
        "session": session.id,
        "from": session.requested_by,
        "title": session.title,
        "proposals": [f"{p['index']}. {p['counterpart_local']}" for p in session.proposals],
    }


async def addressed_session(ctx: ToolContext, session_id: int | None, *, lock: bool) -> MeetingSession:
    """The proposal addressed to the caller (`lock`: locked): the one named, else the only one still
    open."""
    query = select(MeetingSession).where(
        MeetingSession.tenant_id == ctx.tenant_id,
        MeetingSession.counterpart_user_id == ctx.caller.user_id,
    )
    if session_id is not None:
        named = query.where(MeetingSession.id == session_id)
        found = await ctx.session.scalar(named.with_for_update() if lock else named)
        if found is None:
            raise ToolFailure("NOT_FOUND", f"no meeting proposal {session_id} addressed to you")
        return found
    open_now = query.where(MeetingSession.status == "open", MeetingSession.expires_at > ctx.now)
    open_now = open_now.order_by(MeetingSession.id)
    rows = list((await ctx.session.scalars(open_now.with_for_update() if lock else open_now)).all())
    if not rows:
        raise ToolFailure("NOT_FOUND", "no open meeting proposal is addressed to you")
    if len(rows) > 1:
        raise needs("session", [describe(row) for row in rows])
    return rows[0]


async def accepting(ctx: ToolContext, args: AcceptMeetingArgs, *, lock: bool) -> Booking:
    """The booking an acceptance resolves to: the proposal's time `selection`, with its requester."""
    session = await addressed_session(ctx, args.session, lock=lock)
    # Both people in one read; `resolve_caller` below then finds the caller in the session's identity
    # map (held by `people` until then) instead of reading them again.
    both = select(User).where(
        User.tenant_id == ctx.tenant_id, User.id.in_([session.requested_by, ctx.caller.user_id])
    )
    people = list((await ctx.session.scalars(both)).all())
    user = next((u for u in people if u.id == session.requested_by), None)
    requester = Person.of_user(user) if user is not None and user.deactivated_at is None else None
    who = requester.name if requester else session.requested_by
    still_open(session, ctx.now, f"ask {who} to propose again")
    if args.selection is None:
        raise NeedsInput(Needs(fields={"selection": True}, candidates=[describe(session)]))
    if requester is None:
        raise ToolFailure("NOT_FOUND", f"the user who proposed session {session.id} is no longer active here")
    start = proposed_start(session, args.selection)
    caller = await resolve_caller(ctx)
    return await booking(ctx, requester, caller, start, session.duration_minutes, session, lock=lock)


async def plan_accept_meeting(ctx: ToolContext, args: AcceptMeetingArgs) -> BookingPlan:
    return await booking_plan(ctx, args, await accepting(ctx, args, lock=ctx.lock_reads))


@tool(
    risk="medium",
    category="external",
    scopes=("calendar:availability", "calendar:book"),
    plan=plan_accept_meeting,
)
async def accept_meeting(ctx: ToolContext, plan: BookingPlan) -> BookedMeeting:
    """Accept a meeting someone proposed to the user: book proposed time `selection` of `session`
    (list_notifications shows the proposals addressed to the user; without a selection, or with
    several open and no session, this answers `needs` listing them). Both calendars are checked
    again (CONFLICT if taken meanwhile), both people get an invite by email, the proposal's
    notification is resolved and the requester is notified. Accept only the time the user chose."""
    return await book(ctx, plan.booking)


compensates(accept_meeting)(cancel_booking)
