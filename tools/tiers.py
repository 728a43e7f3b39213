"""Tenant tiers: a tenant's own permission tier for one of an agent's tools.

Agents (and their `agent_tool_permissions`) are shared by every tenant, so a tenant admin's "always
allow this tool for this agent" is stored per tenant (`tenant_tool_tiers`) and replaces the agent's
tier only in that tenant (activities/context.py's snapshot, and activities/rules.py at each call).
Like every tier change it decides every call checked or run afterwards, in running conversations
too; a call already waiting for a decision still needs its own.

Security rule: a high-risk tool is never made `always_allow` for a tenant. High risk is where the
four-eyes rule holds (countersign.core.approvals.FOUR_EYES): a second person must look at each call. A
standing allow would let the requester run such calls with nobody looking, for the whole tenant,
from one click; that is a change of policy, not a review decision, and stays with operators (the
agent-wide `permissions set`). Low and medium risk tools may be allowed: any reviewer (medium) or
even sales (low) could approve each call anyway, so allowing them trades repeated clicks for a
recorded standing decision by an admin. Tightening (`needs_approval`, `blocked`) is always allowed.
Only admins of the tenant may change its tiers; every attempt, refused ones included, is recorded
in `tier_changes` with who, when and the tier before and after.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.approvals import FOUR_EYES
from countersign.core.authority import ADMIN
from countersign.core.calls import Risk, Tier
from countersign.db.chain import chain_written
from countersign.db.schema import AgentToolPermission, TenantToolTier, TierChange, UserRole, Via
from countersign.mcp.catalog import MCP_DEFAULT_TIER, MCP_RISK
from countersign.mcp.servers import server_of
from tools.registry import REGISTRY


def risk_and_default(tool: str) -> tuple[Risk, Tier] | None:
    """The tool's declared risk and default tier; None for a tool nobody declares."""
    if tool in REGISTRY:
        spec = REGISTRY[tool]
        return spec.risk, spec.default_tier
    if server_of(tool):
        return MCP_RISK, MCP_DEFAULT_TIER
    return None


def tier_refusal(risk: Risk, tier: str) -> str | None:
    """Why a tenant may not give a tool of `risk` this tier, or None (see the module's rule)."""
    if tier == "always_allow" and risk in FOUR_EYES:
        return (
            f"{risk}-risk tools are never always allowed for a tenant: each call needs a second "
            "person (four-eyes rule)"
        )
    return None


async def tenant_tiers(session: AsyncSession, tenant_id: str, agent: str) -> dict[str, TenantToolTier]:
    """The tenant's own tiers for the agent's tools, by tool."""
    rows = await session.scalars(
        select(TenantToolTier).where(TenantToolTier.tenant_id == tenant_id, TenantToolTier.agent == agent)
    )
    return {row.tool: row for row in rows}


async def change_tenant_tier(
    session: AsyncSession,
    *,
    tenant_id: str,
    agent: str,
    tool: str,
    tier: Tier | None,
    changed_by: str,
    via: Via,
    workflow_id: str | None = None,
    call_id: str | None = None,
) -> TierChange:
    """Set the tenant's tier for the agent's tool if `changed_by` (an admin of the tenant, per the
    database) may, and record the attempt either way, in the caller's transaction. The returned row
    says whether it was accepted and, if not, why.

    `tier=None` resets: the tenant's own tier is removed and its conversations get the agent's tier
    again (recorded as the new tier). That is never refused for risk: the agent's tier is an
    operator's decision, which the tenant only ever overrode."""
    override = await session.get(TenantToolTier, (tenant_id, agent, tool), with_for_update=True)
    granted = await session.get(AgentToolPermission, (agent, tool))
    declared = risk_and_default(tool)
    old: str | None = None
    agent_tier: str | None = None
    if granted is not None and declared is not None:
        agent_tier = granted.tier or declared[1]
        old = override.tier if override is not None else agent_tier
    roles = await session.scalars(
        select(UserRole.role).where(UserRole.tenant_id == tenant_id, UserRole.user_id == changed_by)
    )
    refusal: str | None
    if ADMIN not in set(roles):
        refusal = f"only an admin of {tenant_id} may change its tiers ({changed_by} is not)"
    elif granted is None or declared is None:
        refusal = f"agent {agent} does not have the tool {tool}"
    elif tier is None:
        refusal = None if override else f"{tenant_id} has no tier of its own for {agent}'s {tool}"
    else:
        refusal = tier_refusal(declared[0], tier)
    change = TierChange(
        tenant_id=tenant_id,
        agent=agent,
        tool=tool,
        old_tier=old,
        new_tier=tier or agent_tier or "blocked",  # a tool the agent lacks is never offered
        changed_by=changed_by,
        via=via,
        accepted=refusal is None,
        reason=refusal,
        workflow_id=workflow_id,
        call_id=call_id,
    )
    session.add(change)
    if refusal is None and tier is None and override is not None:
        await session.delete(override)
    elif refusal is None and tier is not None:
        values = {"tenant_id": tenant_id, "agent": agent, "tool": tool, "tier": tier, "set_by": changed_by}
        statement = insert(TenantToolTier).values(**values)
        await session.execute(
            statement.on_conflict_do_update(
                index_elements=["tenant_id", "agent", "tool"],
                set_={"tier": tier, "set_by": changed_by, "set_at": func.now()},
            )
        )
    await chain_written(session, change)  # a change, or its refusal, is evidence too
    return change


OPERATOR = "operator"  # who changed an agent's own tools: the CLI's user, with the database's rights


async def remove_agent_tool(session: AsyncSession, agent: str, tool: str) -> list[TierChange]:
    """Take `tool` away from `agent` for every tenant, in the caller's transaction. A tenant's own
    tier for it goes too (adding the tool back starts from the agent's tier), and each such removal
    is recorded in `tier_changes` and the audit chain, as the operator's: a tenant's history of its
    tiers does not lose a tier without saying who took it and when."""
    overrides = await session.scalars(
        select(TenantToolTier)
        .where(TenantToolTier.agent == agent, TenantToolTier.tool == tool)
        .order_by(TenantToolTier.tenant_id)
        .with_for_update()
    )
    changes = []
    for override in overrides.all():
        change = TierChange(
            tenant_id=override.tenant_id, agent=agent, tool=tool, old_tier=override.tier,
            new_tier="blocked", changed_by=OPERATOR, via="cli", accepted=True,
            reason=f"the operator removed {tool} from {agent}",
        )  # fmt: skip
        session.add(change)
        await session.delete(override)
        await chain_written(session, change)
        changes.append(change)
    granted = AgentToolPermission
    await session.execute(delete(granted).where(granted.agent == agent, granted.tool == tool))
    return changes
