"""Commands that read and change the database directly: `audit` and `permissions`."""

from __future__ import annotations

from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.ux import with_session
from countersign.core.calls import Tier
from countersign.core.envelopes import WindowPolicy, describe_policy
from countersign.db import schema
from countersign.db.audit import audit_rows
from countersign.db.schema import TIERS, AgentProfile, AgentToolPermission, McpServer
from countersign.mcp.servers import server_of
from tools.tiers import change_tenant_tier, remove_agent_tool, tenant_tiers

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


async def require_agent(session: AsyncSession, agent: str) -> AgentProfile:
    """The agent's profile; a mistyped agent name is answered with the known ones."""
    profile = await session.get(AgentProfile, agent)
    if profile is None:
        known = (await session.scalars(select(AgentProfile.name).order_by(AgentProfile.name))).all()
        raise click.ClickException(f"no agent named {agent!r}; known agents: {', '.join(known)}")
    return profile


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def audit_cell(row: dict[str, Any], column: str) -> str:
    """One cell of `audit`'s table: a call approved by a grant names it, and an undo that did not
    undo it says how it ended and why ("False (undo skipped: it never took effect: …)")."""
    value = row[column]
    if column == "created_at":
        return str(value)[:19]  # a datetime, or its str() from the server
    if column == "approved_by" and row.get("grant_id"):
        return f"{value} (grant {row['grant_id']})"  # approved unasked, by that approver's grant
    if column == "rolled_back" and not value and row.get("undo"):
        return f"{value} (undo {row['undo']}: {row['undo_why']})"
    return str(value if value is not None else "-")


@cli.group(invoke_without_command=True)
@click.option("--workflow", "workflow_id", help="One conversation's calls.")
@click.option("--tenant", help="One tenant's calls.")
@click.option("--limit", default=100, show_default=True, help="Most recent rows.")
@click.option("--json", "as_json", is_flag=True, help="Print rows as JSON (all columns).")
@click.pass_context
def audit(ctx: click.Context, workflow_id: str | None, tenant: str | None, limit: int, as_json: bool) -> None:
    """Every tool call: what ran, who approved it, what nobody answered, what was rolled back.

    `audit export` and `audit verify` hand the audit to an auditor as evidence (countersign.cli.evidence)."""
    if ctx.invoked_subcommand is not None:
        return
    if workflow_id:  # one conversation's, through its client (signed mode: the server's answer)
        from countersign.cli.conversation_client import conversation_client  # Temporal's client: only here

        found = run(conversation_client().audit(workflow_id, tenant, limit))
    else:
        found = run(with_session(lambda session: audit_rows(session, None, tenant, limit)))
    if as_json:
        print_json(found)
    elif not found:
        click.echo("no tool calls recorded")
    else:
        click.echo(table([AUDIT_COLUMNS] + [tuple(audit_cell(r, c) for c in AUDIT_COLUMNS) for r in found]))


@cli.group()
def permissions() -> None:
    """Permission tiers per agent and tool. Changes apply to conversations started afterwards."""


@permissions.command("show")
@click.argument("agent")
@click.option("--tenant", help="Show the tiers this tenant's conversations get (its own tiers applied).")
def show_permissions(agent: str, tenant: str | None) -> None:
    """The agent's tools with their tier (the tool's default when not set; with --tenant, the
    tenant's own tier where one is set)."""
    from tools import REGISTRY

    async def rows(
        session: AsyncSession,
    ) -> tuple[dict[str, Any], list[AgentToolPermission], dict[str, schema.TenantToolTier]]:
        profile = await require_agent(session, agent)
        query = (
            select(AgentToolPermission)
            .where(AgentToolPermission.agent == agent)
            .order_by(AgentToolPermission.tool)
        )
        own = await tenant_tiers(session, tenant, agent) if tenant else {}
        return dict(profile.limits), list((await session.scalars(query)).all()), own

    limits, grants, own = run(with_session(rows))
    cells: list[tuple[str, ...]] = [("tool", "tier", "source", "risk", "category")]
    for p in grants:
        if server_of(p.tool):
            continue  # listed with its server's other tools below
        spec = REGISTRY.get(p.tool)
        default = spec.default_tier if spec else "blocked"
        cells.append(
            (
                p.tool,
                own[p.tool].tier if p.tool in own else p.tier or default,
                tenant_source(own[p.tool]) if p.tool in own else "set" if p.tier else "default",
                spec.risk if spec else "?",
                spec.category if spec else "unknown tool",
            )
        )
    click.echo(table(cells))
    mcp_rows = run(with_session(lambda session: mcp_permissions(session, agent, grants, own)))
    if mcp_rows:
        click.echo("\nMCP tools (hints are the server's own claims, never authority):")
        click.echo(table([("tool", "tier", "source", "risk", "category", "hints"), *mcp_rows]))
    click.echo(f"limits (a conversation may ask for less, never more): {format_limits(limits)}")

    async def policy(session: AsyncSession) -> WindowPolicy | None:
        row = await session.get(schema.ContextPolicy, agent)
        return WindowPolicy.model_validate(row, from_attributes=True) if row else None

    click.echo(describe_policy(run(with_session(policy))))


def tenant_source(row: schema.TenantToolTier) -> str:
    return f"tenant {row.tenant_id} (by {row.set_by} {row.set_at:%Y-%m-%d %H:%M})"


def format_limits(limits: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(limits.items())) or "none (built-in defaults)"


