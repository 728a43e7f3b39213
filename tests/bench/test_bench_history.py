"""The benchmark's reading of a history (bench/history.py), on a history recorded from a real run.

The history is one recorded before 1.0 (tools and bookkeeping as local activities, before the
message store): it reads the same as any, and its short list of activities keeps the checks plain.
The replay fixtures of the current code are in tests/workflows/histories/.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowHistory

from bench.history import ActivityRun, activity_runs, step_parts, steps

RECORDED = Path(__file__).parents[1] / "fixtures" / "histories" / "lead_lookup_before_1.0.json"


def history() -> WorkflowHistory:
    return WorkflowHistory.from_json(RECORDED.stem, RECORDED.read_text())


def test_local_activities_are_read_from_their_markers() -> None:
    runs = activity_runs(history().events)
    assert [(r.name, r.local) for r in runs] == [
        ("load_conversation_context", False),
        ("call_model", False),
        ("execute_tool", True),
        ("call_model", False),
        ("execute_tool", True),
        ("call_model", False),
    ]
    assert all(r.activity_id for r in runs)
    assert all(r.own_s == 0 for r in runs if r.local), "a marker alone says nothing of its duration"


def test_each_step_holds_its_tool_call_and_adds_up() -> None:
    events = history().events
    found = steps(activity_runs(events))
    assert len(found) == 2
    for between in found:
        assert [r.name for r in between.others] == ["execute_tool"]

        def own_s(run: ActivityRun) -> float:
            return 0.001  # what bench.clock would have measured in the worker

        step = between.step(own_s)
        parts = step_parts(events, between, own_s)
        assert step.interval_s > 0 and step.own_s == 0.002
        assert parts.model_report_s >= 0 and parts.task_dispatch_s > 0 and parts.task_processing_s > 0
        accounted = parts.model_dispatch_s + parts.model_report_s + parts.task_dispatch_s
        assert accounted + parts.task_processing_s <= step.overhead_s + 0.001
