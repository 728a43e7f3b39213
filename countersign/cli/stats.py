"""`starter.py stats`: the audit summarised per tool and per agent (countersign.observability.stats)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime

import click
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.approvals import pending_approvals
from countersign.cli.records import table
from countersign.cli.ux import stack_down, with_session
from countersign.client.temporal_client import connect
from countersign.observability.stats import Stats, collect, parse_duration, render
from countersign.runtime.config import load_settings

PENDING_TIMEOUT_S = 10.0


async def pending_by_agent(tenant: str | None) -> dict[str, int] | None:
    """Approvals waiting now, per agent, from the running conversations; None when Temporal is
    not there to ask (the audit holds only decided calls)."""
    if stack_down("temporal", "TEMPORAL_ADDRESS"):
        return None
    try:
        client = await asyncio.wait_for(connect(load_settings()), PENDING_TIMEOUT_S)
        rows = await asyncio.wait_for(pending_approvals(client, tenant), PENDING_TIMEOUT_S)
    except (OSError, RuntimeError, TimeoutError):
        return None
    return dict(Counter(str(r["agent"]) for r in rows))


@cli.command()
@click.option("--tenant", help="One tenant's calls (default: every tenant).")
@click.option("--since", default="24h", show_default=True, help="Window: 90s, 30m, 24h, 7d, 1h30m.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def stats(tenant: str | None, since: str, as_json: bool) -> None:
    """Per tool: calls, success rate, mean and p95 duration, needs rate, outcomes, error codes.
    Per agent: turns, tokens, tool calls, approvals requested (pending included) / pending /
    approved / rejected / expired. SUCCESS leaves out calls a reviewer rejected or let expire."""
    try:
        window = parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    start = datetime.now(UTC) - window

    async def summary(session: AsyncSession) -> Stats:
        return await collect(session, start, tenant, await pending_by_agent(tenant))

    result = run(with_session(summary))
    if as_json:
        print_json(result.to_json())
        return
    scope = f"tenant {tenant}" if tenant else "all tenants"
    click.echo(f"since {start:%Y-%m-%d %H:%M:%S} UTC ({since}), {scope}")
    for rows in render(result):
        click.echo("\n" + (table(rows) if len(rows) > 1 else f"{rows[0][0].lower()}s: none"))
