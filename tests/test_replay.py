"""Determinism: histories recorded from real runs must replay with the current workflow code.

A change that alters the commands AgentWorkflow issues for an existing history breaks running
conversations; these tests catch that before a deploy does. To add a recorded history:
    temporal workflow show --workflow-id WF --output json > tests/histories/NAME.json
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.fixtures.agent import AgentHarness
from tests.test_agent_workflow import FIND_JANE
from workflows.agent import AgentWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def replayer() -> Replayer:
    return Replayer(workflows=[AgentWorkflow], data_converter=pydantic_data_converter)


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
