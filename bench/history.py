"""What a workflow history says about timing: activity runs and the gaps between them (pure).

Times are the server's event timestamps, in seconds since the epoch. An activity's own time is
ActivityTaskCompleted minus ActivityTaskStarted; everything else between two model calls is what
orchestration (matching, workflow tasks, persistence, the worker's polling) adds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
STARTED = EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
CLOSED = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}


def event_seconds(event: HistoryEvent) -> float:
    return int(event.event_time.ToNanoseconds()) / 1e9


@dataclass
class ActivityRun:
    """One activity as the history tells it (the last attempt's start, when it was retried)."""

    name: str
    scheduled_event_id: int
    scheduled: float
    started: float | None = None
    closed: float | None = None
    closed_event_id: int | None = None

    @property
    def own_s(self) -> float:
        """Time spent in the activity itself (0 when it never started or never closed)."""
        if self.started is None or self.closed is None:
            return 0.0
        return self.closed - self.started


def activity_runs(events: Sequence[HistoryEvent]) -> list[ActivityRun]:
    """Every activity of the history, in scheduling order."""
    runs: dict[int, ActivityRun] = {}
    for event in events:
        if event.event_type == SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            runs[event.event_id] = ActivityRun(name, event.event_id, event_seconds(event))
        elif event.event_type == STARTED:
            runs[event.activity_task_started_event_attributes.scheduled_event_id].started = event_seconds(
                event
            )
        elif event.event_type in CLOSED:
            run = runs[getattr(event, CLOSED[event.event_type]).scheduled_event_id]
            run.closed, run.closed_event_id = event_seconds(event), event.event_id
    return list(runs.values())


def named(runs: Sequence[ActivityRun], name: str) -> list[ActivityRun]:
    return [run for run in runs if run.name == name]


@dataclass(frozen=True)
class Step:
    """One agent step: a model call and the tool calls it asked for, up to the next model call."""

    interval_s: float  # call_model scheduled -> next call_model scheduled
    own_s: float  # the model call's and the tool calls' own execution time
    events: int  # history events from this model call's scheduling to the next one's

    @property
    def overhead_s(self) -> float:
        return self.interval_s - self.own_s


@dataclass(frozen=True)
class StepsBetween:
    """The activities scheduled between two consecutive model calls."""

    model: ActivityRun
    next_model: ActivityRun
    others: list[ActivityRun] = field(default_factory=list)

    def step(self) -> Step:
        tools = named(self.others, "execute_tool")
        return Step(
            interval_s=self.next_model.scheduled - self.model.scheduled,
            own_s=self.model.own_s + sum(t.own_s for t in tools),
            events=self.next_model.scheduled_event_id - self.model.scheduled_event_id,
        )


def steps(runs: Sequence[ActivityRun]) -> list[StepsBetween]:
    """Each model call that was followed by another, with what ran in between."""
    models = named(runs, "call_model")
    return [
        StepsBetween(
            model=a,
            next_model=b,
            others=[r for r in runs if a.scheduled_event_id < r.scheduled_event_id < b.scheduled_event_id],
        )
        for a, b in itertools.pairwise(models)
    ]


def first_started(runs: Sequence[ActivityRun], name: str) -> float | None:
    """When the first activity named `name` started (None when none did)."""
    return next((run.started for run in runs if run.name == name and run.started is not None), None)
