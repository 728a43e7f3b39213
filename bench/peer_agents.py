"""bench.cost's first durable peer (issue 52): the OpenAI Agents SDK on Temporal through its plugin.

The integration as its README shows it: `OpenAIAgentsPlugin` on the client (its payload converter,
its sandbox pass-throughs, the model activity `invoke_model_activity`), an `Agent` built in the
workflow and run with `Runner.run`, the tool a Temporal activity made into an agent tool with
`activity_as_tool`. The model is the `openai` client's Chat Completions against the same endpoint;
the tool is bench.plain's `search_leads` with the schema every peer offers.

    python -m bench.peer_agents      # a worker process, configured by the environment as worker.py is
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client, Plugin
from temporalio.worker import Interceptor, Worker

with workflow.unsafe.imports_passed_through():
    from agents import Agent, FunctionTool, Runner
    from agents.items import ToolCallItem
    from agents.models.openai_provider import OpenAIProvider
    from openai import AsyncOpenAI
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
    from temporalio.contrib.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.contrib.openai_agents import workflow as agents_workflow

    from bench import bare, plain
    from countersign.runtime.config import Settings

WORKFLOW = "AgentsSdkLoop"
ACTIVITIES = ("invoke_model_activity", "search_leads")  # the model call's and the tool call's
MAX_TURNS = 50  # the SDK's default (10) would end a longer workload early


class PeerTools:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @activity.defn(name="search_leads")
    async def search_leads(self, query: str, limit: int | None = None) -> str:
        """Search the workspace's leads by name, email or company (case-insensitive substring)."""
        return await plain.search_leads(self._sessions, query, limit)


@workflow.defn(name=WORKFLOW)
class AgentsLoop:
    @workflow.run
    async def run(self, start: plain.PeerStart) -> int:
        """The number of tool calls made until the model answered in text."""
        made = agents_workflow.activity_as_tool(
            PeerTools.search_leads, start_to_close_timeout=timedelta(seconds=30)
        )
        assert isinstance(made, FunctionTool)
        tool = dataclasses.replace(
            made, description=plain.SEARCH_DESCRIPTION, params_json_schema=plain.SEARCH_PARAMETERS
        )
        agent = Agent(name="bench", instructions=start.system_prompt, model=start.model, tools=[tool])
        result = await Runner.run(agent, start.message, max_turns=MAX_TURNS)
        return sum(isinstance(item, ToolCallItem) for item in result.new_items)


def client_plugins(settings: Settings) -> list[Plugin]:
    """The integration's plugin, on the client that starts the loop and on its worker's."""
    client = AsyncOpenAI(base_url=settings.llm_base_url, api_key=settings.llm_api_key, max_retries=0)
    plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=60)),
        model_provider=OpenAIProvider(openai_client=client, use_responses=False),
    )
    return [plugin]


def build_worker(
    client: Client,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    interceptors: Sequence[Interceptor] = (),
) -> Worker:
    return bare.loop_worker(
        client,
        settings,
        interceptors,
        client_plugins(settings),
        workflows=[AgentsLoop],
        activities=[PeerTools(sessions).search_leads],
    )


if __name__ == "__main__":
    # by its name, not as __main__: the workflow sandbox imports the workflow's module by name
    from bench.peer_agents import build_worker as build

    asyncio.run(bare.serve(build))
