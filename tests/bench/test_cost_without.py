"""`bench.cost --without` switches guarantees off in the bench's Countersign worker process only (to
measure what each costs): the environment it gives that process, the refusal of an unknown name, and
what bench/without/sitecustomize.py does in a process started as `worker.py` and in any other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cost import WITHOUT_PATH, main, without_env
from countersign.runtime.config import PROJECT_ROOT

PROBE = """
import activities.tools as tools, countersign.runtime.sandbox as sandbox
from sqlalchemy.ext.asyncio import AsyncSession
named = tools.admit, tools.chain, AsyncSession.begin_nested, sandbox.sandbox_runner
print(*(f.__name__ for f in named))
"""


def probe(tmp_path: Path, script: str, without: list[str]) -> list[str]:
    path = tmp_path / script
    path.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "COUNTERSIGN_BENCH_WITHOUT"} | without_env(without)
    done = subprocess.run(
        [sys.executable, str(path)], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_worker_gets_the_switches_and_stream_is_its_setting() -> None:
    env = without_env(["chain", "stream"])
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(WITHOUT_PATH)
    assert env["COUNTERSIGN_BENCH_WITHOUT"] == "chain,stream"
    assert env["LLM_STREAM"] == "false"
    assert without_env([]) == {}


def test_an_unknown_guarantee_is_refused_before_anything_runs() -> None:
    with pytest.raises(SystemExit, match="no guarantee named audit"):
        main(["--without", "chain,audit"])


def test_only_a_process_started_as_worker_py_is_switched(tmp_path: Path) -> None:
    switched = probe(tmp_path, "worker.py", ["access", "chain", "savepoint", "sandbox"])
    assert switched == ["_nothing", "_nothing", "_no_savepoint", "<lambda>"]
    untouched = probe(tmp_path, "other.py", ["access", "chain", "savepoint", "sandbox"])
    assert untouched == ["admit", "chain", "begin_nested", "sandbox_runner"]
