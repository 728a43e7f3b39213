"""`dev up | down | status`: the pure parts (env overrides, process records) directly, and the whole
embedded stack through the real CLI in a subprocess (COUNTERSIGN_DATA_DIR is read at import time)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client

from countersign.devstack import processes, stack
from countersign.devstack.processes import ProcessRecord
from countersign.devstack.temporal import DevServerConfig, temporal_binary
from countersign.runtime.config import PROJECT_ROOT
from countersign.runtime.ports import free_port, port_open, wait_for_port

SEARCH_ATTRIBUTES = {"AgentStatus", "TenantId", "AgentName"}
# Variables that would replace embedded components or move the stack: never inherited by these tests.
STACK_VARS = (
    *stack.OVERRIDES.values(),
    *stack.DEFAULT_PORTS,
    "COUNTERSIGN_DATA_DIR",
    "TEMPORAL_NAMESPACE",
    "TASK_QUEUE",
    "TEMPORAL_UI_URL",
    "SCENARIO",
)


def make_plan(tmp_path: Path, **env: str) -> stack.StackPlan:
    return stack.plan_from_env(env, tmp_path)


def record(**overrides: object) -> ProcessRecord:
    values: dict[str, object] = {
        "address": "127.0.0.1:1",
        "started_by_us": True,
        "pid": 4242,
        "log": "/tmp/x.log",
        "cmd": ("temporal", "server", "start-dev"),
        "create_time": 1000.0,
    }
    values.update(overrides)
    return ProcessRecord(**values)  # type: ignore[arg-type]


# -- env overrides ----------------------------------------------------------------------------------


def test_defaults_are_the_contract_addresses(tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    assert plan.settings() == {
        "temporal_address": "127.0.0.1:7233",
        "namespace": "default",
        "task_queue": "countersign",
        "database_url": "postgresql+asyncpg://postgres@127.0.0.1:55432/countersign",
        "llm_base_url": "http://127.0.0.1:8400/v1",
        "ui_url": "http://127.0.0.1:8233",
        "approver_auth": "names",
        "smtp_host": "127.0.0.1",
        "smtp_port": "8025",
    }
    assert plan.external == {}
    assert plan.scenario.endswith("countersign/scenarios")
    assert plan.stack_file == tmp_path / "stack.json"
    assert plan.temporal().db_file == tmp_path / "temporal.db"
    assert plan.postgres().data_dir == tmp_path / "postgres"


def test_port_variables_move_the_embedded_components(tmp_path: Path) -> None:
    plan = make_plan(
        tmp_path,
        COUNTERSIGN_PG_PORT="1001",
        COUNTERSIGN_TEMPORAL_PORT="1002",
        COUNTERSIGN_UI_PORT="1003",
        COUNTERSIGN_MODEL_PORT="1004",
    )
    assert plan.database_url == "postgresql+asyncpg://postgres@127.0.0.1:1001/countersign"
    assert plan.temporal_address == "127.0.0.1:1002"
    assert plan.ui_url == "http://127.0.0.1:1003"
    assert plan.llm_base_url == "http://127.0.0.1:1004/v1"


def test_contract_variables_replace_components(tmp_path: Path) -> None:
    plan = make_plan(
        tmp_path,
        TEMPORAL_ADDRESS="temporal.internal:7233",
        DATABASE_URL="postgresql+asyncpg://app@db/prod",
        LLM_BASE_URL="https://llm.example/v1",
        TEMPORAL_NAMESPACE="agents",
        TASK_QUEUE="q",
        SCENARIO="/s.yaml",
    )
    assert plan.external == {
        "temporal": "temporal.internal:7233",
        "postgres": "postgresql+asyncpg://app@db/prod",
        "model": "https://llm.example/v1",
    }
    assert plan.settings() == {
        "temporal_address": "temporal.internal:7233",
        "namespace": "agents",
        "task_queue": "q",
        "database_url": "postgresql+asyncpg://app@db/prod",
        "llm_base_url": "https://llm.example/v1",
        "ui_url": "http://temporal.internal:8233",
        "approver_auth": "names",
        "smtp_host": "127.0.0.1",  # the stack's mail catcher (SMTP_HOST unset)
        "smtp_port": "8025",
    }
    assert plan.scenario == "/s.yaml"
    assert make_plan(tmp_path, TEMPORAL_ADDRESS="t:7233", TEMPORAL_UI_URL="https://ui").ui_url == "https://ui"


def test_empty_variables_count_as_unset(tmp_path: Path) -> None:
    assert (
        make_plan(tmp_path, TEMPORAL_ADDRESS="", COUNTERSIGN_PG_PORT="").settings()
        == make_plan(tmp_path).settings()
    )


def this_process() -> ProcessRecord:
    """A live process `dev up` would take for one it started (this test's own)."""
    me = psutil.Process()
    return record(pid=me.pid, cmd=tuple(me.cmdline()), create_time=me.create_time())


def test_the_running_stacks_modes_hold_and_another_is_refused(tmp_path: Path) -> None:
    """`APPROVER_AUTH=signed dev up` on a names-mode stack would reuse its worker and inbox in
    names mode, silently: refused with the fix; unset, the running modes are kept (and recorded)."""
    worker = {"worker": this_process()}
    recorded = {"approver_auth": "names", "metrics_port": "9464"}
    with pytest.raises(stack.StackError, match=r"started with APPROVER_AUTH=names.*`dev down`"):
        stack.with_running_modes(make_plan(tmp_path, APPROVER_AUTH="signed"), recorded, worker)
    with pytest.raises(stack.StackError, match="COUNTERSIGN_METRICS_PORT=9464"):
        stack.with_running_modes(make_plan(tmp_path, COUNTERSIGN_METRICS_PORT="9000"), recorded, worker)
    kept = stack.with_running_modes(make_plan(tmp_path), {**recorded, "approver_auth": "signed"}, worker)
    assert (kept.approver_auth, kept.metrics_url) == ("signed", "http://127.0.0.1:9464/metrics")
    assert kept.settings()["approver_auth"] == "signed" and kept.settings()["metrics_port"] == "9464"
    assert kept.child_env("worker")["COUNTERSIGN_METRICS_PORT"] == "9464"
    assert "COUNTERSIGN_METRICS_PORT" not in kept.child_env("inbox")
    assert kept.child_env("inbox")["APPROVER_AUTH"] == "signed"
    # nothing of the stack runs: the environment decides
    fresh = stack.with_running_modes(make_plan(tmp_path, APPROVER_AUTH="signed"), recorded, {})
    assert (fresh.approver_auth, fresh.metrics_port) == ("signed", None)
    with pytest.raises(
        stack.StackError, match=r"COUNTERSIGN_AUTH \(or APPROVER_AUTH\) must be names or signed"
    ):
        make_plan(tmp_path, APPROVER_AUTH="yes")


@pytest.mark.parametrize("value", ["abc", "0", "70000", "-1"])
def test_a_bad_port_is_a_one_line_reason(tmp_path: Path, value: str) -> None:
    with pytest.raises(stack.StackError, match="COUNTERSIGN_UI_PORT must be a TCP port number"):
        make_plan(tmp_path, COUNTERSIGN_UI_PORT=value)


def test_dev_server_command_registers_the_search_attributes(tmp_path: Path) -> None:
    config = DevServerConfig(port=1, ui_port=2, db_file=tmp_path / "t.db", namespace="agents")
    cmd = " ".join(config.command("temporal"))
    assert cmd.startswith("temporal server start-dev --ip 127.0.0.1 --port 1 --ui-port 2 ")
    assert f"--db-filename {tmp_path / 't.db'}" in cmd
    assert "--namespace agents" in cmd
    for name in SEARCH_ATTRIBUTES:
        assert f"--search-attribute {name}=Keyword" in cmd
    assert "--dynamic-config-value history.transferProcessorMaxPollRPS=1000" in cmd
    assert "--dynamic-config-value system.enableActivityEagerExecution=true" in cmd
    assert "--sqlite-pragma journal_mode=wal" in cmd
    assert (config.address, config.ui_url) == ("127.0.0.1:1", "http://127.0.0.1:2")


# -- process records --------------------------------------------------------------------------------


def test_a_record_matches_only_the_same_process() -> None:
    rec = record()
    assert processes.matches(rec, 1000.0, ["temporal", "server", "start-dev"])
    assert processes.matches(rec, 1000.01, ["temporal", "server", "start-dev"])  # float round trip
    assert not processes.matches(rec, 1001.0, ["temporal", "server", "start-dev"])  # pid reused later
    assert not processes.matches(rec, 1000.0, ["python", "other.py"])
    assert processes.matches(rec, 1000.0, [])  # mid-exec, the kernel shows no command line yet
    assert not processes.matches(record(create_time=None), 1000.0, ["temporal", "server", "start-dev"])


def test_records_survive_json_and_junk_is_ignored() -> None:
    rec = record()
    assert ProcessRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert ProcessRecord.from_json(processes.external("db:5432").to_json()) == processes.external("db:5432")
    assert ProcessRecord.from_json({"pid": 1}) is None
    assert ProcessRecord.from_json({"address": "a", "started_by_us": True, "pid": "x"}) is None


def test_stack_file_round_trip_and_removal(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    settings = make_plan(tmp_path).settings()
    stack.write_stack(path, settings, {"temporal": record(), "bogus": record()})
    data = json.loads(path.read_text())
    assert {k: data[k] for k in settings} == settings
    assert data["processes"]["temporal"]["started_by_us"] is True
    assert stack.read_stack(path) == (settings, {"temporal": record()})  # unknown names are dropped
    stack.write_stack(path, settings, {})
    assert not path.exists()
    path.write_text("[1, 2")
    assert stack.read_stack(path) == ({}, {})


def test_status_and_down_never_touch_a_pid_that_is_not_the_recorded_process(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, LLM_BASE_URL="http://llm/v1")
    me = psutil.Process()
    impostor = record(pid=me.pid, create_time=me.create_time() - 100)  # our pid, another process
    records = {"temporal": impostor, "model": processes.external("http://llm/v1")}
    stack.write_stack(plan.stack_file, plan.settings(), records)
    states = {c.name: (c.state, c.pid) for c in stack.status(plan)}
    assert states == {
        "postgres": ("stopped", None),
        "temporal": ("stopped", None),
        "model": ("external", None),
        "mail": ("stopped", None),
        "worker": ("stopped", None),
        "inbox": ("stopped", None),
    }
    lines: list[str] = []
    stack.down(plan, lines.append)  # would SIGTERM this test run if it trusted the pid
    assert lines == ["model     external, left running (http://llm/v1)", "temporal  not running"]
    assert not plan.stack_file.exists()


async def test_up_refuses_to_hide_a_running_component_of_ours_behind_an_override(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, DATABASE_URL="postgresql+asyncpg://app@db/prod")
    me = psutil.Process()
    ours = record(pid=me.pid, create_time=me.create_time(), cmd=tuple(me.cmdline()))
    stack.write_stack(plan.stack_file, plan.settings(), {"postgres": ours})
    with pytest.raises(stack.StackError, match="run `dev down` before setting DATABASE_URL"):
        await stack.up(plan, print)


def test_spawn_and_stop_a_detached_process(tmp_path: Path) -> None:
    log = tmp_path / "sleep.log"
    cmd = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    rec = processes.spawn(cmd, "nowhere", log, tmp_path)
    assert rec.started_by_us and rec.cmd == tuple(cmd)
    assert rec.pid is not None and rec.create_time is not None
    assert processes.is_running(rec)
    deadline = time.monotonic() + 30
    while "up" not in processes.log_tail(str(log)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes.log_tail(str(log)) == "up"
    assert os.getsid(rec.pid) == rec.pid  # its own session: a Ctrl-C in our terminal does not reach it
    assert not processes.stop(record(pid=rec.pid, create_time=rec.create_time - 100))
    assert processes.is_running(rec)
    assert processes.stop(rec)
    assert not processes.is_running(rec)
    assert not processes.stop(rec)
    with pytest.raises(RuntimeError, match="exited during startup"):
        processes.ensure_alive(rec, "sleeper")


# -- the whole stack, through the CLI ---------------------------------------------------------------


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


async def starter(env: dict[str, str], *args: str) -> Result:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PROJECT_ROOT / "starter.py"),
        *args,
        cwd=PROJECT_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=240)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


async def ok(env: dict[str, str], *args: str) -> str:
    result = await starter(env, *args)
    assert result.returncode == 0, f"{args}: {result.stderr}"
    return result.stdout


@pytest.fixture
def stack_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A clean environment for a stack of our own: temp data dir, free ports. Torn down after."""
    env = {k: v for k, v in os.environ.items() if k not in STACK_VARS}
    env["COUNTERSIGN_DATA_DIR"] = str(tmp_path / "data")
    env.update({name: str(free_port()) for name in stack.DEFAULT_PORTS})
    yield env
    subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "starter.py"), "dev", "down"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )


def recorded_pids(env: dict[str, str]) -> dict[str, int | None]:
    data = json.loads((Path(env["COUNTERSIGN_DATA_DIR"]) / "stack.json").read_text())
    return {name: rec["pid"] for name, rec in data["processes"].items()}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def registered_search_attributes(address: str) -> dict[str, int]:
    client = await Client.connect(address)
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace="default")
    )
    return dict(listed.custom_attributes)


def temporal_db_without_search_attributes(db_file: Path) -> None:
    """What an older build's dev server left behind: a SQLite file without our attributes."""
    port = free_port()
    db_file.parent.mkdir(parents=True)
    cmd = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
    rec = processes.spawn(
        [*cmd, "--headless", "--db-filename", str(db_file)], "", db_file.parent / "old.log", PROJECT_ROOT
    )
    try:
        wait_for_port("127.0.0.1", port, 60, "temporal")
    finally:
        processes.stop(rec)


@pytest.mark.devserver
async def test_up_status_reuse_down_and_resume(stack_env: dict[str, str]) -> None:
    env, data_dir = stack_env, Path(stack_env["COUNTERSIGN_DATA_DIR"])
    await asyncio.to_thread(temporal_db_without_search_attributes, data_dir / "temporal.db")

    first = await ok(env, "dev", "up")
    assert first.count(" started ") == 6, first
    status = json.loads(await ok(env, "dev", "status", "--json"))
    assert status["temporal_address"] == f"127.0.0.1:{env['COUNTERSIGN_TEMPORAL_PORT']}"
    assert status["namespace"] == "default"
    assert status["task_queue"] == "countersign"
    assert (
        status["database_url"]
        == f"postgresql+asyncpg://postgres@127.0.0.1:{env['COUNTERSIGN_PG_PORT']}/countersign"
    )
    assert status["llm_base_url"] == f"http://127.0.0.1:{env['COUNTERSIGN_MODEL_PORT']}/v1"
    assert status["ui_url"] == f"http://127.0.0.1:{env['COUNTERSIGN_UI_PORT']}"
    assert {c["state"] for c in status["components"].values()} == {"running"}
    assert status["approver_auth"] == "names"  # the embedded stack's demo default, labelled
    inbox_url = status["components"]["inbox"]["address"]
    assert inbox_url == f"http://127.0.0.1:{env['COUNTERSIGN_INBOX_PORT']}"
    # the mode of what runs: the deployment's, recorded in its database by `dev up`
    assert status["auth_mode"] == "names"
    assert "auth: COUNTERSIGN_AUTH=names (demo)" in await ok(env, "dev", "status")
    keyword = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
    attributes = await registered_search_attributes(status["temporal_address"])
    assert {name: attributes.get(name) for name in SEARCH_ATTRIBUTES} == dict.fromkeys(
        SEARCH_ATTRIBUTES, keyword
    )
    assert "running" in await ok(env, "dev", "status")
    assert status["components"]["mail"]["address"] == f"127.0.0.1:{env['COUNTERSIGN_MAIL_PORT']}"
    assert "no mail caught yet" in await ok(env, "mail", "list")

    pids = recorded_pids(env)
    second = await ok(env, "dev", "up")
    assert second.count(" reused ") == 6, second
    assert recorded_pids(env) == pids

    assert "stopped" in await ok(env, "dev", "down")
    assert all(gone(pid) for pid in pids.values() if pid is not None)
    assert not (data_dir / "stack.json").exists()
    assert "nothing to stop" in await ok(env, "dev", "down")
    stopped = json.loads(await ok(env, "dev", "status", "--json"))
    assert {c["state"] for c in stopped["components"].values()} == {"stopped"}
    assert (data_dir / "temporal.db").exists() and (data_dir / "postgres" / "pgdata" / "PG_VERSION").exists()

    resumed = await ok(env, "dev", "up")  # on the persisted SQLite file and cluster
    assert resumed.count(" started ") == 6, resumed
    assert SEARCH_ATTRIBUTES <= set(await registered_search_attributes(status["temporal_address"]))
    await ok(env, "dev", "down")


@pytest.mark.devserver
async def test_an_external_temporal_is_used_and_never_stopped(
    stack_env: dict[str, str],
    dev_server: DevServerConfig,
) -> None:
    env = {**stack_env, "TEMPORAL_ADDRESS": dev_server.address}
    output = await ok(env, "dev", "up")
    assert f"temporal  external  {dev_server.address}" in output
    assert f"127.0.0.1:{env['COUNTERSIGN_TEMPORAL_PORT']}" not in output
    status = json.loads(await ok(env, "dev", "status", "--json"))
    assert status["temporal_address"] == dev_server.address
    assert status["components"]["temporal"]["state"] == "external"
    assert status["components"]["worker"]["state"] == "running"

    down = await ok(env, "dev", "down")
    assert f"external, left running ({dev_server.address})" in down
    assert port_open("127.0.0.1", dev_server.port)
    assert SEARCH_ATTRIBUTES <= set(await registered_search_attributes(dev_server.address))


async def test_a_port_taken_by_another_program_is_a_one_line_failure(stack_env: dict[str, str]) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        env = {**stack_env, "COUNTERSIGN_PG_PORT": str(squatter.getsockname()[1])}
        result = await starter(env, "dev", "up")
    assert result.returncode != 0
    reason = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(reason) == 1 and "is taken by a process this stack did not start" in reason[0], result.stderr
    assert "COUNTERSIGN_PG_PORT" in reason[0] and "DATABASE_URL" in reason[0]
    # and a port to move it to, free now: the command works again with it (issue 50)
    moved = re.search(r"export COUNTERSIGN_PG_PORT=(\d+), a port free now, and run it again", reason[0])
    assert moved is not None, reason[0]
    assert not port_open("127.0.0.1", int(moved[1]))


def test_the_model_restarts_for_another_scenario_or_an_edited_one(tmp_path: Path) -> None:
    """`dev up` restarts the scripted model when SCENARIO names something else than it serves, or
    when a file of it changed since the process started; otherwise it is reused."""
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "ops.yaml").write_text("name: ops\nagent: operations\nrules: []\n")
    started = time.time() + 5  # the process "started" after the file was written
    cmd = ("python", "starter.py", "model", "serve", "--scenario", str(scenarios))
    running = ProcessRecord(address="http://x/v1", started_by_us=True, pid=1, cmd=cmd, create_time=started)
    assert stack.scenario_of(running) == str(scenarios)
    assert not stack._scenario_changed(running, str(scenarios))
    assert stack._scenario_changed(running, str(tmp_path / "other.yaml"))
    os.utime(scenarios / "ops.yaml", (started + 1, started + 1))  # edited after the start
    assert stack._scenario_changed(running, str(scenarios))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, str(stack.DEFAULT_SCENARIO)),
        ({"SCENARIO": "/s/mine.yaml"}, "/s/mine.yaml"),
        ({"LLM_BASE_URL": "http://127.0.0.1:1/v1"}, None),  # a real model: no scenario
    ],
)
def test_dev_status_json_names_the_scenario(
    tmp_path: Path, env: dict[str, str], expected: str | None
) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("SCENARIO", "LLM_BASE_URL")}
    done = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "starter.py"), "dev", "status", "--json"],
        env={**base, "COUNTERSIGN_DATA_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout)["scenario"] == expected


def test_a_refused_up_leaves_the_recorded_stack_as_it_was(tmp_path: Path) -> None:
    """`LLM_BASE_URL=… dev up` while the stack's own model runs is refused; before the fix it had
    rewritten stack.json on the way (after postgres and temporal), so `dev status` then reported
    the endpoint it had refused."""
    running = {"model": this_process()}
    stack.write_stack(make_plan(tmp_path).stack_file, {"llm_base_url": "http://127.0.0.1:8400/v1"}, running)
    before = make_plan(tmp_path).stack_file.read_text()
    refused = make_plan(tmp_path, LLM_BASE_URL="https://api.openai.com/v1")
    with pytest.raises(stack.StackError, match="model from an earlier `dev up` still runs"):
        asyncio.run(stack.up(refused, lambda line: None))
    assert refused.stack_file.read_text() == before
