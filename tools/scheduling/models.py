"""What the scheduling tools take and answer: their arguments, checked before anything runs (a
missing person or length asks the user: `needs`), and the shapes of their results.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tools.operations import EventView
from tools.registry import Needs, NeedsInput, ToolArgs
from tools.resolve import RowView, UtcDatetime
from tools.scheduling.slots import MAX_SLOTS
from tools.scheduling.zones import IanaZone

WITH_HELP = "The counterpart: a contact's name or email, or a user's id, name or email"


MIN_MINUTES, MAX_MINUTES = 5, 240


DURATION_HELP = f"Length of the meeting in minutes, {MIN_MINUTES}-{MAX_MINUTES}"


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


def ask_for_missing(values: dict[str, object]) -> None:
    """Stop with `needs` naming every argument the user has yet to give."""
    missing = {name: True for name, value in values.items() if value is None}
    if missing:
        raise NeedsInput(Needs(fields=missing))


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
