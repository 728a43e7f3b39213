"""How the conversation calls its activities: timeouts, retry policies, and the calls themselves.

Activities are called through their references (countersign/core/activity_refs.py: name, input and
result type), so no module of `workflows/` imports I/O, and mypy checks every argument and result.
"""

from __future__ import annotations

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
# activity's retry waits on a server timer under a new activity id, and record_decision keys its
# audit row on the activity id (one row per decision attempt, however often it is retried).
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
    return await (execute_local if local else execute)(ref, arg, **options)
