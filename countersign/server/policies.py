"""A tenant's Cedar policies for its admins, over HTTP (the policies page draws it):

- `GET /api/policies`: the enforced and shadow sets (version, who applied them, when, the text),
  the latest calls the shadow set would have decided otherwise, and the latest attempts to apply;
- `POST /api/policies/validate` `{"text"}`: the set checked against the tenant's tools, changing
  nothing: `{"ok": true}`, or 422 with every problem;
- `PUT /api/policies` `{"text", "shadow"}`: the set applied (an empty text removes it), with the
  rules of `policy apply` (countersign/db/policies.py): admins only, every attempt in `policy_changes`.

A caller who is not an admin of their tenant (roles from PostgreSQL) gets 403, an API token too.
The inbox page tells admins when the shadow set would have decided calls otherwise (`shadow_summary`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from countersign.core.authority import ADMIN
from countersign.core.bounds import unstorable_refusal
from countersign.core.cedar_policy import PolicySetError
from countersign.core.policy_bounds import MAX_POLICY_CHARS
from countersign.db.people import roles_of
from countersign.db.policies import apply_policies, checked_policies, tenant_policies
from countersign.db.schema import PolicyChange, ShadowDifference
from countersign.server.agent_tools import admin_of
from countersign.server.door import CALLER
from countersign.server.http import HttpRefusal, parse
from tools.policies import tenant_tools

POLICIES = web.AppKey("policies", async_sessionmaker[AsyncSession])
WHAT = "its policies"
LISTED = 50


class PolicyText(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=MAX_POLICY_CHARS)
    shadow: bool = False

    @field_validator("text")
    @classmethod
    def _storable(cls, text: str) -> str:
        """Refused, never altered (a changed rule is another rule): a NUL or a lone surrogate, which
        the recorded attempt (`policy_changes`) cannot hold."""
        refusal = unstorable_refusal(text)
        if refusal is not None:
            raise ValueError(f"a policy set {refusal}")
        return text


async def show(request: web.Request) -> web.Response:
    async with request.app[POLICIES]() as session:
        tenant, _ = await admin_of(request, session, WHAT)
        sets = await tenant_policies(session, tenant)
        differences = await session.scalars(
            select(ShadowDifference)
            .where(ShadowDifference.tenant_id == tenant)
            .order_by(ShadowDifference.id.desc())
            .limit(LISTED)
        )
        changes = await session.scalars(
            select(PolicyChange)
            .where(PolicyChange.tenant_id == tenant)
            .order_by(PolicyChange.id.desc())
            .limit(LISTED)
        )
        shown: dict[str, Any] = {
            "tenant": tenant,
            **{
                mode: {
                    "version": row.version,
                    "appliedBy": row.applied_by,
                    "appliedAt": row.applied_at.isoformat(),
                    "text": row.text,
                }
                if row is not None
                else None
                for mode, row in (("enforced", sets.get("enforced")), ("shadow", sets.get("shadow")))
            },
            "differences": [
                {
                    "at": d.created_at.isoformat(),
                    "workflowId": d.workflow_id,
                    "callId": d.call_id,
                    "tool": d.tool,
                    "requestedBy": d.requested_by,
                    "shadowVersion": d.shadow_version,
                    "enforced": d.enforced,
                    "shadow": d.shadow,
                }
                for d in differences
            ],
            "changes": [
                {
                    "at": c.created_at.isoformat(),
                    "mode": c.mode,
                    "version": c.version,
                    "changedBy": c.changed_by,
                    "via": c.via,
                    "accepted": c.accepted,
                    "reason": c.reason,
                }
                for c in changes
            ],
        }
    return web.json_response(shown)


async def validate(request: web.Request) -> web.Response:
    body = await parse(request, PolicyText)
    async with request.app[POLICIES]() as session:
        tenant, _ = await admin_of(request, session, WHAT)
        try:
            await checked_policies(body.text, await tenant_tools(session, tenant))
        except PolicySetError as err:
            raise HttpRefusal(422, str(err)) from None
    return web.json_response({"ok": True})


async def apply(request: web.Request) -> web.Response:
    """Every attempt by a person is recorded, a non-admin's too (403), like tier changes; an
    invalid set answers 422."""
    body = await parse(request, PolicyText)
    caller = request[CALLER]
    if caller.person is None:
        raise HttpRefusal(403, f"an API token cannot change {WHAT}")
    async with request.app[POLICIES].begin() as session:
        admin = ADMIN in (await roles_of(session, caller.tenant_id, caller.person) or [])
        change = await apply_policies(
            session, tenant_id=caller.tenant_id, text=body.text, shadow=body.shadow, changed_by=caller.person,
            via="inbox", tools=await tenant_tools(session, caller.tenant_id),
        )  # fmt: skip
    if not change.accepted:
        raise HttpRefusal(422 if admin else 403, f"refused (recorded): {change.reason}")
    return web.json_response({"accepted": True, "version": change.version})


async def shadow_summary(sessions: async_sessionmaker[AsyncSession], tenant: str) -> dict[str, int] | None:
    """What the inbox tells the tenant's admins: the shadow set's version and how many calls it
    would have decided otherwise; None without a shadow set or while it has decided none otherwise."""
    async with sessions() as session:
        shadow = (await tenant_policies(session, tenant)).get("shadow")
        if shadow is None:
            return None
        count = await session.scalar(
            select(func.count()).where(
                ShadowDifference.tenant_id == tenant, ShadowDifference.shadow_version == shadow.version
            )
        )
    return {"version": shadow.version, "differences": count} if count else None


def add_routes(app: web.Application, sessions: async_sessionmaker[AsyncSession]) -> None:
    app[POLICIES] = sessions
    app.router.add_get("/api/policies", show)
    app.router.add_post("/api/policies/validate", validate)
    app.router.add_put("/api/policies", apply)