@permissions.command("set")
@click.argument("agent")
@click.argument("tool")
@click.argument("tier", type=click.Choice(TIERS))
@click.option("--tenant", help="Set the tier for this tenant only (its own tier; audited).")
@click.option("--as", "changed_by", help="With --tenant: the admin of the tenant making the change.")
def set_permission(agent: str, tool: str, tier: Tier, tenant: str | None, changed_by: str | None) -> None:
    """Set the tier of one of an agent's tools (adds the tool to the agent if it lacks it).

    With --tenant, only that tenant's conversations get the tier, as if its admin had set it in the
    inbox: an admin of the tenant (--as), a tool the agent has, never always_allow for high risk."""
    from tools import REGISTRY

    if tool not in REGISTRY and not server_of(tool):
        raise click.ClickException(f"no tool named {tool!r}; known: {', '.join(sorted(REGISTRY))}")
    if tenant is not None:
        set_tenant_permission(agent, tool, tier, tenant, changed_by)
        return

    async def change(session: AsyncSession) -> None:
        await require_agent(session, agent)
        server = server_of(tool)
        if server and await session.get(McpServer, server) is None:
            raise click.ClickException(f"no MCP server named {server!r} (see `mcp list`)")
        statement = insert(AgentToolPermission).values(agent=agent, tool=tool, tier=tier)
        await session.execute(
            statement.on_conflict_do_update(index_elements=["agent", "tool"], set_={"tier": tier})
        )

    run(with_session(change))
    click.echo(f"{agent}: {tool} is now {tier} (new conversations only; running ones keep their snapshot)")


def set_tenant_permission(
    agent: str, tool: str, tier: Tier | None, tenant: str, changed_by: str | None
) -> None:
    """Change (`tier=None`: reset) the tenant's own tier as its named admin; refusals are recorded."""
    if not changed_by:
        raise click.ClickException("--tenant needs --as ADMIN: who changes the tenant's tier (audited)")

    async def attempt(session: AsyncSession) -> schema.TierChange:
        await require_agent(session, agent)
        if await session.get(schema.Tenant, tenant) is None:
            raise click.ClickException(f"no tenant named {tenant!r}")
        return await change_tenant_tier(
            session, tenant_id=tenant, agent=agent, tool=tool, tier=tier, changed_by=changed_by, via="cli"
        )

    change = run(with_session(attempt))
    if not change.accepted:
        raise click.ClickException(f"refused (recorded): {change.reason}")
    click.echo(
        f"{agent}: {tool} is now {change.new_tier} for tenant {tenant} "
        + ("(was" if tier else "(the agent's tier; its own was")
        + f" {change.old_tier}; new conversations only; running ones keep their snapshot)"
    )


@permissions.command("reset")
@click.argument("agent")
@click.argument("tool")
@click.option("--tenant", required=True, help="The tenant whose own tier is removed (audited).")
@click.option("--as", "changed_by", help="The admin of the tenant making the change.")
def reset_permission(agent: str, tool: str, tenant: str, changed_by: str | None) -> None:
    """Remove a tenant's own tier for one of an agent's tools (set by `permissions set --tenant` or
    the inbox's "Always allow"): the tenant's conversations get the agent's tier again. An admin of
    the tenant (--as); recorded in tier_changes and the audit chain like every tier change."""
    set_tenant_permission(agent, tool, None, tenant, changed_by)


@permissions.command("remove")
@click.argument("agent")
@click.argument("tool")
def remove_permission(agent: str, tool: str) -> None:
    """Take a tool away from an agent, for every tenant (the undo of `permissions set AGENT TOOL
    TIER`; tenants' own tiers for it go too, so adding it back starts from the agent's tier; each
    such tier's removal is recorded in that tenant's tier changes and the audit chain)."""

    async def change(session: AsyncSession) -> list[str]:
        await require_agent(session, agent)
        if await session.get(AgentToolPermission, (agent, tool)) is None:
            raise click.ClickException(f"agent {agent} does not have the tool {tool}")
        return [c.tenant_id for c in await remove_agent_tool(session, agent, tool)]

    tenants = run(with_session(change))
    click.echo(f"{agent}: {tool} removed (new conversations only; running ones keep their snapshot)")
    if tenants:
        click.echo(f"  the own tier of {', '.join(tenants)} went too (recorded in their tier changes)")


async def mcp_permissions(
    session: AsyncSession,
    agent: str,
    permissions: list[AgentToolPermission],
    own: dict[str, schema.TenantToolTier] | None = None,
) -> list[tuple[str, ...]]:
    """Rows for the agent's MCP tools as their servers last listed them, and for tiers set on
    tools no listing shows (yet, or any more); `own`: a tenant's own tiers, shown where set."""
    from countersign.core.calls import McpTool
    from countersign.mcp.catalog import MCP_CATEGORY, MCP_DEFAULT_TIER, MCP_RISK

    own = own or {}
    tiers = {p.tool: own[p.tool].tier if p.tool in own else p.tier for p in permissions if server_of(p.tool)}
    found: dict[str, str] = {}
    for server in (await session.scalars(select(McpServer).order_by(McpServer.name))).all():
        if agent not in server.agents:
            continue
        scope = f" (tenant {server.tenant_id})" if server.tenant_id else ""
        for listed in server.tools or []:
            source = McpTool(
                server=server.name, tool=listed["name"], fingerprint="", annotations=listed["annotations"]
            )
            found[f"mcp__{server.name}__{listed['name']}"] = source.hints() + scope
    rows: list[tuple[str, ...]] = []
    for name in sorted(set(found) | set(tiers)):
        tier = tiers.get(name)
        hints = found.get(name, "not in its server's last listing")
        origin = tenant_source(own[name]) if name in own else "set" if tier else "default"
        rows.append((name, tier or MCP_DEFAULT_TIER, origin, MCP_RISK, MCP_CATEGORY, hints))
    return rows
