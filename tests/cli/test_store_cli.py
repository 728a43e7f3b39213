"""`transcript`, `status`, `audit` and `rollback` on an ended conversation, as a person runs them:
`python starter.py …` subprocesses against the real dev server, PostgreSQL and the scripted model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.service import RPCError

from tests.fixtures.agent import AgentHarness
from tests.fixtures.cli import run_starter
from tests.workflows.test_saga import WRITES, clean, snapshot  # noqa: F401  (a fixture, used by name)
from tests.workflows.test_store import make_agent


async def starter(harness: AgentHarness, data_dir: Path, *args: str) -> tuple[int, str]:
    done = await run_starter(*args, env=harness.cli_env(data_dir))
    return done.returncode, done.stdout + done.stderr


@pytest.mark.usefixtures("clean")
async def test_an_ended_conversation_is_shown_and_rolled_back_from_the_cli(
    dev_agent: AgentHarness, db_engine: AsyncEngine, scratch: list[str], tmp_path: Path
) -> None:
    name = await make_agent(db_engine, scratch)
    dev_agent.script(
        {"when": {"user_contains": "do it"}, "reply": {"tool_calls": WRITES[1:3]}},
        {"when": {"after_tool": "create_event"}, "reply": {"content": "done"}},
    )
    before = await snapshot(db_engine)
    handle = await dev_agent.start("do it", agent=name, single_turn=True)
    await handle.result()

    code, out = await starter(dev_agent, tmp_path, "permissions", "show", "admin-assistant")
    assert code == 0 and "context: last 20 messages; budget per conversation: none" in out, out
    code, out = await starter(dev_agent, tmp_path, "transcript", handle.id)
    assert (
        code == 0
        and "alice> do it" in out
        and "← create_task [c1]" in out
        and "agent> [scripted model] done" in out
    )
    code, out = await starter(dev_agent, tmp_path, "status", handle.id)
    assert code == 0 and "ended · turn 1" in out and "tenant acme today:" in out
    code, out = await starter(
        dev_agent, tmp_path, "rollback", handle.id, "--as", "bob", "--scope", "conversation"
    )
    assert code != 0 and "rollback refused" in out
    code, out = await starter(
        dev_agent, tmp_path, "rollback", handle.id, "--as", "alice", "--scope", "conversation"
    )
    assert code == 0 and "c2 create_event: done" in out and "c1 create_task: done" in out, out
    after = await snapshot(db_engine)
    assert after["tasks"] == before["tasks"] and after["events"] == before["events"]
    code, out = await starter(
        dev_agent, tmp_path, "rollback", handle.id, "--as", "alice", "--scope", "call", "--call", "c1"
    )
    assert code == 0 and "nothing to undo" in out
    code, out = await starter(dev_agent, tmp_path, "audit", "--workflow", handle.id, "--json")
    assert code == 0 and all(row["rolled_back"] for row in json.loads(out))

    # past the namespace's retention the history is gone: the store still answers
    await dev_agent.client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=dev_agent.client.namespace, workflow_execution=WorkflowExecution(workflow_id=handle.id)
        )
    )
    for _ in range(100):
        try:
            await handle.describe()
        except RPCError:
            break
        await asyncio.sleep(0.1)
    code, out = await starter(dev_agent, tmp_path, "status", handle.id)
    assert code == 0 and "ended · turn 1 · acme" in out, out
    code, out = await starter(dev_agent, tmp_path, "transcript", handle.id)
    assert code == 0 and "agent> [scripted model] done" in out
    code, out = await starter(
        dev_agent, tmp_path, "rollback", handle.id, "--as", "alice", "--scope", "conversation"
    )
    assert code == 0 and "nothing to undo" in out, out
