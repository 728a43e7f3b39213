"""The benchmark's own parts, on free ports in a temporary directory, each stopped on the way out.

PostgreSQL, the Temporal dev server and the worker subprocess come from `countersign.devstack`; the
scripted model server and the in-process worker are the product's own classes. The default ports of
a developer's `dev up` (7233, 8233, 8400, 55432) are never used: every port is a free one.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client
from temporalio.worker import Worker

import worker as worker_module
from activities.tools import ToolActivities
from countersign.config import PROJECT_ROOT, Settings
from countersign.db.engine import create_engine, session_factory
from countersign.devstack import processes
from countersign.devstack.ports import free_port
from countersign.devstack.postgres import seeded_postgres
from countersign.devstack.processes import ProcessRecord
from countersign.devstack.temporal import DYNAMIC_CONFIG, DevServerConfig, temporal_binary, wait_ready
from countersign.ratelimit import RateLimit, RateLimits
from countersign.scripted_model.scenario import Scenario
from countersign.scripted_model.server import ScriptedModelServer
from countersign.temporal_client import connect

RESERVED_PORTS = frozenset({7233, 8233, 8400, 55432})  # a developer's `dev up` may be using them
POLL_RPS_KEY = "history.transferProcessorMaxPollRPS"
# The per-tenant tool rate limit (10/s by default) would measure the limiter, not the orchestration.
UNLIMITED = RateLimits(RateLimit(per_s=1e6, burst=1e6))
WORKER_READY_TIMEOUT_S = 60.0


def bench_port() -> int:
    """A free port that is none of the dev stack's defaults."""
    while (port := free_port()) in RESERVED_PORTS:
        pass
    return port


@asynccontextmanager
async def postgres(root: Path) -> AsyncIterator[str]:
    """A migrated, seeded PostgreSQL; yields its URL."""
    async with seeded_postgres(root / "postgres", bench_port()) as url:
        yield url


def dev_server_command(config: DevServerConfig, dynamic_config: Sequence[str]) -> list[str]:
    """The product's dev server command with its transfer-poll setting replaced by `dynamic_config`
    (an empty `dynamic_config` leaves the server's own default, 20)."""
    cmd = config.command(temporal_binary())
    for value in DYNAMIC_CONFIG:
        at = cmd.index(value)
        del cmd[at - 1 : at + 1]
    for value in dynamic_config:
        cmd[-2:-2] = ["--dynamic-config-value", value]  # before `--log-level warn`
    return cmd


@asynccontextmanager
async def temporal(root: Path, name: str, dynamic_config: Sequence[str]) -> AsyncIterator[DevServerConfig]:
    """A dev server on free ports with a throwaway SQLite file."""
    config = DevServerConfig(port=bench_port(), ui_port=bench_port(), db_file=root / f"temporal-{name}.db")
    command = dev_server_command(config, dynamic_config)
    record = processes.spawn(command, config.address, root / f"temporal-{name}.log", root)
    try:
        await wait_ready(config.address, config.namespace, timeout_s=60, process=record)
        yield config
    finally:
        await asyncio.to_thread(processes.stop, record)


@contextmanager
def bytecode_cache(root: Path) -> Iterator[None]:
    """Let imports write and read bytecode (under `root`, not the source tree) although the
    environment says PYTHONDONTWRITEBYTECODE=1, as this machine and the Dockerfile do: the workflow
    sandbox imports the workflow module afresh for every workflow run, compiling it from source."""
    saved = sys.dont_write_bytecode, sys.pycache_prefix
    sys.dont_write_bytecode, sys.pycache_prefix = False, str(root / "pycache")
    try:
        yield
    finally:
        sys.dont_write_bytecode, sys.pycache_prefix = saved


@dataclass
class Parts:
    """What the workloads talk to: one dev server, the database, the model, a worker's task queue."""

    client: Client
    settings: Settings
    engine: AsyncEngine
    model: ScriptedModelServer


@asynccontextmanager
async def in_process_worker(parts: Parts, options: Mapping[str, Any]) -> AsyncIterator[Parts]:
    """`worker.build_worker` on a fresh task queue, with extra `Worker` options (the levers tried)."""
    settings = parts.settings.model_copy(update={"task_queue": f"bench-{time.monotonic_ns()}"})
    sessions = session_factory(parts.engine)
    tools = ToolActivities(sessions, rate_limits=UNLIMITED)
    with mock.patch.object(worker_module, "Worker", partial(Worker, **options)):
        built = worker_module.build_worker(parts.client, settings, sessions, tools)
    async with built:
        yield Parts(parts.client, settings, parts.engine, parts.model)


@asynccontextmanager
async def parts(database_url: str, server: DevServerConfig, scenario: Scenario) -> AsyncIterator[Parts]:
    """A client of `server`, an engine, and the scripted model answering from `scenario`."""
    async with ScriptedModelServer(scenario) as model:
        settings = Settings(
            temporal_address=server.address,
            namespace=server.namespace,
            database_url=database_url,
            llm_base_url=model.base_url,
        )
        client = await connect(settings)
        engine = create_engine(database_url, pool_size=20, max_overflow=20)
        try:
            yield Parts(client, settings, engine, model)
        finally:
            await engine.dispose()


def worker_env(settings: Settings, data_dir: Path) -> dict[str, str]:
    """The environment of `python worker.py`: every address set, no `.data/stack.json` consulted."""
    assert settings.database_url and settings.llm_base_url
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": settings.temporal_address,
        "TEMPORAL_NAMESPACE": settings.namespace,
        "DATABASE_URL": settings.database_url,
        "LLM_BASE_URL": settings.llm_base_url,
        "LLM_MODEL": settings.llm_model,
        "TASK_QUEUE": settings.task_queue,
        "COUNTERSIGN_DATA_DIR": str(data_dir),
        "RATE_LIMIT_PER_S": "1000000",
        "RATE_LIMIT_BURST": "1000000",
    }


def _logged(log: Path, text: str) -> bool:
    return text in log.read_text(errors="replace")


async def _wait_logged(record: ProcessRecord, log: Path, text: str) -> None:
    deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
    while not _logged(log, text):
        processes.ensure_alive(record, "the worker")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not log {text!r} within {WORKER_READY_TIMEOUT_S:.0f}s")
        await asyncio.sleep(0.1)


def _spawn_worker(settings: Settings, root: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(PROJECT_ROOT / "worker.py")],
            cwd=PROJECT_ROOT,
            env=worker_env(settings, root),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@asynccontextmanager
async def worker_subprocess(settings: Settings, root: Path) -> AsyncIterator[int]:
    """`python worker.py` on `settings.task_queue`; yields its pid once it logged that it started."""
    log = root / f"worker-{settings.task_queue}.log"
    child = _spawn_worker(settings, root, log)
    record = processes.adopt(child.pid, settings.task_queue, log)
    try:
        await _wait_logged(record, log, "worker started")
        yield child.pid
    finally:
        await asyncio.to_thread(processes.stop, record)
        child.wait(timeout=10)
