"""`dev up` / `dev down` / `dev status`: the embedded stack, one component after the other.

Components, in start order: PostgreSQL, the Temporal dev server, the scripted model server, a
mail catcher (countersign.devstack.mail: notices and agents' emails are kept, to be read with
`starter.py mail list`), a worker, the server. Each one whose env variable is set (DATABASE_URL,
TEMPORAL_ADDRESS, LLM_BASE_URL, SMTP_HOST) is used as it is and never started nor stopped. `up`
writes `stack.json` after every component, so the worker (which reads its settings from there)
finds every address, and a failed `up` leaves a record `down` can clean up from. `down` stops
only processes recorded as ours and keeps the data.

The stack file also records the modes the worker and the inbox were started in (COUNTERSIGN_AUTH,
the worker's COUNTERSIGN_METRICS_PORT): they hold for the running processes whatever the calling shell
says, so `dev status` reports them, CLI commands follow them, and a `dev up` asking for another
mode while those processes run is refused (reusing them would silently keep the old one).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from countersign.devstack import processes
from countersign.devstack.postgres import EmbeddedPostgres, migrate_and_seed
from countersign.devstack.processes import ProcessRecord
from countersign.devstack.temporal import DevServerConfig, start_dev_server, wait_ready
from countersign.identity.mode import deployment_mode
from countersign.runtime.config import PROJECT_ROOT
from countersign.runtime.ports import free_port, port_open

COMPONENTS = ("postgres", "temporal", "model", "mail", "worker", "inbox")
HOST = "127.0.0.1"
# The env variable that points a component at an existing service (CONTRACT.md).
OVERRIDES = {
    "postgres": "DATABASE_URL",
    "temporal": "TEMPORAL_ADDRESS",
    "model": "LLM_BASE_URL",
    "mail": "SMTP_HOST",
}
DEFAULT_PORTS = {
    "COUNTERSIGN_PG_PORT": 55432,
    "COUNTERSIGN_TEMPORAL_PORT": 7233,
    "COUNTERSIGN_UI_PORT": 8233,
    "COUNTERSIGN_MODEL_PORT": 8400,
    "COUNTERSIGN_INBOX_PORT": 8300,
    "COUNTERSIGN_MAIL_PORT": 8025,
}
# Not one of the stack's listening ports unless set: the worker's Prometheus endpoint.
METRICS_PORT_DEFAULT = 9464
DEFAULT_SCENARIO = PROJECT_ROOT / "countersign" / "scenarios"  # one file per agent
STARTUP_TIMEOUT_S = 60.0
EXTERNAL_TIMEOUT_S = 10.0
WORKER_SETTLE_S = 1.0

STARTED, REUSED, EXTERNAL, RESTARTED = "started", "reused", "external", "restarted"

Echo = Callable[[str], None]


class StackError(RuntimeError):
    """A reason `up` cannot go on, worded for the one line the CLI prints."""


@dataclass(frozen=True)
class StackPlan:
    """What the stack should be, derived from the environment alone (see `plan_from_env`)."""

    data_dir: Path
    namespace: str
    task_queue: str
    ports: Mapping[str, int]  # COUNTERSIGN_*_PORT -> port
    scenario: str
    external: Mapping[str, str]  # component -> address of the service that replaces it
    ui_url_override: str | None = None
    approver_auth: str | None = None  # APPROVER_AUTH as asked (None: the running stack's, else names)
    metrics_port: int | None = None  # COUNTERSIGN_METRICS_PORT of the worker, as asked

    @property
    def stack_file(self) -> Path:
        return self.data_dir / "stack.json"

    def postgres(self) -> EmbeddedPostgres:
        return EmbeddedPostgres(data_dir=self.data_dir / "postgres", port=self.ports["COUNTERSIGN_PG_PORT"])

    def temporal(self) -> DevServerConfig:
        return DevServerConfig(
            port=self.ports["COUNTERSIGN_TEMPORAL_PORT"],
            ui_port=self.ports["COUNTERSIGN_UI_PORT"],
            db_file=self.data_dir / "temporal.db",
            namespace=self.namespace,
            ip=HOST,
        )

    @property
    def database_url(self) -> str:
        return self.external.get("postgres") or self.postgres().url()

    @property
    def temporal_address(self) -> str:
        return self.external.get("temporal") or self.temporal().address

    @property
    def llm_base_url(self) -> str:
        return self.external.get("model") or f"http://{HOST}:{self.ports['COUNTERSIGN_MODEL_PORT']}/v1"

    @property
    def ui_url(self) -> str:
        if self.ui_url_override:
            return self.ui_url_override
        if "temporal" in self.external:  # a dev server elsewhere: its UI is on gRPC port + 1000
            host, _, port = self.temporal_address.rpartition(":")
            return f"http://{host}:{int(port) + 1000}" if port.isdigit() else ""
        return self.temporal().ui_url

    def address(self, component: str) -> str:
        return {
            "postgres": self.database_url,
            "temporal": self.temporal_address,
            "model": self.llm_base_url,
            "mail": self.smtp_address,
            "worker": f"task queue {self.task_queue!r}",
            "inbox": self.inbox_url,
        }[component]

    @property
    def smtp_address(self) -> str:
        return self.external.get("mail") or f"{HOST}:{self.ports['COUNTERSIGN_MAIL_PORT']}"

    @property
    def inbox_url(self) -> str:
        return f"http://{HOST}:{self.ports['COUNTERSIGN_INBOX_PORT']}"

    def port_vars(self, component: str) -> list[str]:
        return {
            "postgres": ["COUNTERSIGN_PG_PORT"],
            "temporal": ["COUNTERSIGN_TEMPORAL_PORT", "COUNTERSIGN_UI_PORT"],
            "model": ["COUNTERSIGN_MODEL_PORT"],
            "mail": ["COUNTERSIGN_MAIL_PORT"],
            "worker": [],
            "inbox": ["COUNTERSIGN_INBOX_PORT"],
        }[component]

    def log(self, component: str) -> Path:
        if component == "postgres":
            return self.postgres().pgdata / "server.log"
        return self.data_dir / "logs" / f"{component}.log"

    @property
    def metrics_url(self) -> str | None:
        return f"http://{HOST}:{self.metrics_port}/metrics" if self.metrics_port else None

    def settings(self) -> dict[str, str]:
        """The stack file's addresses and modes (what `config.load_settings` falls back to)."""
        modes = {"approver_auth": self.approver_auth or "names"}
        if self.metrics_port:
            modes["metrics_port"] = str(self.metrics_port)
        return {
            "temporal_address": self.temporal_address,
            "namespace": self.namespace,
            "task_queue": self.task_queue,
            "database_url": self.database_url,
            "llm_base_url": self.llm_base_url,
            "ui_url": self.ui_url,
            **modes,
            "smtp_host": self.smtp_address.rpartition(":")[0] if "mail" not in self.external else "",
            "smtp_port": self.smtp_address.rpartition(":")[2] if "mail" not in self.external else "",
        }

    def child_env(self, component: str) -> dict[str, str]:
        """The environment of the worker or the inbox: the caller's, with the stack's modes."""
        mode = self.approver_auth or "names"
        env = {**os.environ, "COUNTERSIGN_AUTH": mode, "APPROVER_AUTH": mode}
        env.pop("COUNTERSIGN_METRICS_PORT", None)
        if component == "worker" and self.metrics_port:
            env["COUNTERSIGN_METRICS_PORT"] = str(self.metrics_port)
        return env


