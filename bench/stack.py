"""The benchmark's own parts, on free ports in a temporary directory, each stopped on the way out.

PostgreSQL, the Temporal dev server and the worker subprocess come from `countersign.devstack`; the
scripted model server and the in-process worker are the product's own classes. The default ports of
a developer's `dev up` (7233, 8233, 8400, 55432) are never used: every port is a free one.
"""

from __future__ import annotations

import asyncio
import compileall
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import psutil
import temporalio.workflow
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

import worker as worker_module
from activities.tools import ToolActivities
from bench.clock import ActivityClock
from countersign.client.temporal_client import connect
from countersign.db.engine import create_engine, session_factory
from countersign.db.ratelimit import UNLIMITED, UNLIMITED_ENV
from countersign.devstack import processes
from countersign.devstack import worker as devstack_worker
from countersign.devstack.postgres import seeded_postgres
from countersign.devstack.temporal import (
    DYNAMIC_CONFIG,
    SQLITE_PRAGMAS,
    DevServerConfig,
    temporal_binary,
    wait_ready,
)
from countersign.runtime.config import PROJECT_ROOT, Settings
from countersign.runtime.ports import free_port
from countersign.scripted_model.scenario import Scenario
from countersign.scripted_model.server import ScriptedModelServer
from tools.registry import REGISTRY

RESERVED_PORTS = frozenset({7233, 8233, 8400, 55432})  # a developer's `dev up` may be using them
# Workers run UNLIMITED (imported above): the tool rate limits (10/s a tenant, 5/s a user, by default)
# would measure the limiter, not the orchestration.


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


@dataclass(frozen=True)
class ServerSetup:
    """A dev server variant; the default is the product's, as `dev up` starts it."""

    dynamic_config: tuple[str, ...] = DYNAMIC_CONFIG
    sqlite_pragmas: tuple[str, ...] = SQLITE_PRAGMAS
    in_memory: bool = False  # no --db-filename: nothing persisted (a reference point, not a product option)


def dev_server_command(config: DevServerConfig, setup: ServerSetup) -> list[str]:
    variant = replace(config, dynamic_config=setup.dynamic_config, sqlite_pragmas=setup.sqlite_pragmas)
    cmd = variant.command(temporal_binary())
    if setup.in_memory:
        at = cmd.index("--db-filename")
        del cmd[at : at + 2]
    return cmd


@dataclass(frozen=True)
class Server:
    config: DevServerConfig
    pid: int


@asynccontextmanager
async def temporal(root: Path, name: str, setup: ServerSetup) -> AsyncIterator[Server]:
    """A dev server on free ports with a throwaway SQLite file."""
    config = DevServerConfig(port=bench_port(), ui_port=bench_port(), db_file=root / f"temporal-{name}.db")
    record = processes.spawn(
        dev_server_command(config, setup), config.address, root / f"temporal-{name}.log", root
    )
    try:
        await wait_ready(config.address, config.namespace, timeout_s=60, process=record)
        assert record.pid is not None
        yield Server(config, record.pid)
    finally:
        await asyncio.to_thread(processes.stop, record)


# What `make` byte-compiles (its `bytecode` target), and the benchmark's own loops, whose workflow
# modules the sandbox imports afresh for every run just as it does the product's.
BYTECODE = ("countersign", "workflows", "activities", "tools", "bench", "worker.py", "starter.py")


def byte_compile() -> None:
    """Bytecode for the sources the benchmark measures, as `make` writes it: a checkout used without
    `make` (a worktree on PYTHONPATH, PYTHONDONTWRITEBYTECODE=1) would otherwise have the workflow
    sandbox compile every workflow module from source for every conversation (13 % of Countersign's
    worker samples in issue 52's first profile), a cost no installation made by `make` or the
    Docker image pays."""
    for name in BYTECODE:
        path = PROJECT_ROOT / name
        if path.is_dir():
            compileall.compile_dir(path, quiet=1)
        else:
            compileall.compile_file(path, quiet=1)


