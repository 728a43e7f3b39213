"""The emails the scheduling tools queue: the proposal to the counterpart and the invite to both."""

from __future__ import annotations

from collections.abc import Sequence

from tools.email import EmailContent
from tools.resolve import Person
from tools.scheduling.models import Slot


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


def invite_email(title: str, when: str, attendees: Sequence[Person], booker: Person) -> EmailContent:
    """The invite each attendee gets, `when` written in their own zone."""
    return EmailContent(
        subject=f"Invitation: {title}"[:200],
        body=f"{title}\n{when}\nAttendees: {', '.join(p.name for p in attendees)}\n"
        f"Booked by {booker.name} through Countersign.",
    )