def _port(env: Mapping[str, str], name: str) -> int:
    value = (env.get(name) or "").strip() or str(DEFAULT_PORTS.get(name, METRICS_PORT_DEFAULT))
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise StackError(f"{name} must be a TCP port number, not {value!r}")
    return int(value)


def plan_from_env(env: Mapping[str, str], data_dir: Path) -> StackPlan:
    asked = env.get("COUNTERSIGN_AUTH") or env.get("APPROVER_AUTH") or ""  # APPROVER_AUTH: the old name
    approver_auth = asked.strip().lower() or None
    if approver_auth not in (None, "names", "signed"):
        raise StackError(f"COUNTERSIGN_AUTH (or APPROVER_AUTH) must be names or signed, not {asked!r}")
    metrics = env.get("COUNTERSIGN_METRICS_PORT", "").strip()
    return StackPlan(
        data_dir=data_dir,
        namespace=env.get("TEMPORAL_NAMESPACE") or "default",
        task_queue=env.get("TASK_QUEUE") or "countersign",
        ports={name: _port(env, name) for name in DEFAULT_PORTS},
        scenario=env.get("SCENARIO") or str(DEFAULT_SCENARIO),
        external={component: env[var] for component, var in OVERRIDES.items() if env.get(var)},
        ui_url_override=env.get("TEMPORAL_UI_URL") or None,
        approver_auth=approver_auth,
        metrics_port=_port(env, "COUNTERSIGN_METRICS_PORT") if metrics else None,
    )


