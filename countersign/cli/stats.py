"""`starter.py stats`: the audit summarised per tool and per agent (countersign.observability.stats)."""

from __future__ import annotations

from datetime import UTC, datetime

import click
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.records import table, with_session
from countersign.observability.stats import Stats, collect, parse_duration, render


@cli.command()
@click.option("--tenant", help="One tenant's calls (default: every tenant).")
@click.option("--since", default="24h", show_default=True, help="Window: 90s, 30m, 24h, 7d, 1h30m.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def stats(tenant: str | None, since: str, as_json: bool) -> None:
    """Per tool: calls, success rate, mean and p95 duration, needs rate, outcomes, error codes.
    Per agent: turns, tokens, tool calls, approvals requested / approved / rejected / expired."""
    try:
        window = parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    start = datetime.now(UTC) - window

    async def summary(session: AsyncSession) -> Stats:
        return await collect(session, start, tenant)

    result = run(with_session(summary))
    if as_json:
        print_json(result.to_json())
        return
    scope = f"tenant {tenant}" if tenant else "all tenants"
    click.echo(f"since {start:%Y-%m-%d %H:%M:%S} UTC ({since}), {scope}")
    for rows in render(result):
        click.echo("\n" + (table(rows) if len(rows) > 1 else f"{rows[0][0].lower()}s: none"))
