"""What a workflow history says about timing: activity runs and the gaps between them (pure).

Times are the server's event timestamps, in seconds since the epoch. A local activity appears as its
marker (recorded with the workflow task that ran it). An activity's own time comes from the worker
(`bench.clock`) when it was measured there, else from the history (Completed minus Started; 0 for
a local activity); everything else between two model calls is what orchestration (matching,
workflow tasks, persistence, the worker's polling) adds.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from countersign.core.activity_refs import CALL_MODEL, EXECUTE_TOOL

SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
STARTED = EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
MARKER = EventType.EVENT_TYPE_MARKER_RECORDED
TASK_SCHEDULED = EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
TASK_STARTED = EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
TASK_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
LOCAL_ACTIVITY_MARKER = "core_local_activity"
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
    activity_id: str
    scheduled_event_id: int  # a local activity: its marker's
    scheduled: float
    started: float | None = None
    closed: float | None = None
    closed_event_id: int | None = None
    local: bool = False

    @property
    def own_s(self) -> float:
        """Started..Completed (0 when it never started or never closed, and for a local activity)."""
        if self.started is None or self.closed is None:
            return 0.0
        return self.closed - self.started


OwnTime = Callable[[ActivityRun], float]


def history_own_s(run: ActivityRun) -> float:
    return run.own_s


def local_activity(event: HistoryEvent) -> ActivityRun | None:
    """The local activity a marker records, if it is one."""
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != LOCAL_ACTIVITY_MARKER:
        return None
    data = json.loads(marker.details["data"].payloads[0].data)
    at = event_seconds(event)
    return ActivityRun(
        data["activity_type"], str(data["activity_id"]), event.event_id, at, closed=at, local=True
    )


def activity_runs(events: Sequence[HistoryEvent]) -> list[ActivityRun]:
    """Every activity of the history, in scheduling order."""
    runs: dict[int, ActivityRun] = {}
    for event in events:
        if event.event_type == SCHEDULED:
            scheduled = event.activity_task_scheduled_event_attributes
            runs[event.event_id] = ActivityRun(
                scheduled.activity_type.name, scheduled.activity_id, event.event_id, event_seconds(event)
            )
        elif event.event_type == MARKER and (local := local_activity(event)) is not None:
            runs[event.event_id] = local
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


# Countersign's model call and tool call, by their references (renamed with them); the bare loops
# register theirs under the same names
MODEL_ACTIVITY, TOOL_ACTIVITY = CALL_MODEL.name, EXECUTE_TOOL.name


@dataclass(frozen=True)
class StepsBetween:
    """The activities scheduled between two consecutive model calls."""

    model: ActivityRun
    next_model: ActivityRun
    others: list[ActivityRun] = field(default_factory=list)

    def step(self, own_s: OwnTime = history_own_s, tool: str = TOOL_ACTIVITY) -> Step:
        """The step; its own time is the model call's and the activities named `tool`."""
        tools = named(self.others, tool)
        return Step(
            interval_s=self.next_model.scheduled - self.model.scheduled,
            own_s=own_s(self.model) + sum(own_s(t) for t in tools),
            events=self.next_model.scheduled_event_id - self.model.scheduled_event_id,
        )


def steps(runs: Sequence[ActivityRun], model: str = MODEL_ACTIVITY) -> list[StepsBetween]:
    """Each model call (an activity named `model`) that was followed by another, with what ran in
    between."""
    models = named(runs, model)
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


@dataclass(frozen=True)
class StepParts:
    """Where one step's orchestration time goes, by the history's timestamps (seconds)."""

    model_dispatch_s: float  # call_model scheduled -> started (0 when eagerly dispatched)
    model_report_s: float  # call_model started -> completed, minus its own time: delivery and report
    task_dispatch_s: float  # workflow tasks scheduled -> started: matching, polling
    task_processing_s: float  # workflow tasks started -> completed, minus local activities' own time


def step_parts(events: Sequence[HistoryEvent], between: StepsBetween, own_s: OwnTime) -> StepParts:
    """The parts of the step `between` (event ids are 1-based positions in `events`)."""
    window = events[between.model.scheduled_event_id - 1 : between.next_model.scheduled_event_id]
    at = {event.event_id: event_seconds(event) for event in window}
    dispatch = processing = 0.0
    for event in window:
        if event.event_type == TASK_STARTED:
            scheduled = event.workflow_task_started_event_attributes.scheduled_event_id
            dispatch += at[event.event_id] - at[scheduled]
        elif event.event_type == TASK_COMPLETED:
            started_id = event.workflow_task_completed_event_attributes.started_event_id
            processing += at[event.event_id] - at[started_id]
    model = between.model
    started = model.started if model.started is not None else model.scheduled
    closed = model.closed if model.closed is not None else started
    return StepParts(
        model_dispatch_s=started - model.scheduled,
        model_report_s=closed - started - own_s(model),
        task_dispatch_s=dispatch,
        task_processing_s=processing - sum(own_s(r) for r in between.others if r.local),
    )
