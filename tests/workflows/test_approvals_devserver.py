"""Approvals on the real dev server: a worker restarted while a call waits, and a decision sent
with the plain `temporal workflow signal` CLI, as any reviewer's tooling could."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from countersign.core.contract import StartConversation
from countersign.db.engine import session_factory
from countersign.db.schema import Lead, ToolExecution
from countersign.devstack.temporal import DevServerConfig, temporal_binary
from countersign.runtime.config import Settings
from countersign.runtime.search_attributes import AGENT_STATUS
from countersign.scripted_model.server import ScriptedModelServer
from tests.fixtures.approvals import pending, qualify
from tests.fixtures.postgres import JANE, reset_jane
from tests.fixtures.scripted_model import scenario_from
from worker import build_worker
from workflows.agent import AgentWorkflow

pytestmark = pytest.mark.devserver


async def test_an_approval_survives_a_worker_restart_and_runs_once_via_cli_signal(
    dev_server: DevServerConfig,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
) -> None:
    await reset_jane(db_engine)
    scripted_model.set_scenario(
        scenario_from(
            {
                "name": "restart",
                "rules": [
                    qualify(),
                    {"when": {"after_tool": "update_lead_status"}, "reply": {"content": "done"}},
                ],
            }
        )
    )
    client = await Client.connect(
        dev_server.address, namespace=dev_server.namespace, data_converter=pydantic_data_converter
    )
    settings = Settings(
        task_queue=f"restart-{uuid.uuid4()}", database_url=database_url, llm_base_url=scripted_model.base_url
    )
    sessions = session_factory(db_engine)
    start = StartConversation(
        tenant_id="acme", user_id="alice", agent="lead-qualifier", message="qualify jane", single_turn=True
    )

    async with build_worker(client, settings, sessions):
        handle = await client.start_workflow(
            AgentWorkflow.run, start, id=f"restart-{uuid.uuid4()}", task_queue=settings.task_queue
        )
        (waiting,) = (await pending(handle)).pending_approvals
    # the worker is gone; the approval waits in the server, not in a process, and visibility says so
    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.RUNNING
    assert described.typed_search_attributes.get(AGENT_STATUS) == "awaiting_approval"

    payload = json.dumps({"call_id": waiting.call_id, "approver": "bob", "reason": "ok from the CLI"})
    signal = [
        temporal_binary(),
        "workflow",
        "signal",
        "--address",
        dev_server.address,
        "--namespace",
        dev_server.namespace,
        "--workflow-id",
        handle.id,
        "--name",
        "approve",
        "--input",
        payload,
    ]
    done = await asyncio.to_thread(subprocess.run, signal, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    async with build_worker(client, settings, sessions):  # a new worker picks the conversation up
        result = await handle.result()
    assert result.last_reply == "[scripted model] done"
    async with db_engine.connect() as conn:
        rows = (await conn.execute(select(ToolExecution).where(ToolExecution.workflow_id == handle.id))).all()
        status = (
            await conn.execute(select(Lead.status).where(Lead.tenant_id == "acme", Lead.email == JANE))
        ).scalar()
    assert [(r.outcome, r.approved_by) for r in rows] == [("executed", "bob")], "executed exactly once"
    assert status == "qualified"
    await reset_jane(db_engine)
