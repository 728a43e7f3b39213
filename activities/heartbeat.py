"""Heartbeats while an activity works, so a worker that dies mid-call is noticed within the
workflow's heartbeat timeout (seconds) instead of the activity's start-to-close timeout (a model
call may take two minutes; a retry should not wait that long after a crash).

    @activity.defn(name=CALL_MODEL.name)
    @heartbeats
    async def call_model(self, request: ModelRequest) -> ModelReply: ...

The heartbeat is a timer on the event loop, not a task beside the work: most calls finish in
milliseconds, before the first beat is due, and then cost one timer scheduled and cancelled instead
of a second task, its wake-ups and an `asyncio.wait` per call (issue 36's profile).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from temporalio import activity

P = ParamSpec("P")
T = TypeVar("T")

HEARTBEAT_EVERY_S = 2.0  # the workflow's heartbeat_timeout is several times this


async def heartbeating(work: Awaitable[T], every_s: float = HEARTBEAT_EVERY_S) -> T:
    """Await `work`, heartbeating every `every_s` while it runs. Outside an activity (a test, the
    benchmark's in-process loop) and in a local activity (whose liveness is the workflow task it
    runs in) it only awaits. The work runs in the activity's own task, so cancelling the activity
    cancels the work; the timer's callbacks run in the activity's context (`call_later` copies it)."""
    if not activity.in_activity() or activity.info().is_local:
        return await work
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def beat() -> None:
        nonlocal timer
        activity.heartbeat()
        timer = loop.call_later(every_s, beat)

    timer = loop.call_later(every_s, beat)
    try:
        return await work
    finally:
        timer.cancel()  # the latest beat's timer (`beat` replaces it)


def heartbeats(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """An activity method that heartbeats while it runs (put it under `@activity.defn`)."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return await heartbeating(fn(*args, **kwargs))

    return run
