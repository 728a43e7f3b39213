"""`countersign health` (the deployment, for an operator) and `countersign healthcheck` (the worker
container's, for compose).

A worker process can be alive and still useless (lost its connection, stuck at startup); both ask
the server which processes poll the task queue. The SDK names a worker `pid@hostname`, and a
container's hostname is its own. `health` also says whether PostgreSQL answers and which circuit
breakers are open (the model endpoint, the SMTP server, each MCP server: read from each worker's
metrics, `countersign_breaker_state`), with how long each still refuses calls.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aiohttp
import click
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

from countersign.cli.app import cli, run
from countersign.cli.conversations import connected
from countersign.cli.ux import reason, with_session
from countersign.runtime.config import read_stack_file

RECENT = timedelta(minutes=2)  # a polling worker renews its long poll about every minute


async def polling(host: str | None = None) -> list[str]:
    """Identities of the workflow pollers on the task queue seen within RECENT (this host's only,
    with `host`)."""
    client, settings = await connected()
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=settings.namespace,
            task_queue=TaskQueue(name=settings.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    now = datetime.now(UTC)
    return [
        p.identity
        for p in response.pollers
        if (host is None or p.identity.endswith(f"@{host}"))
        and now - p.last_access_time.ToDatetime(UTC) < RECENT
    ]


@cli.command(hidden=True)
def healthcheck() -> None:
    """Exit 0 when a worker on this host polls the task queue (the compose worker's healthcheck)."""
    host = socket.gethostname()
    found = run(polling(host))
    if not found:
        raise click.ClickException(f"no worker on {host} has polled the task queue in the last {RECENT}")
    click.echo(f"polling: {', '.join(found)}")


@dataclass(frozen=True)
class Breaker:
    name: str
    state: str  # closed, open, half_open
    retry_in_s: float


def breakers_in(text: str) -> list[Breaker]:
    """The circuit breakers a worker's metrics text reports, by name."""
    states: dict[str, str] = {}
    retry: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.labels.get("breaker")
            if name is None:
                continue
            if sample.name == "countersign_breaker_state" and sample.value == 1:
                states[name] = sample.labels["state"]
            elif sample.name == "countersign_breaker_retry_seconds":
                retry[name] = sample.value
    return [Breaker(name, state, retry.get(name, 0.0)) for name, state in sorted(states.items())]


async def scraped(url: str) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        http.get(url) as response,
    ):
        response.raise_for_status()
        return await response.text()


def breaker_line(breaker: Breaker) -> str:
    if breaker.state == "open":
        return f"{breaker.name} OPEN (calls refused for {breaker.retry_in_s:.0f} s more, then one probe)"
    return f"{breaker.name} {breaker.state.replace('_', '-')}"


async def checked(metrics: list[str]) -> tuple[list[str], bool]:
    """(lines, healthy): PostgreSQL, Temporal and its pollers, each worker's breakers."""
    lines, healthy = [], True
    try:
        await with_session(lambda session: session.execute(text("SELECT 1")))
        lines.append("database: ok")
    except Exception as exc:
        lines.append(f"database: DOWN ({reason(exc)})")
        healthy = False
    try:
        workers = await polling()
        lines.append(
            f"temporal: ok, {len(workers)} worker(s) polling" + (f": {', '.join(workers)}" if workers else "")
        )
        healthy &= bool(workers)
    except Exception as exc:
        lines.append(f"temporal: DOWN ({reason(exc)})")
        healthy = False
    for url in metrics:
        try:
            found = breakers_in(await scraped(url))
        except Exception as exc:
            lines.append(f"breakers ({url}): unknown, the metrics did not answer ({reason(exc)})")
            healthy = False
            continue
        lines.append(f"breakers ({url}): " + (", ".join(breaker_line(b) for b in found) or "none yet"))
        healthy &= all(b.state != "open" for b in found)
    if not metrics:
        lines.append("breakers: no worker metrics to read (COUNTERSIGN_METRICS_PORT, or --metrics URL)")
    return lines, healthy


@cli.command()
@click.option(
    "--metrics",
    "metrics_urls",
    multiple=True,
    help="A worker's metrics URL (repeatable; default: the embedded stack's worker).",
)
def health(metrics_urls: tuple[str, ...]) -> None:
    """Say whether the deployment can serve: PostgreSQL, Temporal with a worker polling, and every
    circuit breaker closed (an open one names what is down and how long calls are refused).
    Exit 0 when all is well, else 1."""
    urls = list(metrics_urls)
    if not urls and (port := read_stack_file().get("metrics_port")):
        urls = [f"http://127.0.0.1:{port}/metrics"]
    lines, healthy = run(checked(urls))
    for line in lines:
        click.echo(line)
    if not healthy:
        raise click.ClickException("not healthy: see above")
