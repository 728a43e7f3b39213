"""Detached processes of the embedded stack and the records that let `dev down` stop exactly them.

A pid alone is not an identity: once a process exits its pid can be reused by anything. A record
therefore keeps the process's creation time and command line too, and a pid is only signalled when
the live process still has both.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# psutil derives creation times from boot time and clock ticks: stable for one process, but compared
# with a little slack so a float round trip through JSON never matters.
CREATE_TIME_SLACK_S = 0.05


@dataclass(frozen=True)
class ProcessRecord:
    """One component of the stack: a process we started (or adopted), or an external service."""

    address: str
    started_by_us: bool
    pid: int | None = None
    log: str | None = None
    cmd: tuple[str, ...] = ()
    create_time: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "started_by_us": self.started_by_us,
            "address": self.address,
            "log": self.log,
            "cmd": list(self.cmd),
            "create_time": self.create_time,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord | None:
        """The record, or None when `data` is not one (a hand-edited or older stack file)."""
        try:
            return cls(
                address=str(data["address"]),
                started_by_us=bool(data["started_by_us"]),
                pid=None if data.get("pid") is None else int(data["pid"]),
                log=data.get("log"),
                cmd=tuple(str(part) for part in data.get("cmd") or ()),
                create_time=None if data.get("create_time") is None else float(data["create_time"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


def external(address: str) -> ProcessRecord:
    return ProcessRecord(address=address, started_by_us=False)


def matches(record: ProcessRecord, create_time: float, cmdline: Sequence[str]) -> bool:
    """Whether a live process with this creation time and command line is the recorded one."""
    if record.create_time is None or abs(create_time - record.create_time) > CREATE_TIME_SLACK_S:
        return False
    # Between exec and the new image's setup the kernel shows an empty command line: the creation
    # time alone then decides (a pid is not reused within the same clock tick).
    return not record.cmd or not cmdline or tuple(cmdline) == record.cmd


def find_process(record: ProcessRecord) -> psutil.Process | None:
    """The live process the record describes, or None (exited, pid reused, or not ours to see)."""
    if record.pid is None:
        return None
    try:
        proc = psutil.Process(record.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc if matches(record, proc.create_time(), proc.cmdline()) else None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_running(record: ProcessRecord) -> bool:
    return find_process(record) is not None


def adopt(pid: int, address: str, log: Path | None) -> ProcessRecord:
    """Record a process started on our behalf by another program (e.g. `pg_ctl start`)."""
    proc = psutil.Process(pid)
    return ProcessRecord(
        address=address,
        started_by_us=True,
        pid=pid,
        log=None if log is None else str(log),
        cmd=tuple(proc.cmdline()),
        create_time=proc.create_time(),
    )


def spawn(
    cmd: Sequence[str], address: str, log: Path, cwd: Path, env: Mapping[str, str] | None = None
) -> ProcessRecord:
    """Start `cmd` detached from this process (its own session), appending its output to `log`;
    `env` replaces the inherited environment."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        child = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ProcessRecord(
        address=address,
        started_by_us=True,
        pid=child.pid,
        log=str(log),
        cmd=tuple(cmd),
        create_time=psutil.Process(child.pid).create_time(),
    )


def stop(record: ProcessRecord, timeout_s: float = 10) -> bool:
    """SIGTERM the recorded process and its children, SIGKILL what outlives `timeout_s`.

    Returns False (and signals nothing) when the recorded process is no longer running.
    """
    proc = find_process(record)
    if proc is None:
        return False
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    alive = wait_exited(procs, timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    wait_exited(alive, 5)
    return True


def wait_exited(procs: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each process has exited; return those still running after `timeout_s`.

    A process that has exited but was not reaped (a zombie) counts as exited. The stack's processes
    outlive the `dev up` that started them, so their parent is init; where init does not reap (some
    containers and VMs) they stay zombies, and `psutil.wait_procs` waits out its back-off on each.
    """
    deadline = time.monotonic() + timeout_s
    alive = list(procs)
    while True:
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def log_tail(log: str | None, lines: int = 3) -> str:
    """The last non-empty lines of a log, joined on one line (for one-line error messages)."""
    if log is None:
        return ""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return ""
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail)


def ensure_alive(record: ProcessRecord, what: str) -> None:
    """Raise a one-line reason (with the end of its log) when a process we started has exited."""
    if not is_running(record):
        tail = log_tail(record.log)
        raise RuntimeError(f"{what} exited during startup (see {record.log}){': ' + tail if tail else ''}")
