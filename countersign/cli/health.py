"""`countersign healthcheck`: the worker container's health, as Temporal sees it.

A worker process can be alive and still useless (lost its connection, stuck at startup); this asks
the server which processes poll the task queue, and passes only when one on this host has done so
recently. The SDK names a worker `pid@hostname`, and a container's hostname is its own.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

import click
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

from countersign.cli.app import cli, run
from countersign.cli.conversations import connected

RECENT = timedelta(minutes=2)  # a polling worker renews its long poll about every minute


async def polling_here(host: str) -> list[str]:
    """Identities of this host's workflow pollers on the task queue seen within RECENT."""
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
        if p.identity.endswith(f"@{host}") and now - p.last_access_time.ToDatetime(UTC) < RECENT
    ]


@cli.command(hidden=True)
def healthcheck() -> None:
    """Exit 0 when a worker on this host polls the task queue (the compose worker's healthcheck)."""
    host = socket.gethostname()
    found = run(polling_here(host))
    if not found:
        raise click.ClickException(f"no worker on {host} has polled the task queue in the last {RECENT}")
    click.echo(f"polling: {', '.join(found)}")
