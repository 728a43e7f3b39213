"""`python worker.py` as a child process, configured by its environment alone.

The benchmark measures such a worker and the fault-injection tests kill one (SIGKILL) and start
another: both need a worker that is a real separate process, with every address passed in the
environment so that no `.data/stack.json` of a developer's `dev up` is consulted.

    async with worker_subprocess(settings, data_dir) as pid:
        ...                                  # the worker polls settings.task_queue

    worker = WorkerProcess(settings, data_dir)
    await worker.start()
    worker.kill()                            # SIGKILL: no graceful shutdown, activities lost
    await worker.start()                     # a new process on the same task queue
    worker.stop()                            # SIGTERM (then SIGKILL) and reaped; idempotent
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from countersign.devstack import processes
from countersign.devstack.processes import ProcessRecord
from countersign.runtime.config import PROJECT_ROOT, Settings

WORKER_SCRIPT = PROJECT_ROOT / "worker.py"
STARTED_LINE = "worker started"  # worker.py logs it once connected to Temporal and PostgreSQL
READY_TIMEOUT_S = 60.0


def worker_env(settings: Settings, data_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of `python worker.py`: every address and setting of `settings`, a data
    directory of its own (so no `stack.json` is consulted), then `extra` (e.g. RATE_LIMIT_PER_S)."""
    if not settings.database_url or not settings.llm_base_url:
        raise ValueError("a worker subprocess needs settings.database_url and settings.llm_base_url")
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": settings.temporal_address,
        "TEMPORAL_NAMESPACE": settings.namespace,
        "TASK_QUEUE": settings.task_queue,
        "DATABASE_URL": settings.database_url,
        "LLM_BASE_URL": settings.llm_base_url,
        "LLM_API_KEY": settings.llm_api_key,
        "LLM_MODEL": settings.llm_model,
        "SMTP_HOST": settings.smtp_host,
        "SMTP_PORT": str(settings.smtp_port),
        "SMTP_SENDER": settings.smtp_sender,
        "EMAIL_DELIVERY_DELAY_S": f"{settings.email_delivery_delay_s:g}",
        "COUNTERSIGN_DATA_DIR": str(data_dir),
        **(extra or {}),
    }


class WorkerProcess:
    """One `python worker.py` at a time on `settings.task_queue`, logging to `data_dir`.

    `start` spawns a process and waits until it logged that it started; `kill` ends it with SIGKILL
    (what a crashed host or the OOM killer does); `stop` ends it gracefully. Every process started
    is reaped, so none is left behind as a zombie or an orphan.
    """

    def __init__(
        self,
        settings: Settings,
        data_dir: Path,
        extra_env: Mapping[str, str] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        program: Sequence[str] = (str(WORKER_SCRIPT),),
    ) -> None:
        """`program`: what the interpreter runs (the benchmark's loops: `-m bench.bare` and the like),
        a worker that logs STARTED_LINE once it polls."""
        self.settings = settings
        self.data_dir = data_dir
        self.log = data_dir / f"worker-{settings.task_queue}.log"
        self.starts = 0
        self._env = worker_env(settings, data_dir, extra_env)
        self._ready_timeout_s = ready_timeout_s
        self._program = tuple(program)
        self._child: subprocess.Popen[bytes] | None = None
        self._record: ProcessRecord | None = None

    @property
    def pid(self) -> int:
        if self._child is None:
            raise RuntimeError("the worker is not running")
        return self._child.pid

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    async def start(self) -> int:
        """Spawn a worker (none may be running) and wait until it started; returns its pid."""
        if self.running:
            raise RuntimeError(f"a worker already runs (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0
        self._child = self._spawn()
        self.starts += 1
        self._record = processes.adopt(self._child.pid, f"task queue {self.settings.task_queue!r}", self.log)
        try:
            await self._wait_started(offset)
        except BaseException:
            self.stop()
            raise
        return self._child.pid

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, *self._program],
                cwd=PROJECT_ROOT,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def _wait_started(self, offset: int) -> None:
        assert self._record is not None
        deadline = time.monotonic() + self._ready_timeout_s
        while STARTED_LINE not in self._log_since(offset):
            processes.ensure_alive(self._record, "the worker")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the worker did not log {STARTED_LINE!r} within {self._ready_timeout_s:.0f}s "
                    f"(see {self.log})"
                )
            await asyncio.sleep(0.1)

    def _log_since(self, offset: int) -> str:
        with self.log.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL the worker and reap it: no shutdown, no activity completion, nothing flushed."""
        if self._child is None:
            return
        if self._child.poll() is None:
            os.kill(self._child.pid, signal.SIGKILL)
        self._child.wait(timeout=10)
        self._child = self._record = None

    def stop(self) -> None:
        """SIGTERM the worker (SIGKILL if it lingers) and reap it. Does nothing when none runs."""
        if self._child is None:
            return
        if self._record is not None:
            processes.stop(self._record)
        if self._child.poll() is None:
            self._child.kill()
        self._child.wait(timeout=10)
        self._child = self._record = None


@asynccontextmanager
async def worker_subprocess(
    settings: Settings, data_dir: Path, extra_env: Mapping[str, str] | None = None
) -> AsyncIterator[int]:
    """`python worker.py` on `settings.task_queue` for the block; yields its pid once it started."""
    worker = WorkerProcess(settings, data_dir, extra_env)
    try:
        yield await worker.start()
    finally:
        await asyncio.to_thread(worker.stop)
