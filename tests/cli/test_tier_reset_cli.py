"""`permissions reset` (a tenant's own tier removed, by its admin, recorded) and `permissions remove`
(a tool taken from an agent): issue 41, item 9, "nothing removes a tool or resets a tier override"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import AgentToolPermission, AuditChainRecord, TenantToolTier, TierChange
from tests.tools.test_tenant_tiers import starter


@pytest_asyncio.fixture
async def operations_as_seeded(db_engine: AsyncEngine) -> AsyncIterator[None]:
    """operations' create_task as the seed has it (always_allow, no tenant tier), before and after."""

    async def restore() -> None:
        async with db_engine.begin() as conn:
            await conn.execute(delete(TenantToolTier).where(TenantToolTier.agent == "operations"))
            await conn.execute(
                update(AgentToolPermission)
                .where(AgentToolPermission.agent == "operations", AgentToolPermission.tool == "create_task")
                .values(tier="always_allow")
            )

    await restore()
    yield
    await restore()


async def changes(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        query = (
            select(TierChange)
            .where(TierChange.agent == "operations", TierChange.tool == "create_task")
            .order_by(TierChange.id)
        )
        return list(await conn.execute(query))


async def chained(engine: AsyncEngine) -> set[tuple[str, str]]:
    """The tier changes in the audit chain: (tenant, source id) of each."""
    async with engine.connect() as conn:
        links = await conn.execute(
            select(AuditChainRecord.tenant_id, AuditChainRecord.source_id).where(
                AuditChainRecord.source == "tier_changes"
            )
        )
        return {(tenant, source_id) for tenant, source_id in links}


async def test_an_admin_resets_the_tenants_own_tier_and_every_attempt_is_recorded(
    db_engine: AsyncEngine, database_url: str, operations_as_seeded: None
) -> None:
    before = len(await changes(db_engine))
    tighten = await starter(
        database_url, "permissions", "set", "operations", "create_task", "needs_approval",
        "--tenant", "acme", "--as", "carol",
    )  # fmt: skip
    assert tighten.returncode == 0, tighten.stderr

    refused = await starter(
        database_url, "permissions", "reset", "operations", "create_task", "--tenant", "acme", "--as", "bob"
    )
    assert refused.returncode != 0 and "only an admin of acme" in refused.stderr, refused
    reset = await starter(
        database_url, "permissions", "reset", "operations", "create_task", "--tenant", "acme", "--as", "carol"
    )
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.startswith(
        "operations: create_task is now always_allow for tenant acme (the agent's tier; its own was "
        "needs_approval;"
    ), reset.stdout
    again = await starter(
        database_url, "permissions", "reset", "operations", "create_task", "--tenant", "acme", "--as", "carol"
    )
    assert again.returncode != 0 and "acme has no tier of its own" in again.stderr, again

    shown = await starter(database_url, "permissions", "show", "operations", "--tenant", "acme")
    line = next(line for line in shown.stdout.splitlines() if line.startswith("create_task "))
    assert line.split()[1:3] == ["always_allow", "set"], line

    rows = (await changes(db_engine))[before:]
    assert [(r.changed_by, r.accepted, r.old_tier, r.new_tier, r.via) for r in rows] == [
        ("carol", True, "always_allow", "needs_approval", "cli"),
        ("bob", False, "needs_approval", "always_allow", "cli"),
        ("carol", True, "needs_approval", "always_allow", "cli"),
        ("carol", False, "always_allow", "always_allow", "cli"),
    ]
    assert {(r.tenant_id, f"[{r.id}]") for r in rows} <= await chained(db_engine)


async def test_an_operator_removes_a_tool_from_an_agent(
    db_engine: AsyncEngine, database_url: str, operations_as_seeded: None
) -> None:
    own = await starter(
        database_url, "permissions", "set", "operations", "create_task", "always_allow",
        "--tenant", "acme", "--as", "carol",
    )  # fmt: skip
    assert own.returncode == 0, own.stderr
    removed = await starter(database_url, "permissions", "remove", "operations", "create_task")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith("operations: create_task removed"), removed.stdout
    assert "the own tier of acme went too" in removed.stdout, removed.stdout
    taken = (await changes(db_engine))[-1]  # acme's history says who took its tier, and when
    assert (taken.tenant_id, taken.old_tier, taken.new_tier, taken.changed_by, taken.accepted) == (
        "acme", "always_allow", "blocked", "operator", True,
    ), taken  # fmt: skip
    assert ("acme", f"[{taken.id}]") in await chained(db_engine)
    shown = await starter(database_url, "permissions", "show", "operations")
    assert not any(line.startswith("create_task ") for line in shown.stdout.splitlines()), shown.stdout
    async with db_engine.connect() as conn:
        left = await conn.scalars(select(TenantToolTier).where(TenantToolTier.tool == "create_task"))
        assert list(left) == []
    twice = await starter(database_url, "permissions", "remove", "operations", "create_task")
    assert twice.returncode != 0 and "does not have the tool create_task" in twice.stderr, twice

    back = await starter(database_url, "permissions", "set", "operations", "create_task", "always_allow")
    assert back.returncode == 0, back.stderr
