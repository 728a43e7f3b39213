"""Exactly one effect per tool call: an attempt of a call that already committed (a retry after a
lost completion, or a duplicate running at the same time) returns the recorded result and changes
nothing again. First on the activity itself, then through Temporal's own retry."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import pytest_asyncio
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.tools import ToolActivities
from countersign.core.calls import CallerContext, StoredResult, ToolInvocation, ToolResult
from countersign.db.engine import session_factory
from countersign.db.schema import Task, ToolExecution
from countersign.scripted_model.server import ScriptedModelServer
from tests.fixtures.agent import running_agent

ALICE = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="operations")


class LosesFirstCompletion(ToolActivities):
    """The real tool activity, whose first attempt commits and then fails as if the worker had died
    before reporting the result: Temporal runs the call again."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        super().__init__(sessions)
        self.attempts: list[int] = []

    @activity.defn(name="execute_tool")
    async def execute_tool(self, invocation: ToolInvocation) -> ToolResult | StoredResult:
        result = await super().execute_tool(invocation)
        self.attempts.append(activity.info().attempt)
        if activity.info().attempt == 1:
            raise ApplicationError("the completion was lost after the commit", type="LostCompletion")
        return result


@pytest_asyncio.fixture
async def title(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """A task title of this test only; its tasks and their audit rows are removed afterwards."""
    title = f"Call back {uuid.uuid4()}"
    yield title
    async with db_engine.begin() as conn:
        await conn.execute(delete(ToolExecution).where(ToolExecution.args["title"].astext == title))
        await conn.execute(delete(Task).where(Task.title == title))


def create_task(title: str) -> ToolInvocation:
    return ToolInvocation(
        caller=ALICE,
        workflow_id=f"wf-{uuid.uuid4()}",
        run_id="run-1",
        call_id="c1",
        tool="create_task",
        arguments=json.dumps({"title": title}),
    )


async def effects(engine: AsyncEngine, title: str) -> tuple[int, int]:
    """How many tasks have `title`, and how many audit rows record creating one."""
    async with engine.connect() as conn:
        tasks = await conn.scalar(select(func.count()).where(Task.title == title))
        audited = await conn.scalar(select(func.count()).where(ToolExecution.args["title"].astext == title))
    return tasks or 0, audited or 0


async def test_a_repeated_call_changes_nothing_twice(db_engine: AsyncEngine, title: str) -> None:
    tools = ToolActivities(session_factory(db_engine))
    invocation = create_task(title)
    first = await tools.execute_tool(invocation)
    again = await tools.execute_tool(invocation)
    assert first.ok and again == first
    assert await effects(db_engine, title) == (1, 1)


async def test_concurrent_attempts_of_one_call_act_once(db_engine: AsyncEngine, title: str) -> None:
    tools = ToolActivities(session_factory(db_engine))
    invocation = create_task(title)
    results = await asyncio.gather(*(tools.execute_tool(invocation) for _ in range(4)))
    assert results[0].ok and all(result == results[0] for result in results)
    assert await effects(db_engine, title) == (1, 1)


async def test_a_retry_after_a_lost_completion_returns_the_recorded_result(
    temporal_env: WorkflowEnvironment,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
    title: str,
) -> None:
    tools = LosesFirstCompletion(session_factory(db_engine))
    async with running_agent(temporal_env, database_url, db_engine, scripted_model, tools) as agent:
        agent.script(
            {
                "when": {"turn_calls": 0},
                "reply": {"tool_calls": [{"name": "create_task", "arguments": {"title": title}}]},
            },
            {"when": {"after_tool": "create_task"}, "reply": {"content": "Created."}},
        )
        result = await agent.converse("remind me to call back", agent="operations")
    assert result.last_reply == "[scripted model] Created."
    assert tools.attempts == [1, 2], "the first attempt committed, then Temporal retried it"

    async with db_engine.connect() as conn:
        (task_id,) = (await conn.scalars(select(Task.id).where(Task.title == title))).all()
    assert await effects(db_engine, title) == (1, 1)
    (tool_message,) = [m for m in scripted_model.requests[-1]["messages"] if m["role"] == "tool"]
    seen = json.loads(tool_message["content"])
    assert seen["ok"] and seen["data"]["id"] == task_id, "the model saw the first attempt's recorded result"
