"""The agents' tools for a tenant's admins, over HTTP (CONTRACT.md, "The front door"):

- `GET /api/agents/{agent}/tools/catalog`: every tool the agent has, with risk, category, default
  tier and whether it can be undone;
- `GET /api/agents/{agent}/tools`: `{"tools": [{"toolName", "permissionStatus", "providerKey"}]}`,
  the tiers the caller's tenant gets;
- `PUT` of the same body replaces them: every tool of the agent, each once;
- `GET /api/agents/{agent}/tools/changes`: the tenant's `tier_changes` for the agent, newest first
  (refused attempts too, with why), as the tools page shows them.

Through the tenant-tier rules (tools.tiers): only the tenant's admins (roles from PostgreSQL),
never `always_allow` for a high-risk tool, every attempt (refused ones too) in `tier_changes`. A body
naming another tenant, or a caller who is not an admin of theirs, answers 403; the legacy
`{"enabledTools": [...]}` shape answers 400.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from countersign.core.authority import ADMIN
from countersign.db.people import roles_of
from countersign.db.schema import AgentProfile, AgentToolPermission, TierChange
from countersign.mcp.servers import server_of
from countersign.server.door import CALLER
from countersign.server.http import HttpRefusal, refuse_keys_twice
from tools.registry import REGISTRY
from tools.tiers import change_tenant_tier, risk_and_default, tenant_tiers, tier_refusal

Tier = Literal["always_allow", "needs_approval", "blocked"]
AGENT_TOOLS = web.AppKey("agent_tools", async_sessionmaker[AsyncSession])


class ToolTier(BaseModel):
    model_config = ConfigDict(extra="forbid")

    toolName: str = Field(min_length=1, max_length=300)
    permissionStatus: Tier
    providerKey: str | None = Field(None, max_length=300)


class ToolsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: list[ToolTier] = Field(max_length=1000)
    tenantId: str | None = Field(None, max_length=200)


def provider_of(tool: str) -> str:
    server = server_of(tool)
    return f"mcp:{server}" if server else "native"


async def grants_of(session: AsyncSession, agent: str) -> list[AgentToolPermission]:
    if await session.get(AgentProfile, agent) is None:
        raise HttpRefusal(404, f"no agent {agent}")
    query = select(AgentToolPermission).where(AgentToolPermission.agent == agent)
    return list(await session.scalars(query.order_by(AgentToolPermission.tool)))


async def admin_of(
    request: web.Request, session: AsyncSession, what: str = "its agents' tools"
) -> tuple[str, str]:
    """(tenant, admin) for a logged-in admin of their tenant (roles from PostgreSQL); else 403
    saying that only an admin sees and changes `what`."""
    caller = request[CALLER]
    if caller.person is None:
        raise HttpRefusal(403, f"an API token cannot change {what}")
    if ADMIN not in (await roles_of(session, caller.tenant_id, caller.person) or []):
        raise HttpRefusal(403, f"only an admin of {caller.tenant_id} sees and changes {what}")
    return caller.tenant_id, caller.person


async def catalog(request: web.Request) -> web.Response:
    async with request.app[AGENT_TOOLS]() as session:
        await admin_of(request, session)
        grants = await grants_of(session, request.match_info["agent"])
    entries = []
    for grant in grants:
        declared = risk_and_default(grant.tool)
        if declared is None:
            continue
        risk, default = declared
        native = REGISTRY.get(grant.tool)
        entries.append(
            {
                "toolName": grant.tool,
                "providerKey": provider_of(grant.tool),
                "risk": risk,
                "category": native.category if native else "external",
                "defaultTier": grant.tier or default,
                "reversible": bool(native and native.compensation is not None),
                "description": native.description if native else "",
            }
        )
    return web.json_response({"agent": request.match_info["agent"], "tools": entries})


async def current(session: AsyncSession, tenant: str, agent: str) -> list[dict[str, Any]]:
    overrides = await tenant_tiers(session, tenant, agent)
    rows = []
    for grant in await grants_of(session, agent):
        declared = risk_and_default(grant.tool)
        if declared is None:
            continue
        tier = overrides[grant.tool].tier if grant.tool in overrides else grant.tier or declared[1]
        rows.append(
            {"toolName": grant.tool, "permissionStatus": tier, "providerKey": provider_of(grant.tool)}
        )
    return rows


async def tools(request: web.Request) -> web.Response:
    async with request.app[AGENT_TOOLS]() as session:
        tenant, _ = await admin_of(request, session)
        return web.json_response({"tools": await current(session, tenant, request.match_info["agent"])})


async def replace_tools(request: web.Request) -> web.Response:
    if request.content_type != "application/json":
        raise HttpRefusal(415, "send JSON (Content-Type: application/json)")
    raw = await request.read()
    refuse_keys_twice(raw)
    try:
        body = ToolsBody.model_validate_json(raw)
    except ValidationError as err:
        legacy = b'"enabledTools"' in raw
        reason = (
            'the {"enabledTools": [...]} shape is gone: send {"tools": [{"toolName", "permissionStatus", '
            '"providerKey"}]}'
            if legacy
            else f"invalid request: {err.errors()[0]['msg']}"
        )
        raise HttpRefusal(400, reason) from None
    agent, caller = request.match_info["agent"], request[CALLER]
    if caller.person is None:
        raise HttpRefusal(403, "an API token cannot change tools")
    tenant, person = caller.tenant_id, caller.person
    if body.tenantId is not None and body.tenantId != tenant:
        raise HttpRefusal(403, f"{person} may change the tools of {tenant} only, not of {body.tenantId}")
    sessions = request.app[AGENT_TOOLS]
    async with sessions() as session:
        is_admin = ADMIN in (await roles_of(session, tenant, person) or [])
        before = {row["toolName"]: row["permissionStatus"] for row in await current(session, tenant, agent)}
    wanted = {t.toolName: t.permissionStatus for t in body.tools}
    if len(wanted) != len(body.tools) or wanted.keys() != before.keys():
        raise HttpRefusal(
            400, f"list every tool of {agent} once: {', '.join(sorted(before)) or 'it has none'}"
        )
    changes = {tool: tier for tool, tier in wanted.items() if tier != before[tool]}
    refused: dict[str, str] = {}
    for tool, tier in changes.items():
        declared = risk_and_default(tool)
        why = tier_refusal(declared[0], tier) if declared else None
        if not is_admin:
            why = f"only an admin of {tenant} may change its tiers"
        if why is not None:
            refused[tool] = why
    async with sessions.begin() as session:  # every attempt recorded: the refused alone, or all
        for tool in refused or changes:
            await change_tenant_tier(
                session,
                tenant_id=tenant,
                agent=agent,
                tool=tool,
                tier=changes[tool],
                changed_by=person,
                via="inbox",
            )
    if refused:
        raise HttpRefusal(403, "; ".join(f"{tool}: {reason}" for tool, reason in refused.items()))
    async with sessions() as session:
        return web.json_response({"tools": await current(session, tenant, agent)})


CHANGES_LISTED = 50


async def changes(request: web.Request) -> web.Response:
    agent = request.match_info["agent"]
    async with request.app[AGENT_TOOLS]() as session:
        tenant, _ = await admin_of(request, session)
        await grants_of(session, agent)  # 404 for an agent that does not exist
        rows = await session.scalars(
            select(TierChange)
            .where(TierChange.tenant_id == tenant, TierChange.agent == agent)
            .order_by(TierChange.created_at.desc(), TierChange.id.desc())
            .limit(CHANGES_LISTED)
        )
        listed = [
            {
                "toolName": row.tool,
                "oldTier": row.old_tier,
                "newTier": row.new_tier,
                "changedBy": row.changed_by,
                "via": row.via,
                "accepted": row.accepted,
                "reason": row.reason,
                "createdAt": row.created_at.isoformat(),
            }
            for row in rows
        ]
    return web.json_response({"agent": agent, "changes": listed})


def add_routes(app: web.Application, sessions: async_sessionmaker[AsyncSession]) -> None:
    app[AGENT_TOOLS] = sessions
    app.router.add_get("/api/agents/{agent}/tools/catalog", catalog)
    app.router.add_get("/api/agents/{agent}/tools/changes", changes)
    app.router.add_get("/api/agents/{agent}/tools", tools)
    app.router.add_put("/api/agents/{agent}/tools", replace_tools)
