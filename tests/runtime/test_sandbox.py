"""The worker's sandbox compiles its code once (countersign/runtime/sandbox.py) and checks what the
SDK's sandbox checks: a workflow reaching outside (here: reading the machine's clock through
`datetime`) fails its workflow task with the SDK's restriction, and a well-behaved one runs. Both on
a real Temporal test server, with the worker's own runner and passthrough list."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

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
