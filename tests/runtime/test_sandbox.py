"""The worker's sandbox compiles its code once and answers serialization contexts directly
(countersign/runtime/sandbox.py), and checks what the SDK's sandbox checks: a workflow reaching
outside (here: reading the machine's clock through `datetime`) fails its workflow task with the
SDK's restriction, a well-behaved one runs, and a codec that asks for its payloads' context gets the
activity's, as under the stock runner. On a real Temporal test server, with the worker's own runner
and passthrough list."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import (
    DataConverter,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
)
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox._runner import _Instance

with workflow.unsafe.imports_passed_through():  # the sandbox imports this module for its workflows
    from countersign.runtime.sandbox import CompiledSandboxRunner, compiled, sandbox_runner
    from tests.fixtures.temporal import failed_tasks
    from worker import PASSTHROUGH


@workflow.defn(name="sandbox-reads-the-clock")
class ReadsTheClock:
    @workflow.run
    async def run(self) -> str:
        return datetime.now().isoformat()  # not deterministic: the sandbox refuses it


@workflow.defn(name="sandbox-well-behaved")
class WellBehaved:
    @workflow.run
    async def run(self, name: str) -> str:
        await workflow.sleep(timedelta(seconds=1))
        return f"hello {name} at {workflow.now().year > 2000}"


@activity.defn(name="sandbox-echo")
async def echo(text: str) -> str:
    return text.upper()


@workflow.defn(name="sandbox-calls-an-activity")
class CallsAnActivity:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(echo, text, start_to_close_timeout=timedelta(seconds=10))


class Recording(PayloadCodec, WithSerializationContext):
    """A codec that changes nothing and records the context it was given for each payload."""

    def __init__(
        self,
        seen: list[tuple[bytes, SerializationContext | None]],
        context: SerializationContext | None = None,
    ):
        self.seen, self.context = seen, context

    def with_context(self, context: SerializationContext) -> Recording:
        return Recording(self.seen, context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.seen += [(p.data, self.context) for p in payloads]
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


def runner() -> SandboxedWorkflowRunner:
    return sandbox_runner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH))


def test_the_worker_runs_the_compiled_sandbox_and_compiles_each_source_once() -> None:
    assert isinstance(runner(), CompiledSandboxRunner)
    assert compiled("x = 1\n") is compiled("x = 1\n")


async def test_the_compiled_sandbox_refuses_what_the_sandbox_refuses_and_runs_the_rest(
    temporal_env: WorkflowEnvironment,
) -> None:
    client, queue = temporal_env.client, f"sandbox-{uuid.uuid4()}"
    async with Worker(
        client, task_queue=queue, workflows=[ReadsTheClock, WellBehaved], workflow_runner=runner()
    ):
        fine = await client.execute_workflow(
            WellBehaved.run, "ann", id=f"fine-{uuid.uuid4()}", task_queue=queue
        )
        assert fine == "hello ann at True"
        clock = await client.start_workflow(
            ReadsTheClock.run, id=f"clock-{uuid.uuid4()}", task_queue=queue, run_timeout=timedelta(seconds=30)
        )
        failures: list[str] = []
        for _ in range(100):
            failures = await failed_tasks(clock)
            if failures:
                break
            await asyncio.sleep(0.1)
    assert failures, "the clock read was not refused"
    assert "Cannot access datetime.datetime.now" in failures[0], failures


async def contexts_seen(temporal_env: WorkflowEnvironment, runner: SandboxedWorkflowRunner) -> list[Any]:
    """The contexts a recording codec was given for the payloads of one workflow that calls one
    activity, run by `runner`, with the ids that differ between runs replaced."""
    seen: list[tuple[bytes, SerializationContext | None]] = []
    config = temporal_env.client.config()
    config["data_converter"] = DataConverter(payload_codec=Recording(seen))
    client, queue = Client(**config), f"sandbox-{uuid.uuid4()}"
    workflow_id = f"context-{uuid.uuid4()}"
    async with Worker(
        client, task_queue=queue, workflows=[CallsAnActivity], activities=[echo], workflow_runner=runner
    ):
        said = await client.execute_workflow(CallsAnActivity.run, "hi", id=workflow_id, task_queue=queue)
    assert said == "HI"
    same = {workflow_id: "<workflow>", queue: "<queue>"}
    return [
        (data, type(c).__name__, {k: same.get(v, v) for k, v in vars(c).items()} if c else None)
        for data, c in seen
    ]


async def test_a_codec_gets_the_contexts_the_stock_sandbox_gives(temporal_env: WorkflowEnvironment) -> None:
    stock = SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
    )
    ours = await contexts_seen(temporal_env, runner())
    assert ours == await contexts_seen(temporal_env, stock)
    # the activity's input, encoded by the workflow's task with the activity's context
    assert (b'"hi"', "ActivitySerializationContext") in [(data, kind) for data, kind, _ in ours], ours


async def test_the_worker_refuses_to_start_on_a_sandbox_instance_it_no_longer_matches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As a worker checks each workflow type when it starts: an SDK whose instance no longer holds
    what the runner uses (here: nothing created in its globals) stops it there."""
    runner().prepare_workflow(workflow._Definition.must_from_class(WellBehaved))  # as it is: fine
    monkeypatch.setattr(_Instance, "_create_instance", lambda self: None)
    with pytest.raises(RuntimeError, match="no longer matches the SDK's sandbox instance"):
        runner().prepare_workflow(workflow._Definition.must_from_class(WellBehaved))
