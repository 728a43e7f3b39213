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

One module per concern, each importing only those above it: `zones` (IANA names, a span in a zone),
`slots` (business hours and the free-slot search, no database), `models` (what the tools take and
answer), `emails`, `storage` (the SQL: calendars, their locks, sessions), then the tools:
`proposals` (schedule_meeting) and `bookings` (confirm_meeting, and the booking accept_meeting
shares). Importing the package registers both tools.
"""

import importlib

for _module in ("proposals", "bookings"):  # the catalog's order: schedule_meeting, then confirm_meeting
    importlib.import_module(f"{__name__}.{_module}")
