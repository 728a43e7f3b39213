"""`bench.cost --without` switches guarantees off in the bench's Countersign worker process only (to
measure what each costs): the environment it gives that process, the refusal of an unknown name, and
what bench/without/sitecustomize.py does in a process started as `worker.py` and in any other."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
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


def test_a_switch_whose_target_is_gone_stops_the_worker_naming_it(tmp_path: Path) -> None:
    """A renamed `activities.tools.admit` (here: an `activities` package without it, first on the
    path as the worker's own directory is) must not leave `--without access` measuring nothing."""
    (tmp_path / "activities").mkdir()
    (tmp_path / "activities" / "__init__.py").write_text("")
    (tmp_path / "activities" / "tools.py").write_text("async def chain(): ...\nasync def publish(): ...\n")
    (tmp_path / "worker.py").write_text("print('the worker ran')\n")
    env = {k: v for k, v in os.environ.items() if k != "COUNTERSIGN_BENCH_WITHOUT"} | without_env(["access"])
    env["PYTHONPATH"] = os.pathsep.join((str(WITHOUT_PATH), str(PROJECT_ROOT)))
    done = subprocess.run(
        [sys.executable, "worker.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert "the worker ran" not in done.stdout
    assert done.returncode != 0
    said = "bench.cost --without access: activities.tools.admit is not the function to switch off"
    assert said in done.stderr, done.stderr


def test_a_patch_checks_its_target_is_the_function_it_names() -> None:
    spec = importlib.util.spec_from_file_location("bench_without", WITHOUT_PATH / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    switches = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(switches)  # switches nothing: this process is not worker.py
    owner = types.ModuleType("countersign.db.messages")
    owner.chain = 3  # type: ignore[attr-defined]
    with pytest.raises(SystemExit, match=r"--without chain: countersign\.db\.messages\.chain .*found 3"):
        switches._patch("chain", owner, "chain", print)
    with pytest.raises(SystemExit, match=r"--without events: countersign\.db\.messages\.publish_message"):
        switches._patch("events", owner, "publish_message", print)
    owner.chain = lambda: None  # type: ignore[attr-defined]
    with pytest.raises(SystemExit, match="found <function"):  # a function, but not the one named
        switches._patch("chain", owner, "chain", print)
