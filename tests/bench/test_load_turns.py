"""bench.load's turn (issues 25, 52): a turn past its deadline is counted as timed out (lost), and an
interrupted run is not held up by turns still waiting.

The temporalio client turns a cancelled `execute_update` into WorkflowUpdateRPCTimeoutOrCancelledError,
the error it also raises when the server's long poll ends; a turn that took that error for the long
poll asked again forever. Against the real dev server, on a task queue no worker polls, so the reply
never comes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowHandle

from bench import load, people, workloads
from countersign.client.temporal_client import connect
from countersign.devstack.temporal import DevServerConfig
from countersign.runtime.config import Settings
from workflows.agent import AgentWorkflow

pytestmark = pytest.mark.devserver
SETTLES_S = 20.0  # far more than a turn needs to end once its deadline passed or it was cancelled


@pytest_asyncio.fixture
async def unanswered(dev_server: DevServerConfig) -> AsyncIterator[tuple[Client, WorkflowHandle[Any, Any]]]:
    """A conversation nobody works on (its task queue has no worker), terminated afterwards."""
    client = await connect(Settings(temporal_address=dev_server.address, namespace=dev_server.namespace))
    handle = await client.start_workflow(
        AgentWorkflow.run,
        workloads.conversation(load.LOAD_MESSAGE),
        id=f"bench-load-test-{uuid.uuid4().hex[:8]}",
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
    )
    yield client, handle
    await handle.terminate("test finished")  # also ends a turn still asking, so the test never hangs


async def settled(turn: asyncio.Task[load.Turn]) -> bool:
    """Whether the turn ended within SETTLES_S (waited for without cancelling it)."""
    done, _ = await asyncio.wait({turn}, timeout=SETTLES_S)
    return bool(done)


async def test_a_turn_past_its_deadline_is_counted_as_timed_out(
    unanswered: tuple[Client, WorkflowHandle[Any, Any]],
) -> None:
    client, handle = unanswered
    turn = asyncio.create_task(load.one_turn(client, handle.id, timeout_s=1.0))
    assert await settled(turn), "the turn went on asking past its deadline"
    found = turn.result()
    assert found.stop == "timeout"
    assert 1.0 <= found.latency_s < SETTLES_S


async def test_an_interrupted_run_ends_its_waiting_turns(
    unanswered: tuple[Client, WorkflowHandle[Any, Any]],
) -> None:
    # Ctrl-C cancels the run's task and, through it, every turn: none may take that for a long poll
    client, handle = unanswered
    turn = asyncio.create_task(load.one_turn(client, handle.id, timeout_s=load.TURN_TIMEOUT_S))
    await asyncio.sleep(1.0)  # signalled and asking for the reply (nothing the server shows to wait for)
    turn.cancel()
    assert await settled(turn), "the cancelled turn went on asking"
    assert turn.cancelled()


@pytest.mark.timeout(60)  # before the fix the arrivals spun without yielding: only this timeout ended it
async def test_a_turn_arriving_while_every_conversation_is_in_one_is_lost_not_waited_for(
    unanswered: tuple[Client, WorkflowHandle[Any, Any]],
) -> None:
    client, handle = unanswered
    turns = await load.steady_turns(client, [handle.id], rate_per_s=4.0, duration_s=1.0, timeout_s=2.0)
    assert [t.stop for t in turns] == ["timeout", *[load.NO_IDLE_CONVERSATION] * 3]
    assert people.outcomes(turns) == {"completed": 0, "refused": 0, "lost": 4}
