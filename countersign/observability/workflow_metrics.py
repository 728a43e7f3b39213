"""Metrics only the workflow can see, recorded through `workflow.metric_meter()`.

That meter is replay-safe: the SDK drops what a replaying workflow records, so a turn counted once
is never counted again when a worker rebuilds the conversation from its history. It belongs to the
Temporal runtime, whose Prometheus exporter the worker's `/metrics` merges (see `metrics`); names are
therefore spelled without the `_total` suffix the exporter adds to counters.

Imported by the workflow (through the sandbox's pass-through): no I/O here.
"""

from __future__ import annotations

from typing import Protocol

from temporalio import workflow

TURNS = "countersign_turns"
APPROVAL_WAIT = "countersign_approval_wait_seconds"
# Approvals wait for people: seconds to a day (the default approval timeout).
APPROVAL_WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
HISTORY_BYTES = "countersign_history_bytes"
# A run continues as new at 4 MB (the server's suggestion) or 10 MB (countersign.core.history);
# Temporal terminates one at 50 MB. Past 20 MB something keeps it from continuing: deploy/alerts.yml.
HISTORY_BYTES_BUCKETS = (1_000_000.0, 4_000_000.0, 10_000_000.0, 20_000_000.0, 40_000_000.0, 50_000_000.0)


class HistoryInfo(Protocol):
    def get_current_history_size(self) -> int: ...


def record_turn(agent: str, stop: str) -> None:
    """One finished turn of `agent`, by how it stopped (completed, limit_reached, error)."""
    workflow.metric_meter().create_counter(TURNS, "Turns finished, by agent and stop reason").add(
        1, {"agent": agent, "stop": stop}
    )


def record_approval_wait(risk: str, decision: str, seconds: float) -> None:
    """How long a tool call waited for its approval, by risk and decision (approved, rejected,
    expired)."""
    workflow.metric_meter().create_histogram_float(
        APPROVAL_WAIT, "Time tool calls waited for an approval decision", "s"
    ).record(max(seconds, 0.0), {"risk": risk, "decision": decision})


def record_history(info: HistoryInfo) -> None:
    """The run's history size when a signal arrives: a flood that grows a history past the point
    where the run should have continued as new (its workflow tasks force-closed by the server while
    signals keep coming, FORCE_CLOSE_COMMAND) shows here before Temporal's 50 MB limit ends it."""
    workflow.metric_meter().create_histogram(
        HISTORY_BYTES, "History size of conversation runs when a signal arrives, in bytes"
    ).record(info.get_current_history_size())
