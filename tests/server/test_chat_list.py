"""The chat page's conversation list says each conversation's state now (countersign.server.chat
`states_of`), from one visibility query of the real dev server: an open run's agent state, "ended"
for a closed one, "starting" for one visibility does not list yet. The query reads the open runs and
those started a moment ago, never every closed run of a conversation (one per continue-as-new).

No worker runs here: a run nobody polls stays open, a terminated one is closed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from countersign.core.contract import WORKFLOW_TYPE
from countersign.db.schema import Conversation
from countersign.devstack.temporal import DevServerConfig
from countersign.runtime.search_attributes import AGENT_STATUS
from countersign.server import chat

MOMENT = timedelta(seconds=2)  # "a moment ago" for this test (JUST_STARTED), so runs can be older
NOBODY = "nobody-polls"  # a task queue no worker reads


async def visible(client: Client, workflow_id: str, runs: int) -> None:
    """Wait until visibility lists `runs` runs of `workflow_id`."""
    for _ in range(100):
        if len([r async for r in client.list_workflows(f"WorkflowId = '{workflow_id}'")]) == runs:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"visibility never listed {runs} runs of {workflow_id}")


async def closed(client: Client, workflow_id: str, times: int = 1) -> None:
    for _ in range(times):
        handle = await client.start_workflow(WORKFLOW_TYPE, id=workflow_id, task_queue=NOBODY)
        await handle.terminate("closed by the test")


def listed(workflow_id: str, created_at: datetime) -> Conversation:
    return Conversation(workflow_id=workflow_id, created_at=created_at)


@pytest.fixture
async def client(dev_server: DevServerConfig) -> AsyncIterator[Client]:
    yield await Client.connect(dev_server.address, namespace=dev_server.namespace)


async def test_each_listed_conversation_says_its_state_from_a_bounded_visibility_query(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chat, "JUST_STARTED", MOMENT)
    ids = {
        name: f"conv-acme-{name}-{uuid.uuid4().hex[:8]}" for name in ("long", "old", "new", "soon", "gone")
    }
    # a long conversation: three closed runs, then its open one, waiting for a reviewer
    await closed(client, ids["long"], times=3)
    waiting = TypedSearchAttributes([SearchAttributePair(AGENT_STATUS, "awaiting_approval")])
    opened = await client.start_workflow(
        WORKFLOW_TYPE, id=ids["long"], task_queue=NOBODY, search_attributes=waiting
    )
    await closed(client, ids["old"])
    await visible(client, ids["long"], 4)
    await visible(client, ids["old"], 1)
    await asyncio.sleep(MOMENT.total_seconds() + 0.5)  # the runs so far are no longer "a moment ago"
    await closed(client, ids["new"])
    await visible(client, ids["new"], 1)

    queries: list[str] = []
    listing = client.list_workflows

    def recorded(query: str | None = None, **kwargs: Any) -> Any:
        queries.append(str(query))
        return listing(query, **kwargs)

    monkeypatch.setattr(client, "list_workflows", recorded)
    now, long_ago = datetime.now(UTC), datetime.now(UTC) - timedelta(days=1)
    try:
        states = await chat.states_of(
            client,
            [
                listed(ids["long"], long_ago),
                listed(ids["old"], long_ago),
                listed(ids["new"], now),
                listed(ids["soon"], now),  # the server wrote its row; Temporal has not listed it yet
                listed(ids["gone"], long_ago),  # its history is gone
            ],
        )
        # the open run and the one closed a moment ago: none of the long conversation's closed runs
        (query,) = queries
        read = sorted([(r.id, r.status.name if r.status else "") async for r in listing(query)])
    finally:
        await opened.terminate("done")
    assert read == sorted([(ids["long"], "RUNNING"), (ids["new"], "TERMINATED")]), read
    assert states == {
        ids["long"]: "waiting for a reviewer",
        ids["old"]: "ended",
        ids["new"]: "ended",
        ids["soon"]: "starting",
        ids["gone"]: "ended",
    }
