"""Determinism: histories recorded from real runs must replay with the current workflow code.

A change that alters the commands AgentWorkflow issues for an existing history breaks running
conversations; these tests catch that before a deploy does. To add a recorded history:
    temporal workflow show --workflow-id WF --output json > tests/histories/NAME.json
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from countersign.runtime.payloads import data_converter
from tests.fixtures.agent import AgentHarness
from tests.test_agent_workflow import FIND_JANE
from workflows.agent import AgentWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def replayer() -> Replayer:
    """With the worker's converter: a signal that decodes only as `Unreadable` must replay too."""
    return Replayer(workflows=[AgentWorkflow], data_converter=data_converter)


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, await asyncio.to_thread(path.read_text))
    await replayer().replay_workflow(history)


def test_there_is_a_recorded_history() -> None:
    assert HISTORIES, "tests/histories/ must hold at least one history recorded from a real run"


async def test_a_fresh_run_replays(agent: AgentHarness) -> None:
    agent.script(*FIND_JANE)
    handle = await agent.start("Find Jane Doe", single_turn=True)
    await handle.result()
    await replayer().replay_workflow(await handle.fetch_history())


def markers(path: Path) -> set[str]:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    return {
        e.marker_recorded_event_attributes.marker_name
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    }


def test_the_recorded_histories_cover_code_before_and_after_local_activities() -> None:
    """Conversations started before tools and bookkeeping became local activities must still replay
    (the `local-bookkeeping` patch, `ToolSpec.local` snapshotted at the start), and newer ones too."""
    found = {path.stem: markers(path) for path in HISTORIES}
    assert "core_local_activity" not in found["demo_lead_qualification"]
    assert "core_local_activity" in found["lead_lookup_local_reads"]
    assert {"core_local_activity", "core_patch"} <= found["approved_status_change_local_bookkeeping"]


def patches(path: Path) -> set[str]:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    return {
        json.loads(a.details["patch-data"].payloads[0].data)["id"]
        for e in history.events
        if (a := e.marker_recorded_event_attributes).marker_name == "core_patch"
    }


def test_the_recorded_histories_cover_code_before_and_after_hostile_input_checks() -> None:
    """Conversations from before client input was checked (HOSTILE_INPUT) must replay, and so must
    those that refused signals, sealed their carried state and verified it in their next run."""
    found = {path.stem: patches(path) for path in HISTORIES}
    assert "hostile-input" not in found["demo_lead_qualification"]
    assert "hostile-input" in found["hostile_input_refusals_sealed_carry"]
    assert "hostile-input" in found["hostile_input_verified_carry_admin_end"]


def test_a_recorded_history_covers_the_message_store() -> None:
    """Conversations since the message store (`message-store` patch) replay too."""
    path = next(p for p in HISTORIES if p.stem == "message_store_two_turns")
    assert "message-store" in patches(path)


def test_recorded_histories_cover_tool_results_in_the_store() -> None:
    """Conversations since tool results left history (`tool-results-stored` patch) replay too: a
    run whose tool activities stored a result and a refusal, and one whose `wait_reply` read an
    earlier run's reply from the store (`load_turn_reply`)."""
    for stem in ("tool_results_stored_refusal_carried", "tool_results_stored_earlier_reply"):
        assert "tool-results-stored" in patches(next(p for p in HISTORIES if p.stem == stem))
    earlier = next(p for p in HISTORIES if p.stem == "tool_results_stored_earlier_reply")
    local = [
        e.marker_recorded_event_attributes.details["data"].payloads[0].data
        for e in WorkflowHistory.from_json(earlier.stem, earlier.read_text()).events
        if e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]
    assert any(b'"activity_type":"load_turn_reply"' in data for data in local)
