"""Issue 53's breakers and issue 50 item 2, as an operator meets them: real worker processes on a
real Temporal server and PostgreSQL, read through `countersign health` and the metrics.

- A second worker on the same host, with the same COUNTERSIGN_METRICS_PORT (a deploy runs the new
  build beside the old), starts and polls instead of crashing on the taken port.
- The model's breaker, once its endpoint is down, stays open for the design's five minutes
  (COUNTERSIGN_BREAKER_COOL_DOWN_S), and `health` and the metrics say so, with the time left."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import Client

from countersign.cli.health import Breaker, breakers_in
from countersign.core.contract import StartConversation
from countersign.devstack.temporal import DevServerConfig
from countersign.runtime.circuit import CircuitBreaker
from countersign.runtime.config import PROJECT_ROOT, load_settings
from countersign.runtime.ports import free_port
from countersign.scripted_model.server import ScriptedModelServer
from tests.fixtures.cli import run_starter
from tests.observability.test_observability import scrape_until, value
from workflows.agent import AgentWorkflow


@contextlib.asynccontextmanager
async def worker_process(env: dict[str, str]) -> AsyncIterator[asyncio.subprocess.Process]:
    """worker.py as operators start it. Its log goes to a file, not a pipe: a pipe nobody reads
    fills (the failing model calls log tracebacks) and the worker then blocks on its next line."""
    log = Path(env["COUNTERSIGN_DATA_DIR"]) / f"worker-{uuid.uuid4().hex[:8]}.log"
    with log.open("wb") as sink:
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "worker.py", cwd=PROJECT_ROOT, env={**os.environ, **env},
            stdout=asyncio.subprocess.DEVNULL, stderr=sink,
        )  # fmt: skip
    try:
        yield worker
    finally:
        if worker.returncode is None:
            worker.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(worker.wait(), 15)
            except TimeoutError:
                worker.kill()
                await worker.wait()


def worker_env(
    address: str, namespace: str, database_url: str, llm: str, tmp: Path, task_queue: str
) -> dict[str, str]:
    """A worker as operators run it: its environment and nothing else configured."""
    return {
        "TEMPORAL_ADDRESS": address,
        "TEMPORAL_NAMESPACE": namespace,
        "TASK_QUEUE": task_queue,
        "DATABASE_URL": database_url,
        "LLM_BASE_URL": llm,
        "COUNTERSIGN_DATA_DIR": str(tmp),
    }


async def test_a_second_worker_on_the_same_metrics_port_starts_and_serves(
    dev_server: DevServerConfig, database_url: str, scripted_model: ScriptedModelServer, tmp_path: Path
) -> None:
    port, task_queue = free_port(), f"agent-{uuid.uuid4()}"
    # the dev server: it answers who polls a task queue (the time-skipping test server does not)
    env = worker_env(
        dev_server.address, dev_server.namespace, database_url, scripted_model.base_url, tmp_path, task_queue
    )
    env["COUNTERSIGN_METRICS_PORT"] = str(port)
    async with worker_process(env), worker_process(env) as second:
        url = f"http://127.0.0.1:{port}/metrics"
        await scrape_until(url, "temporal_num_pollers", 1, timeout_s=60)
        for _ in range(60):
            said = await run_starter("health", "--metrics", url, env=env)
            if "2 worker(s) polling" in said.stdout:
                break
            assert second.returncode is None, "the second worker stopped: see its log in the test's tmp_path"
            await asyncio.sleep(0.5)
        assert said.returncode == 0, (said.stdout, said.stderr)
        assert "database: ok" in said.stdout and "2 worker(s) polling" in said.stdout
        assert "model closed" in said.stdout and "smtp closed" in said.stdout


async def test_an_open_model_breaker_stays_open_five_minutes_and_health_says_so(
    dev_server: DevServerConfig, database_url: str, tmp_path: Path
) -> None:
    port, task_queue = free_port(), f"agent-{uuid.uuid4()}"
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: every model call fails to connect
    env = worker_env(dev_server.address, dev_server.namespace, database_url, down, tmp_path, task_queue)
    env["COUNTERSIGN_METRICS_PORT"] = str(port)
    client = await Client.connect(dev_server.address, namespace=dev_server.namespace)
    async with worker_process(env):
        url = f"http://127.0.0.1:{port}/metrics"
        await scrape_until(url, "temporal_num_pollers", 1, timeout_s=60)
        start = StartConversation(tenant_id="acme", user_id="alice", agent="lead-qualifier", message="hi")
        handle = await client.start_workflow(
            AgentWorkflow.run, start, id=f"test-{uuid.uuid4()}", task_queue=task_queue
        )
        try:
            samples = await scrape_until(
                url, "countersign_breaker_state", 1, timeout_s=120, breaker="model", state="open"
            )
            left = value(samples, "countersign_breaker_retry_seconds", breaker="model")
            assert 200 < left <= 300, left
            said = await run_starter("health", "--metrics", url, env=env)
            assert said.returncode == 1, said.stdout
            assert "model OPEN (calls refused for" in said.stdout and "not healthy" in said.stderr
        finally:
            await asyncio.wait_for(handle.terminate(), 30)


def test_breakers_cool_down_five_minutes_by_default_and_by_setting() -> None:
    assert CircuitBreaker("x").cool_down == 300
    assert load_settings({}).breaker_cool_down_s == 300
    assert load_settings({"COUNTERSIGN_BREAKER_COOL_DOWN_S": "60"}).breaker_cool_down_s == 60
    text = (
        'countersign_breaker_state{breaker="model",state="open"} 1.0\n'
        'countersign_breaker_state{breaker="model",state="closed"} 0.0\n'
        'countersign_breaker_retry_seconds{breaker="model"} 240.5\n'
        'countersign_breaker_state{breaker="mcp:time",state="closed"} 1.0\n'
    )
    assert breakers_in(text) == [Breaker("mcp:time", "closed", 0.0), Breaker("model", "open", 240.5)]
