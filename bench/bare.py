"""The bare loop: the reference Countersign's cost is measured against (issue 25).

The smallest durable tool-calling loop one would write with Temporal: a workflow that keeps the
transcript in its state, the model call as a regular activity (the `openai` client against the same
endpoint), each tool call as a local activity running the same tool function in a transaction of
the same PostgreSQL. Nothing else: no audit row, no message store, no usage row, no proofs, no
limits, no metrics, no spans, the SDK's default data converter. Its activities carry the product's
names (`call_model`, `execute_tool`) on their own task queue, so bench/history.py reads both
histories the same way.

    python -m bench.bare        # a worker process, configured by the environment as worker.py is
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from temporalio import activity, workflow
from temporalio.client import Client, Plugin
from temporalio.converter import DataConverter
from temporalio.worker import Interceptor, Worker

with workflow.unsafe.imports_passed_through():
    import openai
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

    from bench.history import MODEL_ACTIVITY, TOOL_ACTIVITY
    from countersign.core.calls import CallerContext
    from countersign.runtime.config import Settings, load_settings
    from tools.arguments import parse_arguments
    from tools.registry import REGISTRY, ToolContext

WORKFLOW = "BareLoop"
STARTED_LINE = "worker started"  # what the devstack's worker process waits for in the log
Message = dict[str, Any]


@dataclass
class BareStart:
    tenant_id: str
    user_id: str
    system_prompt: str
    message: str
    tools: list[dict[str, Any]]  # the OpenAI tool definitions offered
    max_calls: int = 0  # the turn ends after this many tool calls (0: when the model answers in text)


@dataclass
class BareModelCall:
    messages: list[Message]
    tools: list[dict[str, Any]]


@dataclass
class BareToolCall:
    tenant_id: str
    user_id: str
    call_id: str
    name: str
    arguments: str


@workflow.defn(name=WORKFLOW)
class BareLoop:
    @workflow.run
    async def run(self, start: BareStart) -> int:
        """The number of tool calls made until the model answered in text."""
        messages: list[Message] = [
            {"role": "system", "content": start.system_prompt},
            {"role": "user", "content": start.message, "name": start.user_id},
        ]
        calls = 0
        while True:
            reply: Message = await workflow.execute_activity(
                MODEL_ACTIVITY,
                BareModelCall(messages, start.tools),
                result_type=dict,
                start_to_close_timeout=timedelta(seconds=60),
            )
            messages.append(reply)
            if not reply.get("tool_calls"):
                return calls
            for call in reply["tool_calls"]:
                function = call["function"]
                content: str = await workflow.execute_local_activity(
                    TOOL_ACTIVITY,
                    BareToolCall(
                        start.tenant_id, start.user_id, call["id"], function["name"], function["arguments"]
                    ),
                    result_type=str,
                    start_to_close_timeout=timedelta(seconds=30),
                )
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
                calls += 1
                if calls == start.max_calls:
                    return calls


class BareActivities:
    def __init__(self, settings: Settings, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._model = settings.llm_model
        self._sessions = sessions
        self._client = openai.AsyncOpenAI(
            base_url=settings.llm_base_url, api_key=settings.llm_api_key, max_retries=0
        )

    @activity.defn(name=MODEL_ACTIVITY)
    async def call_model(self, call: BareModelCall) -> Message:
        completion = await self._client.chat.completions.create(
            model=self._model,
            messages=call.messages,  # type: ignore[arg-type]
            tools=call.tools,  # type: ignore[arg-type]
        )
        return completion.choices[0].message.model_dump(mode="json", exclude_none=True)

    @activity.defn(name=TOOL_ACTIVITY)
    async def execute_tool(self, call: BareToolCall) -> str:
        """The tool's own function on the same database, in a transaction; its output as JSON."""
        tool = REGISTRY[call.name]
        caller = CallerContext(tenant_id=call.tenant_id, user_id=call.user_id, roles=[], agent="bare")
        info = activity.info()
        async with self._sessions() as session, session.begin():
            context = ToolContext(caller, session, info.workflow_id or "", call.call_id, datetime.now(UTC))
            output = await tool.run(context, parse_arguments(tool, json.loads(call.arguments)))
        return output.model_dump_json()


def bare_client(client: Client, plugins: Sequence[Plugin] = ()) -> Client:
    """The same connection with the SDK's default data converter, and a peer's integration `plugins`
    (its payload converter, its sandbox pass-throughs)."""
    config = client.config()
    config["data_converter"] = DataConverter.default
    config["plugins"] = list(plugins)
    return Client(**config)


def loop_worker(
    client: Client,
    settings: Settings,
    interceptors: Sequence[Interceptor],
    client_plugins: Sequence[Plugin] = (),
    **options: Any,
) -> Worker:
    """The worker of a loop or a peer on `settings.task_queue`, over `bare_client(client,
    client_plugins)`; `options`: its workflows, activities and whatever else its `Worker` takes."""
    connection = bare_client(client, client_plugins)
    return Worker(connection, task_queue=settings.task_queue, interceptors=interceptors, **options)


def build_worker(
    client: Client,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    interceptors: Sequence[Interceptor] = (),
) -> Worker:
    bare = BareActivities(settings, sessions)
    return loop_worker(
        client, settings, interceptors, workflows=[BareLoop], activities=[bare.call_model, bare.execute_tool]
    )


class WorkerBuilder(Protocol):
    """How a loop's (or a peer's) worker is built: bench.bare's `build_worker` and its kind."""

    def __call__(
        self,
        client: Client,
        settings: Settings,
        sessions: async_sessionmaker[AsyncSession],
        interceptors: Sequence[Interceptor] = (),
    ) -> Worker: ...


async def serve(build: WorkerBuilder) -> None:
    """A worker process of `build`, configured by the environment as worker.py is (bench.cost's
    loops and peers each run as one)."""
    settings = load_settings()
    assert settings.database_url, "DATABASE_URL"
    client = await Client.connect(settings.temporal_address, namespace=settings.namespace)
    engine = create_async_engine(settings.database_url)  # SQLAlchemy's defaults, as a minimal app has
    try:
        worker = build(client, settings, async_sessionmaker(engine))
        print(STARTED_LINE, flush=True)
        await worker.run()
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(serve(build_worker))
