"""`start --wait` as a person meets it: the id at once, and Ctrl-C says what goes on (exit 130).

Runs the real CLI as a subprocess against the Temporal dev server, on a task queue no worker polls,
so the first turn never finishes: the only way out is Ctrl-C.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from countersign.cli.ux import EXIT_INTERRUPTED
from countersign.devstack.temporal import DevServerConfig
from countersign.runtime.config import PROJECT_ROOT

pytestmark = pytest.mark.devserver


def interrupt_start_wait(env: dict[str, str]) -> tuple[str, int, str]:
    """Run `start --wait`, press Ctrl-C once it printed the id: (id, exit status, stderr)."""
    command = [sys.executable, "starter.py", "start", "--tenant", "acme", "--user", "alice"]
    command += ["--agent", "operations", "--message", "What are Alice's open tasks?", "--wait"]
    process = subprocess.Popen(
        command, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        workflow_id = process.stdout.readline().strip()  # printed before any waiting
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    return workflow_id, process.returncode, err


async def test_ctrl_c_while_waiting_says_the_conversation_goes_on(dev_server: DevServerConfig) -> None:
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_server.address,
        "TASK_QUEUE": f"nobody-{uuid.uuid4().hex[:8]}",
    }
    workflow_id, status, err = await asyncio.to_thread(interrupt_start_wait, env)
    assert workflow_id.startswith("conv-acme-")
    assert status == EXIT_INTERRUPTED, err
    assert f"interrupted: conversation {workflow_id} goes on" in err
    assert "Traceback" not in err and "Error" not in err
    client = await Client.connect(dev_server.address)
    handle = client.get_workflow_handle(workflow_id)
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    await handle.terminate("test finished")
