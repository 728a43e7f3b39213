"""Commands that read and change the database directly: `audit` and `permissions`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.config import load_settings
from countersign.db import schema
from countersign.db.engine import create_engine, session_factory
from countersign.db.schema import TIERS, AgentProfile, AgentToolPermission, ToolExecution
from countersign.store import ContextPolicy, describe_policy

T = TypeVar("T")
AUDIT_COLUMNS = (
    "created_at",
    "tenant_id",
    "workflow_id",
    "call_id",
    "tool",
    "outcome",
    "approved_by",
    "rolled_back",
)


async def with_session(work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    url = load_settings().database_url
    if not url:
        raise click.ClickException("no DATABASE_URL: run `python starter.py dev up` or set DATABASE_URL")
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        async with session_factory(engine)() as session, session.begin():
            return await work(session)
    finally:
        await engine.dispose()


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


@cli.command()
@click.option("--workflow", "workflow_id", help="One conversation's calls.")
@click.option("--tenant", help="One tenant's calls.")
@click.option("--limit", default=100, show_default=True, help="Most recent rows.")
@click.option("--json", "as_json", is_flag=True, help="Print rows as JSON (all columns).")
def audit(workflow_id: str | None, tenant: str | None, limit: int, as_json: bool) -> None:
    """Every tool call: what ran, who approved it, what nobody answered, what was rolled back."""

    async def rows(session: AsyncSession) -> list[dict[str, Any]]:
        query = select(ToolExecution).order_by(ToolExecution.id.desc()).limit(limit)
        if workflow_id:
            query = query.where(ToolExecution.workflow_id == workflow_id)
        if tenant:
            query = query.where(ToolExecution.tenant_id == tenant)
        found = (await session.scalars(query)).all()
        return [
            {c.name: getattr(r, c.name) for c in ToolExecution.__table__.columns} for r in reversed(found)
        ]

    found = run(with_session(rows))
    if as_json:
        print_json(found)
    elif not found:
        click.echo("no tool calls recorded")
    else:
        cells = [AUDIT_COLUMNS] + [
            tuple(
                r[c].strftime("%Y-%m-%d %H:%M:%S")
                if c == "created_at"
                else str(r[c] if r[c] is not None else "-")
                for c in AUDIT_COLUMNS
            )
            for r in found
        ]
        click.echo(table(cells))


@cli.group()
def permissions() -> None:
    """Permission tiers per agent and tool. Changes apply to conversations started afterwards."""


@permissions.command("show")
@click.argument("agent")
def show_permissions(agent: str) -> None:
    """The agent's tools with their tier (the tool's default when not set)."""
    from tools import REGISTRY

    async def rows(session: AsyncSession) -> list[AgentToolPermission]:
        if await session.get(AgentProfile, agent) is None:
            raise click.ClickException(f"no agent named {agent!r}")
        query = (
            select(AgentToolPermission)
            .where(AgentToolPermission.agent == agent)
            .order_by(AgentToolPermission.tool)
        )
        return list((await session.scalars(query)).all())

    cells: list[tuple[str, ...]] = [("tool", "tier", "source", "risk", "category")]
    for p in run(with_session(rows)):
        spec = REGISTRY.get(p.tool)
        default = spec.default_tier if spec else "blocked"
        cells.append(
            (
                p.tool,
                p.tier or default,
                "set" if p.tier else "default",
                spec.risk if spec else "?",
                spec.category if spec else "unknown tool",
            )
        )
    click.echo(table(cells))

    async def policy(session: AsyncSession) -> ContextPolicy | None:
        row = await session.get(schema.ContextPolicy, agent)
        return ContextPolicy.model_validate(row, from_attributes=True) if row else None

    click.echo(describe_policy(run(with_session(policy))))


@permissions.command("set")
@click.argument("agent")
@click.argument("tool")
@click.argument("tier", type=click.Choice(TIERS))
def set_permission(agent: str, tool: str, tier: str) -> None:
    """Set the tier of one of an agent's tools (adds the tool to the agent if it lacks it)."""
    from tools import REGISTRY

    if tool not in REGISTRY:
        raise click.ClickException(f"no tool named {tool!r}; known: {', '.join(sorted(REGISTRY))}")

    async def change(session: AsyncSession) -> None:
        if await session.get(AgentProfile, agent) is None:
            raise click.ClickException(f"no agent named {agent!r}")
        statement = insert(AgentToolPermission).values(agent=agent, tool=tool, tier=tier)
        await session.execute(
            statement.on_conflict_do_update(index_elements=["agent", "tool"], set_={"tier": tier})
        )

    run(with_session(change))
    click.echo(f"{agent}: {tool} is now {tier} (new conversations only; running ones keep their snapshot)")
