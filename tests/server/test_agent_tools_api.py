"""The agents' tools for a tenant's admins over HTTP (`/api/agents/{agent}/tools…`), on the real
server and PostgreSQL: the catalog, the tenant's tiers read and replaced in one request, through
the tenant-tier rules (admins only, never always_allow for high risk, every attempt recorded)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import TenantToolTier, TierChange
from tests.fixtures.inbox import AuthInbox

TOOLS = "/api/agents/lead-qualifier/tools"


@pytest_asyncio.fixture
async def acme_tiers_restored(db_engine: AsyncEngine) -> AsyncIterator[None]:
    yield
    async with db_engine.begin() as conn:
        await conn.execute(
            delete(TenantToolTier).where(
                TenantToolTier.tenant_id == "acme", TenantToolTier.agent == "lead-qualifier"
            )
        )


async def token(inbox: AuthInbox, user: str, tenant: str = "acme") -> str:
    status, body, _ = await inbox.login(user, f"{user}-dev", tenant)
    assert status == 200, body
    return str(body["token"])


async def test_a_tenant_admin_reads_the_catalog_and_replaces_the_tiers_through_the_rules(
    auth_inbox: AuthInbox, db_engine: AsyncEngine, acme_tiers_restored: None
) -> None:
    carol, bob = await token(auth_inbox, "carol"), await token(auth_inbox, "bob")
    status, catalog, _ = await auth_inbox.call("GET", TOOLS + "/catalog", carol)
    assert status == 200, catalog
    by_name = {t["toolName"]: t for t in catalog["tools"]}
    assert by_name["update_lead_status"]["risk"] == "high"
    assert (
        by_name["search_leads"]["category"] == "read" and by_name["search_leads"]["providerKey"] == "native"
    )
    assert {"defaultTier", "reversible"} <= by_name["update_lead_status"].keys()

    status, current, _ = await auth_inbox.call("GET", TOOLS, carol)
    assert status == 200 and {t["toolName"] for t in current["tools"]} == set(by_name)
    tiers: list[dict[str, Any]] = current["tools"]
    assert (await auth_inbox.call("GET", TOOLS, bob))[0] == 403  # a reviewer, not an admin
    assert (await auth_inbox.call("GET", TOOLS, await token(auth_inbox, "dave", "globex")))[0] == 403
    assert (await auth_inbox.call("PUT", TOOLS, carol, {"enabledTools": ["search_leads"]}))[0] == 400
    assert (await auth_inbox.call("PUT", TOOLS, carol, {"tools": tiers, "tenantId": "globex"}))[0] == 403
    assert (await auth_inbox.call("PUT", TOOLS, carol, {"tools": tiers[1:]}))[0] == 400  # one left out

    def with_tier(tool: str, tier: str) -> list[dict[str, Any]]:
        return [{**t, "permissionStatus": tier} if t["toolName"] == tool else t for t in tiers]

    status, body, _ = await auth_inbox.call(
        "PUT", TOOLS, carol, {"tools": with_tier("update_lead_status", "always_allow")}
    )
    assert status == 403 and "four-eyes" in body["error"], body
    status, body, _ = await auth_inbox.call(
        "PUT", TOOLS, bob, {"tools": with_tier("search_leads", "blocked")}
    )
    assert status == 403, body
    status, body, _ = await auth_inbox.call(
        "PUT", TOOLS, carol, {"tools": with_tier("search_leads", "blocked")}
    )
    assert status == 200, body
    assert {t["toolName"]: t["permissionStatus"] for t in body["tools"]}["search_leads"] == "blocked"
    async with db_engine.connect() as conn:
        changes = list(
            await conn.execute(
                select(TierChange.tool, TierChange.new_tier, TierChange.accepted, TierChange.changed_by)
                .where(TierChange.tenant_id == "acme", TierChange.agent == "lead-qualifier")
                .order_by(TierChange.id.desc())
                .limit(2)
            )
        )
    assert changes == [("search_leads", "blocked", True, "carol"), ("search_leads", "blocked", False, "bob")]