def with_running_modes(
    plan: StackPlan, recorded: Mapping[str, Any], records: Mapping[str, ProcessRecord]
) -> StackPlan:
    """`plan` with the modes of the worker and inbox that already run, which `up` reuses.

    A mode the environment does not ask for is the running processes' one; a mode it asks for that
    differs from theirs is refused (they would be reused in their old mode, silently).
    """

    def running(*names: str) -> str:
        return ", ".join(
            f"{name} pid {records[name].pid}"
            for name in names
            if name in records and records[name].started_by_us and processes.is_running(records[name])
        )

    def refused(holders: str, was: str, variable: str) -> StackError:
        return StackError(
            f"the running stack ({holders}) was started with {was}; {variable} asks for another: "
            "stop it first (`dev down`, the data stays), then `dev up` again"
        )

    approver_auth, metrics_port = plan.approver_auth, plan.metrics_port
    if holders := running("worker", "inbox"):
        was = str(recorded.get("approver_auth") or "names")
        if approver_auth not in (None, was):
            raise refused(holders, f"APPROVER_AUTH={was}", "APPROVER_AUTH")
        approver_auth = was
    if holders := running("worker"):
        port = str(recorded.get("metrics_port") or "")
        was_port = int(port) if port.isdigit() else None
        if metrics_port not in (None, was_port):
            raise refused(
                holders, f"COUNTERSIGN_METRICS_PORT={was_port or '(unset)'}", "COUNTERSIGN_METRICS_PORT"
            )
        metrics_port = was_port
    return dataclasses.replace(plan, approver_auth=approver_auth, metrics_port=metrics_port)


# -- the stack file -------------------------------------------------------------------------------


