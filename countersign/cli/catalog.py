"""`permissions catalog` (every tool, its risk and default tier, which agents have it) and
`permissions limits` (an agent's bounds on a turn)."""

from __future__ import annotations

import json
from typing import Any

import click
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import print_json, run
from countersign.cli.records import format_limits, permissions, table
from countersign.cli.ux import with_session
from countersign.core.contract import AgentLimits
from countersign.db.schema import AgentProfile, AgentToolPermission

CATEGORY_ORDER = ("read", "write", "external")


def catalog_rows(grants: list[AgentToolPermission]) -> list[dict[str, Any]]:
    """One entry per registered tool: its declaration and each agent's resolved tier."""
    from tools import REGISTRY

    agents: dict[str, dict[str, str]] = {name: {} for name in REGISTRY}
    for grant in grants:
        if grant.tool in agents:
            agents[grant.tool][grant.agent] = grant.tier or REGISTRY[grant.tool].default_tier
    return [
        {
            "tool": tool.name,
            "risk": tool.risk,
            "category": tool.category,
            "default_tier": tool.default_tier,
            "required_roles": list(tool.required_roles),
            "compensable": tool.compensation is not None,
            "agents": agents[tool.name],
        }
        for tool in sorted(REGISTRY.values(), key=lambda t: (CATEGORY_ORDER.index(t.category), t.name))
    ]


@permissions.command("catalog")
@click.option("--json", "as_json", is_flag=True, help="Print a list of tools as JSON.")
def catalog(as_json: bool) -> None:
    """Every tool: risk, category, default tier (writes: needs_approval) and the agents that have it."""

    async def grants(session: AsyncSession) -> list[AgentToolPermission]:
        query = select(AgentToolPermission).order_by(AgentToolPermission.agent)
        return list((await session.scalars(query)).all())

    rows = catalog_rows(run(with_session(grants)))
    if as_json:
        print_json(rows)
        return
    cells: list[tuple[str, ...]] = [("tool", "risk", "category", "default tier", "agents (tier)")]
    for row in rows:
        agents = ", ".join(f"{agent} ({tier})" for agent, tier in row["agents"].items()) or "-"
        cells.append((row["tool"], row["risk"], row["category"], row["default_tier"], agents))
    click.echo(table(cells))


def parse_limits(settings: tuple[str, ...]) -> dict[str, Any]:
    """`KEY=VALUE` pairs; an empty VALUE removes the key. Values are checked by `AgentLimits`."""
    changes: dict[str, Any] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or key not in AgentLimits.model_fields:
            known = ", ".join(AgentLimits.model_fields)
            raise click.BadParameter(f"{setting!r}: expected KEY=VALUE with KEY one of {known}")
        changes[key] = json.loads(value) if value else None
    return changes


@permissions.command("limits")
@click.argument("agent")
@click.argument("settings", nargs=-1)
def set_limits(agent: str, settings: tuple[str, ...]) -> None:
    """Show or change an agent's bounds on a turn: `permissions limits admin-assistant
    max_iterations=7 turn_timeout_s=50` (`KEY=` removes one). A conversation's `--limits` may ask
    for less, never more. New conversations only."""
    try:
        changes = parse_limits(settings)
    except ValueError as e:  # a VALUE that is not JSON
        raise click.BadParameter(str(e)) from e

    async def change(session: AsyncSession) -> dict[str, Any]:
        profile = await session.get(AgentProfile, agent, with_for_update=True)
        if profile is None:
            raise click.ClickException(f"no agent named {agent!r}")
        merged = {k: v for k, v in {**profile.limits, **changes}.items() if v is not None}
        try:
            profile.limits = AgentLimits.model_validate(merged).model_dump(exclude_none=True)
        except ValidationError as e:
            first = e.errors()[0]
            raise click.ClickException(f"invalid limits: {first['loc'][0]}: {first['msg']}") from None
        return dict(profile.limits)

    limits = run(with_session(change))
    click.echo(f"{agent} limits: {format_limits(limits)}")
