"""A benchmark ended by SIGTERM or SIGHUP (`timeout`, `kill`, a closed terminal) stops what it started.

The parts a run starts (dev servers, PostgreSQL, worker processes) each run in a session of their
own, so only the run's own way out stops them. Here the run starts a detached process as bench.stack
starts the dev server (`processes.spawn`, stopped in a `finally`) and is signalled while it works.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from countersign.runtime.config import PROJECT_ROOT

RUN = """
import asyncio, sys
from pathlib import Path
from bench.sections import recorded_run
from countersign.devstack import processes

async def measure():
    root = Path(sys.argv[1])
    record = processes.spawn(["sleep", "600"], "a part", root / "part.log", root)
    try:
        print(record.pid, flush=True)
        await asyncio.sleep(600)
    finally:
        await asyncio.to_thread(processes.stop, record)
    return {}

recorded_run("bench.test", [], measure())
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signalled_run_stops_the_parts_it_started(tmp_path: Path, signum: signal.Signals) -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", RUN, str(tmp_path)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    part = psutil.Process(int(run.stdout.readline()))
    try:
        run.send_signal(signum)
        _, err = run.communicate(timeout=30)
        assert run.returncode == 128 + signum, err
        assert f"interrupted by {signum.name}" in err
        assert not part.is_running() or part.status() == psutil.STATUS_ZOMBIE
    finally:
        run.kill()
        if part.is_running():
            part.kill()
