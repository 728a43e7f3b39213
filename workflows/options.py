"""How the conversation calls its activities: timeouts, retry policies, and the calls themselves.

Activities are called through their references (countersign/core/activity_refs.py: name, input and
result type), so no module of `workflows/` imports I/O, and mypy checks every argument and result.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import ActivityRef

In = TypeVar("In")
Out = TypeVar("Out")

# Activities whose I/O is PostgreSQL retry without an attempt cap for up to DB_OUTAGE_TOLERANCE: a
# database restart or failover delays a call, it does not fail it.
DB_OUTAGE_TOLERANCE = timedelta(minutes=5)
# The maximum interval stays under the SDK's local_retry_threshold (1 min): past it, a local
# activity's retry waits on a server timer under a new activity id unless it was given one (`Input`),
# and record_decision keys its audit row on the activity id (one row per decision attempt, however
# often it is retried).
DB_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_interval=timedelta(seconds=10))
CONTEXT_RETRY = RetryPolicy(
    initial_interval=DB_RETRY.initial_interval,
    maximum_interval=DB_RETRY.maximum_interval,
    non_retryable_error_types=["UnknownConversationParty"],
)
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=6
)
MODEL_CALL_TIMEOUT = timedelta(seconds=120)
TOOL_CALL_TIMEOUT = timedelta(seconds=60)
# Long-running activities heartbeat every 2 s (activities/heartbeat.py): a worker that dies mid-call
# is noticed after this, not after the call's start-to-close timeout.
HEARTBEAT_TIMEOUT = timedelta(seconds=10)
DELIVERY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2), maximum_interval=timedelta(minutes=5), maximum_attempts=20
)
BOOKKEEPING_TIMEOUT = timedelta(seconds=30)
NOTICE_TIMEOUT = timedelta(seconds=60)


@dataclass
class Input:
    """The client input (a signal, an update) or the run's own flow that workflow code acts for,
    and how many local activities it has started: their ids are `<input>:<n>`.

    A local activity's audit row is keyed by its activity id (countersign/db/attempts.py). The SDK's
    default id is the activity's position in the run's command sequence, which a failed workflow
    task does not keep: the task's markers are lost, and its retry runs the local activities again
    at other positions (without an update the server gave up in between, or with signals that
    arrived since). A refusal was then recorded twice, and a real decision could take the position,
    and so the row, of a forged one. An id named after the input is the same in every retry."""

    name: str
    started: int = 0

    def next_activity_id(self) -> str:
        self.started += 1
        return f"{self.name}:{self.started}"


_ACTING_FOR: ContextVar[Input | None] = ContextVar("countersign_acting_for", default=None)


def acting_for(name: str) -> None:
    """Name the input the current handler (or the run) acts for: the local activities it and the
    tasks it starts run from now on are keyed by it. Updates are named by their own id without
    this (`workflow.current_update_info`); a signal has no id, so its handler names it by its
    place among the run's signals, which history fixes."""
    _ACTING_FOR.set(Input(name))


# Histories recorded before activity ids named their input replay with the SDK's ids.
INPUT_ACTIVITY_IDS = "input-activity-ids"


def _input() -> Input | None:
    if not workflow.patched(INPUT_ACTIVITY_IDS):
        return None
    acting = _ACTING_FOR.get()
    update = workflow.current_update_info()
    if acting is None and update is not None:
        acting = Input(f"update:{update.id}")
        _ACTING_FOR.set(acting)
    return acting


async def execute(ref: ActivityRef[In, Out], arg: In, **options: Any) -> Out:
    """Run `ref` as a regular activity (through a task queue) with `options`; its result as `ref` types it."""
    result: Out = await workflow.execute_activity(ref.name, arg, result_type=ref.result, **options)
    return result


async def execute_local(ref: ActivityRef[In, Out], arg: In, **options: Any) -> Out:
    """Run `ref` as a local activity (in the workflow task, recorded as a marker) with `options`."""
    result: Out = await workflow.execute_local_activity(ref.name, arg, result_type=ref.result, **options)
    return result


async def bookkeeping(ref: ActivityRef[In, Out], arg: In, summary: str, *, local: bool = True) -> Out:
    """Short bookkeeping: argument checks (no I/O), audit rows, decision checks, reminders.

    The hot ones are local activities: run in the workflow task, recorded as markers, no round trip
    through a task queue. `local=False` for those that may wait on people or outside services.
    """
    options: dict[str, Any] = {
        "summary": summary,
        "start_to_close_timeout": BOOKKEEPING_TIMEOUT,
        "schedule_to_close_timeout": DB_OUTAGE_TOLERANCE,
        "retry_policy": DB_RETRY,
    }
    if local:
        acting = _input()
        if acting is not None:
            options["activity_id"] = acting.next_activity_id()
        return await execute_local(ref, arg, **options)
    return await execute(ref, arg, **options)
