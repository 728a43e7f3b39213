"""Determinism: histories recorded from real runs must replay with the current workflow code.

A change that alters the commands AgentWorkflow issues for an existing history breaks running
conversations; these tests catch that before a deploy does (docs/how-to/deploy-a-new-build.md).
The histories are recorded by tests/workflows/record_histories.py; one more from a running stack:
    temporal workflow show --workflow-id WF --output json > tests/workflows/histories/NAME.json
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from countersign.runtime.payloads import data_converter
from tests.fixtures.agent import AgentHarness
from tests.workflows.test_agent_workflow import FIND_JANE
from workflows.agent import AgentWorkflow
from workflows.options import INPUT_ACTIVITY_IDS

HISTORIES_DIR = Path(__file__).parent / "histories"
HISTORIES = sorted(HISTORIES_DIR.glob("*.json"))


def replayer() -> Replayer:
    """With the worker's converter: a signal that decodes only as `Unreadable` must replay too."""
    return Replayer(workflows=[AgentWorkflow], data_converter=data_converter)


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, await asyncio.to_thread(path.read_text))
    await replayer().replay_workflow(history)


def test_there_is_a_recorded_history() -> None:
    assert HISTORIES, "tests/workflows/histories/ must hold at least one history recorded from a real run"


async def test_a_fresh_run_replays(agent: AgentHarness) -> None:
    agent.script(*FIND_JANE)
    handle = await agent.start("Find Jane Doe", single_turn=True)
    await handle.result()
    await replayer().replay_workflow(await handle.fetch_history())


def events(stem: str) -> list[Any]:
    path = HISTORIES_DIR / f"{stem}.json"
    return list(WorkflowHistory.from_json(stem, path.read_text()).events)


def local_activities(stem: str) -> set[str]:
    """The activity types of a history's local activities (recorded as markers)."""
    return {
        json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)["activity_type"]
        for e in events(stem)
        if e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    }


def activities(stem: str) -> set[str]:
    return {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events(stem)
        if e.HasField("activity_task_scheduled_event_attributes")
    }


def handlers(stem: str) -> set[str]:
    """The signals and updates a history received."""
    return {e.workflow_execution_signaled_event_attributes.signal_name for e in events(stem)} | {
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        for e in events(stem)
    } - {""}


def patches(stem: str) -> set[str]:
    """The `workflow.patched` ids a history's run took the new branch of (its patch markers)."""
    return {
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for e in events(stem)
        if e.marker_recorded_event_attributes.marker_name == "core_patch"
    }


# The histories recorded after a patch, and the patches they take: every other history was
# recorded before any patch, so it proves the old branches still replay.
RECORDED_AFTER = {"served_call_approved": {INPUT_ACTIVITY_IDS}}


def test_histories_take_only_the_patches_they_were_recorded_after() -> None:
    """A history recorded before a patch must replay through the old branch (no patch marker), or
    nothing proves that branch still works for the runs it was kept for; one recorded after takes
    exactly the patches it is listed with."""
    for path in HISTORIES:
        assert patches(path.stem) == RECORDED_AFTER.get(path.stem, set()), path.stem
    assert any(path.stem not in RECORDED_AFTER for path in HISTORIES), "no history takes the old branch"


def test_the_recorded_histories_cover_the_loop_and_every_handler() -> None:
    """Between them the fixtures run each part of the workflow: local and regular tool calls, an
    MCP call, approvals decided, rejected and expired, a question, a rollback, the message store,
    sealed continue-as-new and its verification, refused signals, a client's own call approved
    (`serve_call`), and every signal and update."""
    assert {"execute_tool", "append_messages"} <= local_activities("lead_lookup_local_reads")
    assert "execute_mcp_tool" in activities("mcp_time_read")
    assert {"check_arguments", "record_decision"} <= local_activities("approved_status_change")
    assert "notify_approval" in activities("approved_status_change")
    assert "record_unexecuted_call" in local_activities("rejected_and_expired_approvals")
    assert "check_action_proof" in local_activities("question_answered")
    assert {"authorize_rollback", "compensate_call"} <= activities("rollback_of_a_turn")
    assert "seal_carried" in local_activities("refused_signals_sealed_carry")
    assert "authorize_action" in local_activities("refused_signals_sealed_carry")
    assert "verify_carried" in local_activities("verified_carry_admin_end")
    assert {"record_unexecuted_call", "seal_carried"} <= local_activities(
        "tool_results_stored_refusal_carried"
    )
    assert "load_turn_reply" in local_activities("tool_results_stored_earlier_reply")
    received = set().union(*(handlers(p.stem) for p in HISTORIES))
    assert {"check_arguments", "record_decision"} <= local_activities("served_call_approved")
    contract = {"submit_message", "approve", "reject", "answer", "rollback", "end", "decide", "serve_call"}
    assert contract | {"wait_turn", "wait_reply"} <= received