def read_stack(path: Path) -> tuple[dict[str, Any], dict[str, ProcessRecord]]:
    """The stack file's top-level values and its process records (both empty when there is none)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}, {}
    if not isinstance(data, dict):
        return {}, {}
    raw = data.pop("processes", None)
    raw = raw if isinstance(raw, dict) else {}
    records = {
        name: ProcessRecord.from_json(raw[name]) for name in COMPONENTS if isinstance(raw.get(name), dict)
    }
    return data, {name: record for name, record in records.items() if record is not None}


def write_stack(path: Path, settings: Mapping[str, Any], records: Mapping[str, ProcessRecord]) -> None:
    """Replace the stack file atomically (the worker may be reading it); no records, no file."""
    if not records:
        path.unlink(missing_ok=True)
        return
    document = {**settings, "processes": {name: record.to_json() for name, record in records.items()}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, path)


# -- up ---------------------------------------------------------------------------------------------

Step = Callable[[StackPlan, ProcessRecord | None], Awaitable[tuple[ProcessRecord, str]]]


async def up(plan: StackPlan, echo: Echo) -> None:
    plan.data_dir.mkdir(parents=True, exist_ok=True)
    recorded, records = read_stack(plan.stack_file)
    plan = with_running_modes(plan, recorded, records)
    steps: dict[str, Step] = {
        "postgres": _postgres,
        "temporal": _temporal,
        "model": _model,
        "mail": _mail,
        "worker": _worker,
        "inbox": _inbox,
    }
    for name in steps:  # before anything starts or is recorded: a refused `up` changes nothing
        _check_not_replaced(name, records.get(name), plan)
    for name, step in steps.items():
        record, outcome = await step(plan, records.get(name))
        records[name] = record
        if name == "postgres" and plan.approver_auth is None:
            # not asked: the worker and the server run the deployment's mode (`dev up` asked for one
            # records it there), so a worker is never started in a mode that it would refuse
            plan = dataclasses.replace(plan, approver_auth=await deployment_mode(plan.database_url))
        write_stack(plan.stack_file, plan.settings(), records)
        pid = f"  pid {record.pid}" if record.pid else ""
        served = scenario_of(record) if name == "model" else None
        scenario = f"  scenario {_in_project(served)}" if served else ""
        echo(f"{name:<9} {outcome:<9} {record.address}{pid}{scenario}")
    echo(f"Web UI: {plan.ui_url}")


async def _postgres(plan: StackPlan, previous: ProcessRecord | None) -> tuple[ProcessRecord, str]:
    if "postgres" in plan.external:
        record, outcome = processes.external(plan.database_url), EXTERNAL
    else:
        record, outcome = await asyncio.to_thread(_start_postgres, plan)
    await migrate_and_seed(plan.database_url)
    return record, outcome


def _start_postgres(plan: StackPlan) -> tuple[ProcessRecord, str]:
    """Our cluster, started unless its postmaster already runs (whatever `stack.json` says)."""
    pg = plan.postgres()
    running = _our_postmaster(pg)
    if running is not None:
        _check_address("postgres", running, plan)
    else:
        _check_ports_free("postgres", plan)
    pg.start()  # idempotent: also creates the database when missing
    record = _our_postmaster(pg)
    if record is None:
        raise StackError(f"PostgreSQL started but left no live postmaster.pid in {pg.pgdata}")
    return record, REUSED if running is not None else STARTED


def _our_postmaster(pg: EmbeddedPostgres) -> ProcessRecord | None:
    """The live postmaster of `pg`'s cluster, from its postmaster.pid (pid, …, port on line 4)."""
    try:
        lines = (pg.pgdata / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
        record = processes.adopt(
            pid, EmbeddedPostgres(pg.data_dir, port, pg.host).url(), pg.pgdata / "server.log"
        )
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    # A stale postmaster.pid may name a pid that now belongs to another program.
    return record if record.cmd and Path(record.cmd[0]).name == "postgres" else None


async def _temporal(plan: StackPlan, previous: ProcessRecord | None) -> tuple[ProcessRecord, str]:
    if "temporal" in plan.external:
        await wait_ready(plan.temporal_address, plan.namespace, EXTERNAL_TIMEOUT_S)
        return processes.external(plan.temporal_address), EXTERNAL
    record, outcome = _reuse_or_spawn(
        "temporal",
        plan,
        previous,
        lambda: start_dev_server(plan.temporal(), plan.log("temporal"), PROJECT_ROOT),
    )
    with _stop_on_failure(record, outcome):
        await wait_ready(plan.temporal_address, plan.namespace, STARTUP_TIMEOUT_S, record)
    return record, outcome


async def _model(plan: StackPlan, previous: ProcessRecord | None) -> tuple[ProcessRecord, str]:
    if "model" in plan.external:
        return processes.external(plan.llm_base_url), EXTERNAL
    port = plan.ports["COUNTERSIGN_MODEL_PORT"]
    cmd = [sys.executable, str(PROJECT_ROOT / "starter.py"), "model", "serve", "--scenario", plan.scenario]
    # The server reads its scenario once: another SCENARIO, or an edited file, needs a restart.
    restart = previous is not None and previous.started_by_us and processes.is_running(previous)
    restart = restart and previous is not None and _scenario_changed(previous, plan.scenario)
    if restart and previous is not None:
        processes.stop(previous)
    record, outcome = _reuse_or_spawn(
        "model",
        plan,
        previous,
        lambda: processes.spawn(
            [*cmd, "--port", str(port)], plan.llm_base_url, plan.log("model"), PROJECT_ROOT
        ),
    )
    with _stop_on_failure(record, outcome):
        await _wait_listening(record, port, "the scripted model server")
    return record, RESTARTED if restart else outcome


def _in_project(path: str) -> str:
    """A path inside the project as the documentation writes it (`countersign/scenarios`)."""
    with contextlib.suppress(ValueError):
        return str(Path(path).resolve().relative_to(PROJECT_ROOT))
    return path


def scenario_of(record: ProcessRecord) -> str | None:
    """The scenario a scripted model process serves (its `--scenario` argument)."""
    cmd = list(record.cmd)
    return cmd[cmd.index("--scenario") + 1] if "--scenario" in cmd[:-1] else None


def _scenario_changed(running: ProcessRecord, wanted: str) -> bool:
    """Another SCENARIO than the running server's, or one of its files edited since it started."""
    current = scenario_of(running)
    if current is None or Path(current).resolve() != Path(wanted).resolve():
        return True
    path = Path(wanted)
    files = [p for p in path.iterdir() if p.is_file()] if path.is_dir() else [path]
    with contextlib.suppress(OSError):
        return any(f.stat().st_mtime > (running.create_time or 0) for f in [path, *files])
    return True


async def _mail(plan: StackPlan, previous: ProcessRecord | None) -> tuple[ProcessRecord, str]:
    """The mail catcher (`starter.py mail serve`), unless SMTP_HOST names a mail server to use."""
    if "mail" in plan.external:
        return processes.external(plan.smtp_address), EXTERNAL
    return await _served(
        plan, previous, "mail", "COUNTERSIGN_MAIL_PORT", plan.smtp_address, "the mail catcher"
    )


async def _worker(plan: StackPlan, previous: ProcessRecord | None) -> tuple[ProcessRecord, str]:
    log = plan.log("worker")
    offset = log.stat().st_size if log.exists() else 0
    cmd = [sys.executable, str(PROJECT_ROOT / "worker.py")]

    def spawn() -> ProcessRecord:
        if plan.metrics_port and port_open(HOST, plan.metrics_port):
            raise StackError(
                f"worker: metrics port {plan.metrics_port} is taken by another process "
                f"(free it, or {another_port('COUNTERSIGN_METRICS_PORT')})"
            )
        return processes.spawn(cmd, plan.address("worker"), log, PROJECT_ROOT, plan.child_env("worker"))

    record, outcome = _reuse_or_spawn("worker", plan, previous, spawn)
    if outcome == STARTED:
        with _stop_on_failure(record, outcome):
            await _wait_worker(record, log, offset)
    return record, outcome


async def _inbox(plan: StackPlan, previous: ProcessRecord | None) -> tuple[ProcessRecord, str]:
    """The reviewers' inbox (`starter.py inbox serve`); it reads the stack file like the worker."""
    return await _served(
        plan,
        previous,
        "inbox",
        "COUNTERSIGN_INBOX_PORT",
        plan.inbox_url,
        "the inbox",
        plan.child_env("inbox"),
    )


async def _served(
    plan: StackPlan,
    previous: ProcessRecord | None,
    command: str,
    port_name: str,
    address: str,
    what: str,
    env: Mapping[str, str] | None = None,
) -> tuple[ProcessRecord, str]:
    """`starter.py COMMAND serve` on the plan's port `port_name` (the one still running from an earlier
    `dev up` when it is ours), once it listens; `env` replaces the inherited environment."""
    port = plan.ports[port_name]
    cmd = [sys.executable, str(PROJECT_ROOT / "starter.py"), command, "serve", "--port", str(port)]
    record, outcome = _reuse_or_spawn(
        command, plan, previous, lambda: processes.spawn(cmd, address, plan.log(command), PROJECT_ROOT, env)
    )
    with _stop_on_failure(record, outcome):
        await _wait_listening(record, port, what)
    return record, outcome


def _reuse_or_spawn(
    name: str, plan: StackPlan, previous: ProcessRecord | None, spawn: Callable[[], ProcessRecord]
) -> tuple[ProcessRecord, str]:
    if previous is not None and previous.started_by_us and processes.is_running(previous):
        _check_address(name, previous, plan)
        return previous, REUSED
    _check_ports_free(name, plan)
    return spawn(), STARTED


def _check_not_replaced(name: str, previous: ProcessRecord | None, plan: StackPlan) -> None:
    """Recording an external service over a process of ours would leave that process unstoppable."""
    if (
        name in plan.external
        and previous is not None
        and previous.started_by_us
        and processes.is_running(previous)
    ):
        raise StackError(
            f"{name} from an earlier `dev up` still runs at {previous.address}; "
            f"run `dev down` before setting {OVERRIDES[name]}"
        )


def _check_address(name: str, running: ProcessRecord, plan: StackPlan) -> None:
    wanted = plan.address(name)
    if running.address != wanted:
        raise StackError(
            f"{name} already runs at {running.address}; run `dev down` first to move it to {wanted}"
        )


def another_port(var: str) -> str:
    """How to move a part of the stack off a taken port: its variable, set to a port free now."""
    return f"export {var}={free_port(HOST)}, a port free now, and run it again"


def _check_ports_free(name: str, plan: StackPlan) -> None:
    for var in plan.port_vars(name):
        port = plan.ports[var]
        if port_open(HOST, port):
            instead = f", or set {OVERRIDES[name]} to use that service" if name in OVERRIDES else ""
            raise StackError(
                f"{name}: port {port} on {HOST} is taken by a process this stack did not start "
                f"(free it, or {another_port(var)}{instead})"
            )


@contextlib.contextmanager
def _stop_on_failure(record: ProcessRecord, outcome: str) -> Iterator[None]:
    """A process we just started but that never became ready is stopped, not left behind unrecorded."""
    try:
        yield
    except BaseException:
        if outcome == STARTED:
            processes.stop(record)
        raise


async def _wait_listening(record: ProcessRecord, port: int, what: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not port_open(HOST, port):
        processes.ensure_alive(record, what)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not listen on {HOST}:{port} within {STARTUP_TIMEOUT_S:.0f}s")
        await asyncio.sleep(0.1)


async def _wait_worker(record: ProcessRecord, log: Path, offset: int) -> None:
    """A worker has no port: it counts as ready when it is still alive after a moment, without a traceback."""
    deadline = time.monotonic() + WORKER_SETTLE_S
    while time.monotonic() < deadline:
        processes.ensure_alive(record, "the worker")
        await asyncio.sleep(0.1)
    processes.ensure_alive(record, "the worker")
    with log.open("rb") as f:
        f.seek(offset)
        if b"Traceback" in f.read():
            raise StackError(
                f"the worker logged a traceback at startup (see {log}): {processes.log_tail(str(log))}"
            )


# -- down and status ---------------------------------------------------------------------------------


def down(plan: StackPlan, echo: Echo) -> None:
    """Stop what `up` started, worker first; external services and all data are left alone."""
    settings, records = read_stack(plan.stack_file)
    if not records:
        echo("nothing to stop: no stack is recorded")
    for name in reversed(COMPONENTS):
        record = records.get(name)
        if record is None:
            continue
        echo(f"{name:<9} {_stop(name, record, plan)}")
        del records[name]
        write_stack(plan.stack_file, settings, records)


def _stop(name: str, record: ProcessRecord, plan: StackPlan) -> str:
    if not record.started_by_us:
        return f"external, left running ({record.address})"
    if not processes.is_running(record):
        return "not running"
    if name == "postgres":
        plan.postgres().stop()  # pg_ctl stop -D: a clean shutdown of exactly this cluster
    else:
        processes.stop(record)
    return f"stopped (pid {record.pid})"


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    state: str  # running | stopped | external
    pid: int | None
    address: str
    log: str | None

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "pid": self.pid, "address": self.address, "log": self.log}


def status(plan: StackPlan) -> list[ComponentStatus]:
    _, records = read_stack(plan.stack_file)
    return [_component_status(name, records.get(name), plan) for name in COMPONENTS]


def _component_status(name: str, record: ProcessRecord | None, plan: StackPlan) -> ComponentStatus:
    if name in plan.external:
        return ComponentStatus(name, EXTERNAL, None, plan.address(name), None)
    if record is not None and not record.started_by_us:
        return ComponentStatus(name, EXTERNAL, None, record.address, None)
    if record is not None and processes.is_running(record):
        return ComponentStatus(name, "running", record.pid, record.address, record.log)
    return ComponentStatus(name, "stopped", None, plan.address(name), str(plan.log(name)))
