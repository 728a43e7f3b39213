"""Deploying a new build (docs/how-to/deploy-a-new-build.md): a conversation stays on the build it
started on, and moves to the deployment's current build when it continues as new (Worker Deployment
Versioning, real dev server)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.common import VersioningBehavior
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer

from countersign.core.approvals import ApproveSignal
from countersign.core.contract import (
    ConversationResult,
    EndConversation,
    StartConversation,
    SubmitMessage,
)
from countersign.db.engine import session_factory
from countersign.devstack.temporal import DevServerConfig
from countersign.runtime.config import Settings
from countersign.runtime.payloads import data_converter
from countersign.scripted_model.server import ScriptedModelServer
from tests.fixtures.approvals import ECHO_RESULT, lead_status, pending, qualify
from tests.fixtures.postgres import reset_jane
from tests.fixtures.scripted_model import scenario_from
from tests.fixtures.smtp import SmtpServer
from tests.fixtures.updates import execute_update
from worker import build_worker
from workflows.agent import AgentWorkflow

pytestmark = pytest.mark.devserver


async def make_current(client: Client, settings: Settings) -> None:
    """`temporal worker deployment set-current-version`, once the build's worker has registered it."""
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace,
        deployment_name=settings.deployment_name,
        build_id=settings.build_id or "",
        identity="test_deployments",
    )
    for _ in range(100):
        try:
            await client.workflow_service.set_worker_deployment_current_version(request)
            return
        except RPCError:  # the version is known once its worker has polled
            await asyncio.sleep(0.1)
    raise AssertionError(f"build {settings.build_id} never became current")


async def build_of(client: Client, workflow_id: str) -> tuple[str, VersioningBehavior, str]:
    """(run id, versioning behavior, build id) of the conversation's latest run."""
    info = (await client.get_workflow_handle(workflow_id).describe()).raw_description.workflow_execution_info
    versioning = info.versioning_info
    behavior = VersioningBehavior(versioning.behavior)
    return info.execution.run_id, behavior, versioning.deployment_version.build_id


async def tasks_completed_since_signal(handle: WorkflowHandle[AgentWorkflow, ConversationResult]) -> int:
    events = [e.event_type for e in (await handle.fetch_history()).events]
    if EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED not in events:
        return 0  # the server holds the signal back behind a task the stopped worker had taken
    since = events[events.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED) :]
    return since.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)


async def test_a_conversation_waiting_for_a_reviewer_finishes_on_its_build_then_moves_to_the_new_one(
    dev_server: DevServerConfig,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
    smtp_server: SmtpServer,
) -> None:
    await reset_jane(db_engine)
    hello = {"when": {"user_contains": "hello"}, "reply": {"content": "hi"}}
    scripted_model.set_scenario(scenario_from({"name": "deploy", "rules": [qualify(), ECHO_RESULT, hello]}))
    client = await Client.connect(
        dev_server.address, namespace=dev_server.namespace, data_converter=pydantic_data_converter
    )
    old = Settings(
        task_queue=f"deploy-{uuid.uuid4()}",
        database_url=database_url,
        llm_base_url=scripted_model.base_url,
        smtp_host=smtp_server.host,
        smtp_port=smtp_server.port,
        deployment_name=f"countersign-{uuid.uuid4().hex[:8]}",
        build_id="build-1",
    )
    new = old.model_copy(update={"build_id": "build-2"})
    sessions = session_factory(db_engine)
    start = StartConversation(
        tenant_id="acme",
        user_id="alice",
        agent="lead-qualifier",
        message="qualify jane",
    )

    async with build_worker(client, old, sessions):
        await make_current(client, old)
        handle = await client.start_workflow(
            AgentWorkflow.run, start, id=f"deploy-{uuid.uuid4()}", task_queue=old.task_queue
        )
        await pending(handle)
        first_run, behavior, build = await build_of(client, handle.id)
        assert (behavior, build) == (VersioningBehavior.PINNED, "build-1")

    # The old build's worker stops mid-approval; the new build deploys and becomes current.
    async with build_worker(client, new, sessions):
        await make_current(client, new)
        await handle.signal(AgentWorkflow.approve, ApproveSignal(call_id="c1", approver="bob"))
        await asyncio.sleep(1.0)
        assert await tasks_completed_since_signal(handle) == 0, "the new build took a pinned conversation"
        assert await lead_status(db_engine, "acme") == "new"

        # The old build's workers, kept until its conversations drain, come back: the turn completes.
        async with build_worker(client, old, sessions):
            turn = await execute_update(handle, AgentWorkflow.wait_turn, 1)
            assert turn is not None and turn.reply == "[scripted model] done", turn
            assert await lead_status(db_engine, "acme") == "qualified"
            for _ in range(100):  # a new build is current: the turn's end continues the conversation as new
                run, behavior, build = await build_of(client, handle.id)
                if run != first_run and behavior == VersioningBehavior.PINNED:  # its first task completed
                    break
                await asyncio.sleep(0.1)
            assert (behavior, build) == (VersioningBehavior.PINNED, "build-2")

        # The old build is gone; the conversation carries on with the new one.
        latest = client.get_workflow_handle_for(AgentWorkflow.run, handle.id)
        await latest.signal(
            AgentWorkflow.submit_message, SubmitMessage(user_id="alice", text="hello", message_id="m2")
        )
        reply = await execute_update(latest, AgentWorkflow.wait_reply, "m2")
        assert reply is not None and reply.reply == "[scripted model] hi", reply
        await latest.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
        assert (await latest.result()).ended_by == "end by alice"
    await reset_jane(db_engine)

    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter)
    for run_id in (first_run, run):  # each build's run replays with this code
        await replayer.replay_workflow(
            await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        )
