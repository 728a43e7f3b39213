"""Each activity's own time, measured in the worker: from the call into the activity function to its
return, per workflow id and activity id (attempts added up).

The history cannot say it for a local activity (its marker has one timestamp), and for a regular
activity Started..Completed also holds the task's delivery and the completion's report: measuring
the function itself leaves every bit of orchestration in the overhead.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor


class ActivityClock(Interceptor):
    def __init__(self) -> None:
        self.own_s: defaultdict[tuple[str, str], float] = defaultdict(float)
        # when each activity's function was first entered (seconds since the epoch, this machine's
        # clock, as the server's event timestamps): what dispatching it took, next to the history
        self.entered: dict[tuple[str, str], float] = {}

    def of(self, workflow_id: str, activity_id: str) -> float:
        return self.own_s.get((workflow_id, activity_id), 0.0)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Timed(next, self)


class _Timed(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, clock: ActivityClock) -> None:
        super().__init__(next)
        self._clock = clock

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        self._clock.entered.setdefault((info.workflow_id or "", info.activity_id), time.time())
        started = time.perf_counter()
        try:
            return await super().execute_activity(input)
        finally:
            key = (info.workflow_id or "", info.activity_id)
            self._clock.own_s[key] += time.perf_counter() - started
