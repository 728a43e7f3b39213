"""activities/heartbeat.py: long activities heartbeat while they work, so a dead worker is noticed."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.heartbeat import heartbeating, heartbeats


@heartbeats
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"


async def test_a_slow_activity_heartbeats_until_it_returns() -> None:
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    assert await env.run(heartbeating, asyncio.sleep(0.35, "done"), 0.05) == "done"
    assert len(beats) >= 4


async def test_a_local_activity_and_plain_code_do_not_heartbeat() -> None:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, is_local=True)
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    assert await env.run(heartbeating, asyncio.sleep(0.2, "x"), 0.05) == "x"
    assert await slow(0.01) == "done"  # outside any activity
    assert beats == []


async def test_cancelling_the_activity_stops_the_work() -> None:
    env = ActivityEnvironment()
    stopped = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            stopped.set()

    running = asyncio.ensure_future(env.run(heartbeating, work(), 0.05))
    await asyncio.sleep(0.1)
    env.cancel()
    await asyncio.wait_for(stopped.wait(), 1)
    assert running.cancelled() or isinstance(running.exception(), asyncio.CancelledError)


async def test_the_work_runs_in_the_activity_task_without_a_second_task() -> None:
    """A call that ends in milliseconds costs a timer, not a task beside it (issue 36)."""
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    async def tasks_seen() -> tuple[asyncio.Task[Any] | None, asyncio.Task[Any] | None]:
        async def work() -> asyncio.Task[Any] | None:
            return asyncio.current_task()

        return asyncio.current_task(), await heartbeating(work(), 0.05)

    outer, inner = await env.run(tasks_seen)
    assert inner is outer
    await asyncio.sleep(0.1)  # the cancelled timer never beats after the work is done
    assert beats == []
