"""How the conversation calls its activities: timeouts, retry policies, and the bookkeeping call.

Activities are referenced by name, so no module of `workflows/` imports I/O.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

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


async def bookkeeping(
    activity: str, arg: object, summary: str, result_type: type | None = None, *, local: bool = True
) -> Any:
    """Short bookkeeping: argument checks (no I/O), audit rows, decision checks, reminders.

    The hot ones are local activities: run in the workflow task, recorded as markers, no round trip
    through a task queue. `local=False` for those that may wait on people or outside services.
    """
    options: dict[str, Any] = {
        "result_type": result_type,
        "summary": summary,
        "start_to_close_timeout": BOOKKEEPING_TIMEOUT,
        "schedule_to_close_timeout": DB_OUTAGE_TOLERANCE,
        "retry_policy": DB_RETRY,
    }
    if local:
        return await workflow.execute_local_activity(activity, arg, **options)
    return await workflow.execute_activity(activity, arg, **options)