@contextmanager
def compiled_from_source(root: Path) -> Iterator[None]:
    """Imports find no bytecode and write none, as in an installation that was not byte-compiled
    running with PYTHONDONTWRITEBYTECODE=1 (this machine, the Dockerfile): the workflow sandbox then
    compiles the workflow module from source for every workflow run. `make` and the Docker image
    byte-compile the sources (compileall), which the sandbox's imports read."""
    saved = sys.dont_write_bytecode, sys.pycache_prefix
    sys.dont_write_bytecode, sys.pycache_prefix = True, str(root / "no-pycache")
    try:
        yield
    finally:
        sys.dont_write_bytecode, sys.pycache_prefix = saved


@contextmanager
def remote_activities() -> Iterator[None]:
    """The product as it was before local activities: every tool and all bookkeeping run as regular
    activities (the registry says no tool is local; the workflow's local bookkeeping calls are sent
    to a task queue instead). Storing messages stays local, as it has been since it exists."""
    remote = {name: replace(tool, local=False) for name, tool in REGISTRY.items()}
    real_local = temporalio.workflow.execute_local_activity

    def local_or_remote(activity: Any, *args: Any, **options: Any) -> Any:
        if activity == "append_messages":
            return real_local(activity, *args, **options)
        return temporalio.workflow.execute_activity(activity, *args, **options)

    with (
        mock.patch.dict(REGISTRY, remote),
        mock.patch.object(temporalio.workflow, "execute_local_activity", local_or_remote),
    ):
        yield


@contextmanager
def unsandboxed() -> Iterator[None]:
    """`build_worker` with the SDK's UnsandboxedWorkflowRunner instead of the sandbox."""
    with mock.patch.object(worker_module, "sandbox_runner", lambda **_: UnsandboxedWorkflowRunner()):
        yield


def cpu_s(pid: int, children: bool = True) -> float:
    """CPU seconds (user + system) used so far by a process and, by default, its live descendants."""
    try:
        process = psutil.Process(pid)
        family = [process, *(process.children(recursive=True) if children else [])]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for member in family:
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def postmaster_pid(root: Path) -> int:
    """The bench PostgreSQL's postmaster (its data directory is under `root`)."""
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and any(str(root) in arg for arg in cmdline):
            return int(process.info["pid"])
    raise RuntimeError(f"no postgres process with a data directory under {root}")


@dataclass
class Parts:
    """What the workloads talk to: one dev server, the database, the model, a worker's task queue."""

    client: Client
    settings: Settings
    engine: AsyncEngine
    model: ScriptedModelServer
    clock: ActivityClock = field(default_factory=ActivityClock)  # the in-process worker's activities


@asynccontextmanager
async def in_process_worker(parts: Parts, options: Mapping[str, Any]) -> AsyncIterator[Parts]:
    """`worker.build_worker` on a fresh task queue, with extra `Worker` options (the levers tried)."""
    settings = parts.settings.model_copy(update={"task_queue": f"bench-{time.monotonic_ns()}"})
    sessions = session_factory(parts.engine)
    tools = ToolActivities(sessions, rate_limits=UNLIMITED)
    clock = ActivityClock()
    with mock.patch.object(worker_module, "Worker", partial(Worker, **options)):
        built = worker_module.build_worker(parts.client, settings, sessions, tools, [clock])
    async with built:
        yield Parts(parts.client, settings, parts.engine, parts.model, clock)


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


@asynccontextmanager
async def worker_subprocesses(
    settings: Settings, root: Path, count: int = 1, env: Mapping[str, str] | None = None
) -> AsyncIterator[list[int]]:
    """`count` `python worker.py` processes on `settings.task_queue`, rate limits off, each logging
    in its own directory under `root`; yields their pids once all started."""
    async with AsyncExitStack() as scope:
        pids = [
            await scope.enter_async_context(
                devstack_worker.worker_subprocess(
                    settings, root / f"worker-{n}", {**UNLIMITED_ENV, **(env or {})}
                )
            )
            for n in range(count)
        ]
        yield pids


@asynccontextmanager
async def started(name: str, scenario: Scenario) -> AsyncIterator[tuple[Path, Server, Parts]]:
    """PostgreSQL, a dev server and the parts over them (the scripted model answering from
    `scenario`), all in a temporary directory that goes with them: (that directory, server, parts)."""
    byte_compile()
    with tempfile.TemporaryDirectory(prefix=f"countersign-{name}-") as tmp:
        root = Path(tmp)
        async with (
            postgres(root) as url,
            temporal(root, name, ServerSetup()) as server,
            parts(url, server.config, scenario) as found,
        ):
            yield root, server, found
