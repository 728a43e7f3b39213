"""bench.load --users/--find (issue 52): how sent turns are counted, what holds, and the search for
the largest N (pure parts; the load itself is a benchmark run, not a test)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from bench import people
from bench.load import Turn


def result(reply_p95: float | None, tool_p95: float | None, lost: int = 0) -> dict[str, Any]:
    return {
        "reply_ms": {"p95": reply_p95},
        "tool_ms": {"p95": tool_p95},
        "turns": {"completed": 10, "refused": 0, "lost": lost},
    }


def test_every_sent_turn_is_completed_refused_with_its_reason_or_lost() -> None:
    stops = ["completed", "completed", "limit_reached", "error", "timeout", "failed: RPCError"]
    assert people.outcomes(Turn(1.0, s) for s in stops) == {"completed": 2, "refused": 2, "lost": 2}


def test_holds_needs_both_p95s_under_their_bounds_and_nothing_lost() -> None:
    assert people.holds(result(2999, 499))
    assert not people.holds(result(3000, 100))
    assert not people.holds(result(100, 500))
    assert not people.holds(result(100, 100, lost=1))
    assert not people.holds(result(None, None))  # no reply at all


async def test_find_doubles_then_halves_the_gap_to_the_largest_n_that_holds() -> None:
    probed: list[int] = []

    async def probe(n: int) -> dict[str, Any]:  # holds up to 520 users
        probed.append(n)
        return {"holds": n <= 520, "people": {"users": n}}

    found = await people.find(probe, start=100)
    assert probed == [100, 200, 400, 800, 600, 500]
    assert (found["largest"], found["first_missed"]) == (500, 600)
    assert [r["people"]["users"] for r in found["runs"]] == sorted(probed)


async def test_find_reports_zero_when_even_the_start_misses() -> None:
    async def probe(n: int) -> dict[str, Any]:
        return {"holds": False, "people": {"users": n}}

    found = await people.find(probe, start=100)
    assert (found["largest"], found["first_missed"]) == (0, 25)


async def test_a_user_whose_time_is_up_before_writing_again_stops_at_once() -> None:
    # a think time of minutes would otherwise keep the run waiting long after its duration
    async with asyncio.timeout(1):
        turns = await people.person(None, "w", 600.0, time.perf_counter() + 0.05, random.Random(1))  # type: ignore[arg-type]
    assert turns == []
