"""The slot search of schedule_meeting (tools/scheduling/slots.py `free_starts`), a plain function: it finds
exactly the slots of its definition, which the test spells out step by step (every SLOT_STEP of the
window, checked in each zone and against each busy time, as the tool once searched), over random
windows, lengths, zones (half-hour and 45-minute offsets, both hemispheres' summer time) and busy
times."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tools.scheduling.slots import DAY_END, DAY_START, SLOT_STEP, free_starts, is_business_day, round_up

ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/St_Johns",
    "Asia/Tokyo",
]


def in_business_hours(start: datetime, end: datetime, zone: zoneinfo.ZoneInfo) -> bool:
    local_start, local_end = start.astimezone(zone), end.astimezone(zone)
    return (
        is_business_day(local_start.date())
        and local_start.date() == local_end.date()
        and local_start.time() >= DAY_START
        and local_end.time() <= DAY_END
    )


def step_by_step(
    start: datetime,
    end: datetime,
    length: timedelta,
    zones: list[zoneinfo.ZoneInfo],
    busy: list[tuple[datetime, datetime]],
) -> list[datetime]:
    found, moment = [], round_up(start)
    while moment + length <= end:
        fits = all(in_business_hours(moment, moment + length, zone) for zone in zones)
        if fits and all(not (b_start < moment + length and b_end > moment) for b_start, b_end in busy):
            found.append(moment)
        moment += SLOT_STEP
    return found


moments = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
)
# busy times as (minutes after the window's start, minutes long): before, across and after it
busy_offsets = st.lists(st.tuples(st.integers(-600, 32 * 24 * 60), st.integers(1, 600)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    start=moments,
    days=st.integers(0, 31),
    minutes=st.integers(5, 240),
    zones=st.lists(st.sampled_from(ZONES), min_size=1, max_size=3),
    offsets=busy_offsets,
)
def test_free_starts_are_the_slots_of_their_definition(
    start: datetime, days: int, minutes: int, zones: list[str], offsets: list[tuple[int, int]]
) -> None:
    end = start + timedelta(days=days, hours=12)
    length, tzs = timedelta(minutes=minutes), [zoneinfo.ZoneInfo(z) for z in zones]
    busy = [(start + timedelta(minutes=at), start + timedelta(minutes=at + long)) for at, long in offsets]
    assert list(free_starts(start, end, length, tzs, busy)) == step_by_step(start, end, length, tzs, busy)


def test_a_busy_morning_and_a_weekend_leave_the_afternoons() -> None:
    monday = datetime(2026, 12, 7, tzinfo=UTC)
    busy = [(monday.replace(hour=9), monday.replace(hour=12, minute=10))]
    found = list(
        free_starts(monday, monday + timedelta(days=7), timedelta(hours=4), [zoneinfo.ZoneInfo("UTC")], busy)
    )
    assert found[0] == monday.replace(hour=12, minute=30)  # the first step after the busy morning
    assert [s.weekday() for s in found if s.weekday() >= 5] == []
