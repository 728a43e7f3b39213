"""bench.cost's second durable peer (issue 52): pydantic-ai's Temporal integration.

The integration as its documentation shows it: an `Agent` with the `TemporalDurability` capability
(each model request and each tool call an activity), `PydanticAIPlugin` on the client (its payload
converter, its sandbox pass-throughs), `AgentPlugin` registering the agent's activities on the
worker, and the workflow calling `agent.run`. The model is pydantic-ai's `OpenAIChatModel` over the
`openai` client against the same endpoint; the tool is bench.plain's `search_leads` with the schema
every peer offers.

The agent holds the model's client, so it is built when the worker is (from its settings), and this
module is passed through the workflow sandbox so that the workflow finds that one agent.

    python -m bench.peer_pydantic    # a worker process, configured by the environment as worker.py is
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from openai import AsyncOpenAI
from pydantic_ai import Agent, Tool, UsageLimits
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin, TemporalDurability
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.toolsets import FunctionToolset
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import workflow
from temporalio.client import Client, Plugin
from temporalio.worker import Interceptor, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from bench import bare, plain
from countersign.runtime.config import Settings

WORKFLOW = "PydanticAiLoop"
AGENT_NAME = "bench"
# the model call's and the tool call's activities (TemporalOperationNamer's names)
ACTIVITIES = (f"agent__{AGENT_NAME}__model_request", f"agent__{AGENT_NAME}__toolset__leads__call_tool")


class _Held:
    agent: Agent[None, str] | None = None


def build_agent(settings: Settings, sessions: async_sessionmaker[AsyncSession]) -> Agent[None, str]:
    async def search_leads(query: str, limit: int | None = None) -> str:
        return await plain.search_leads(sessions, query, limit)

    tool = Tool[None].from_schema(
        search_leads, "search_leads", plain.SEARCH_DESCRIPTION, plain.SEARCH_PARAMETERS
    )
    client = AsyncOpenAI(base_url=settings.llm_base_url, api_key=settings.llm_api_key, max_retries=0)
    model = OpenAIChatModel(settings.llm_model, provider=OpenAIProvider(openai_client=client))
    return Agent(
        model,
        name=AGENT_NAME,
        toolsets=[FunctionToolset([tool], id="leads")],
        capabilities=[TemporalDurability()],
    )


@workflow.defn(name=WORKFLOW)
class PydanticLoop:
    @workflow.run
    async def run(self, start: plain.PeerStart) -> int:
        """The number of tool calls made until the model answered in text."""
        assert _Held.agent is not None, "the worker builds the agent"
        result = await _Held.agent.run(
            start.message, instructions=start.system_prompt, usage_limits=UsageLimits(request_limit=None)
        )
        return sum(
            isinstance(part, ToolCallPart) for message in result.all_messages() for part in message.parts
        )


def client_plugins(settings: Settings) -> list[Plugin]:
    """The integration's plugin, on the client that starts the loop and on its worker's."""
    return [PydanticAIPlugin()]


def build_worker(
    client: Client,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    interceptors: Sequence[Interceptor] = (),
) -> Worker:
    _Held.agent = build_agent(settings, sessions)
    restrictions = SandboxRestrictions.default.with_passthrough_modules(__name__)
    return bare.loop_worker(
        client,
        settings,
        interceptors,
        client_plugins(settings),
        workflows=[PydanticLoop],
        plugins=[AgentPlugin(_Held.agent)],
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
    )


if __name__ == "__main__":
    # by its name, not as __main__: the workflow sandbox imports the workflow's module by name
    from bench.peer_pydantic import build_worker as build

    asyncio.run(bare.serve(build))
