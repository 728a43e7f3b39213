"""Business hours and the free-slot search: plain calendar arithmetic on UTC datetimes, no
database (tests/tools/test_scheduling_slots.py holds it to the step-by-step definition).
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, time, timedelta

DAY_START, DAY_END = time(9), time(17)  # local business hours, in each person's zone


SLOT_STEP = timedelta(minutes=30)


DEFAULT_DAYS = 5


MAX_SLOTS = 5


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
