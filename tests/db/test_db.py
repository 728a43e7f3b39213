"""The database layer against a real PostgreSQL: migrations, constraints, and the contract's seed data."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, delete, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.db import schema
from countersign.db.migrate import head_revision, upgrade
from countersign.db.seed import seed
from tools.registry import REGISTRY

SEEDED_TABLES = [
    schema.Tenant,
    schema.User,
    schema.UserRole,
    schema.Lead,
    schema.Contact,
    schema.Project,
    schema.Task,
    schema.CalendarEvent,
    schema.Notification,
    schema.Case,
    schema.AgentProfile,
    schema.AgentToolPermission,
]


async def test_upgrade_is_idempotent_and_reaches_head(database_url: str, db_engine: AsyncEngine) -> None:
    upgrade(database_url)  # again, and from inside a running event loop
    async with db_engine.connect() as conn:
        versions = list(await conn.scalars(text("SELECT version_num FROM alembic_version")))
    assert versions == [head_revision()]


async def test_models_and_migrations_describe_the_same_schema(db_engine: AsyncEngine) -> None:
    def differences(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, schema.Base.metadata))

    async with db_engine.connect() as conn:
        assert await conn.run_sync(differences) == []


async def snapshot(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    """Every seeded table's rows, timestamps included, in primary-key order."""
    async with engine.connect() as conn:
        return {
            model.__tablename__: [
                tuple(row)
                for row in await conn.execute(select(model.__table__).order_by(*model.__mapper__.primary_key))
            ]
            for model in SEEDED_TABLES
        }


async def test_seed_twice_changes_nothing(database_url: str, db_engine: AsyncEngine) -> None:
    await seed(database_url, reset=True)  # back to the seed values, whatever earlier tests changed
    before = await snapshot(db_engine)
    await seed(database_url)
    assert await snapshot(db_engine) == before
    assert before["leads"] and before["agent_tool_permissions"]


async def test_seed_keeps_a_tier_an_operator_changed(database_url: str, db_engine: AsyncEngine) -> None:
    permission = schema.AgentToolPermission
    row = (permission.agent == "lead-qualifier") & (permission.tool == "search_leads")
    async with db_engine.begin() as conn:
        await conn.execute(update(permission).where(row).values(tier="blocked"))
    try:
        await seed(database_url)
        async with db_engine.connect() as conn:
            assert await conn.scalar(select(permission.tier).where(row)) == "blocked"
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(update(permission).where(row).values(tier=None))


async def test_seed_fills_what_is_missing_and_reset_puts_values_back(
    database_url: str, db_engine: AsyncEngine
) -> None:
    """`dev up` seeds on every start: a lead an approved call changed stays changed until an
    explicit `db seed --reset`; a seeded row someone deleted comes back either way."""
    lead = schema.Lead
    jane = (lead.tenant_id == "acme") & (lead.email == "jane.doe@example.com")
    li = (lead.tenant_id == "acme") & (lead.email == "li.wei@hooli.example")
    async with db_engine.begin() as conn:
        await conn.execute(update(lead).where(jane).values(status="qualified"))
        await conn.execute(delete(lead).where(li))
    try:
        await seed(database_url)
        async with db_engine.connect() as conn:
            assert await conn.scalar(select(lead.status).where(jane)) == "qualified"
            assert await conn.scalar(select(lead.status).where(li)) == "disqualified"
    finally:
        await seed(database_url, reset=True)
    async with db_engine.connect() as conn:
        assert await conn.scalar(select(lead.status).where(jane)) == "new"


async def test_both_tenants_have_jane_doe_as_lead_and_contact(db_session: AsyncSession) -> None:
    for tenant in ("acme", "globex"):
        lead = await db_session.scalar(
            select(schema.Lead).filter_by(tenant_id=tenant, email="jane.doe@example.com")
        )
        assert lead is not None
        assert (lead.name, lead.status) == ("Jane Doe", "new")
        contact = await db_session.scalar(select(schema.Contact).filter_by(tenant_id=tenant, name="Jane Doe"))
        assert contact is not None
        assert contact.email == "jane.doe@example.com"


async def test_users_and_roles_are_the_contracts(db_session: AsyncSession) -> None:
    roles = {tuple(row) for row in await db_session.execute(select(schema.UserRole.__table__))}
    assert roles == {
        ("acme", "alice", "sales"),
        ("acme", "bob", "reviewer"),
        ("acme", "carol", "admin"),
        ("globex", "dave", "sales"),
        ("globex", "erin", "reviewer"),
    }
    users = list(await db_session.scalars(select(schema.User)))
    assert {(u.tenant_id, u.id) for u in users} == {(t, u) for t, u, _ in roles}
    alice = await db_session.get(schema.User, ("acme", "alice"))
    assert alice is not None
    assert alice.email == "alice@acme.example"


async def test_agents_have_their_tools_and_seeded_tiers(db_session: AsyncSession) -> None:
    rows = await db_session.execute(select(schema.AgentToolPermission.__table__))
    tools: dict[str, dict[str, str | None]] = {}
    for agent, tool, tier in rows:
        tools.setdefault(agent, {})[tool] = tier
    assert set(tools) == {"lead-qualifier", "operations", "admin-assistant", "scheduler", "case-researcher"}
    assert tools["lead-qualifier"] == {
        "search_leads": None,
        "get_lead": None,
        "update_lead_status": "needs_approval",
        "send_email": "needs_approval",
        "search_contacts": None,
        "ask_human": None,
        "draft_email": "always_allow",
        "get_lead_score": None,
        "record_lead_reply": "always_allow",
        "list_drafts": None,
        "get_draft": None,
        "update_draft": "always_allow",
        "send_draft": "needs_approval",
    }
    assert set(tools["operations"]) >= {"list_tasks", "create_task", "create_event", "update_project"}
    assert set(tools["admin-assistant"]) >= {"query_records", "describe_collection", "write_record"}
    assert set(tools["scheduler"]) >= {"schedule_meeting", "confirm_meeting", "resolve_notification"}
    # Writes default to needs_approval; the seed (the demo's operator) lets operations' and the
    # scheduler's internal writes run unasked, and leaves every read and write_record to its default.
    for agent in ("operations", "scheduler"):
        for tool, tier in tools[agent].items():
            assert tier == (None if REGISTRY[tool].category == "read" else "always_allow"), (agent, tool)
    assert all(tier is None for tier in tools["admin-assistant"].values())
    for profile in await db_session.scalars(select(schema.AgentProfile)):
        assert len(profile.system_prompt) > 200 and profile.description


async def test_seed_has_ambiguity_an_injection_and_data_per_tenant(db_session: AsyncSession) -> None:
    sams = list(
        await db_session.scalars(select(schema.Contact.email).filter_by(tenant_id="acme", name="Sam Lee"))
    )
    assert len(set(sams)) == 2
    notes = await db_session.scalar(
        select(schema.Lead.notes).filter_by(tenant_id="acme", email="peter.gibbons@initrode.example")
    )
    assert notes is not None and "IGNORE ALL PREVIOUS INSTRUCTIONS" in notes
    acme = set(await db_session.scalars(select(schema.Lead.email).filter_by(tenant_id="acme")))
    globex = set(await db_session.scalars(select(schema.Lead.email).filter_by(tenant_id="globex")))
    assert acme & globex == {"jane.doe@example.com"}
    for tenant in ("acme", "globex"):  # at least: other tests may have added rows
        assert await count(db_session, schema.Project, tenant_id=tenant) >= 3
        assert await count(db_session, schema.Task, tenant_id=tenant) >= 4
        assert await count(db_session, schema.CalendarEvent, tenant_id=tenant) >= 4
        assert await count(db_session, schema.Notification, tenant_id=tenant, status="open") >= 1
        linked = await db_session.scalars(select(schema.Task.project_id).filter_by(tenant_id=tenant))
        assert any(linked)


async def count(session: AsyncSession, model: type[schema.Base], **where: str) -> int:
    return await session.scalar(select(func.count()).select_from(model).filter_by(**where)) or 0


INSERT_EXECUTION = (
    "INSERT INTO tool_executions"
    " (tenant_id, agent, user_id, workflow_id, run_id, call_id, tool, args, outcome)"
)
EXECUTION = "('acme', 'lead-qualifier', 'alice', 'wf-1', 'run-1', 'call-1', 'get_lead', '{}', '%s')"


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        ("UPDATE leads SET status = 'hot' WHERE tenant_id = 'acme'", "ck_leads_status"),
        (
            "INSERT INTO leads (tenant_id, email, name) VALUES ('acme', 'jane.doe@example.com', 'Jane 2')",
            "uq_leads_tenant_id_email",
        ),
        (  # dave is a globex user: an acme lead cannot be his
            "INSERT INTO leads (tenant_id, email, name, owner_user_id)"
            " VALUES ('acme', 'x@example.com', 'X', 'dave')",
            "fk_leads_tenant_id_owner_user_id_users",
        ),
        (
            "INSERT INTO tasks (tenant_id, title, created_by, project_id)"
            " SELECT 'acme', 'Sneaky', 'alice', id FROM projects WHERE tenant_id = 'globex' LIMIT 1",
            "fk_tasks_tenant_id_project_id_projects",
        ),
        (
            "INSERT INTO contacts (tenant_id, name, email) VALUES ('globex', 'J', 'jane.doe@example.com')",
            "uq_contacts_tenant_id_email",
        ),
        (
            "INSERT INTO projects (tenant_id, name) VALUES ('acme', 'Website relaunch')",
            "uq_projects_tenant_id_name",
        ),
        ("UPDATE tasks SET status = 'blocked'", "ck_tasks_status"),
        (
            "UPDATE calendar_events SET ends_at = starts_at - interval '1 hour'",
            "ck_calendar_events_ends_after_start",
        ),
        ("UPDATE agent_tool_permissions SET tier = 'sometimes'", "ck_agent_tool_permissions_tier"),
        (
            f"{INSERT_EXECUTION} VALUES {EXECUTION % 'executed'}, {EXECUTION % 'executed'}",
            "uq_tool_executions_workflow_id_conversation_id_call_id",
        ),
        (
            f"{INSERT_EXECUTION} VALUES {EXECUTION % 'ok'}",
            "ck_tool_executions_outcome",
        ),
        (
            "INSERT INTO email_outbox (tenant_id, idempotency_key, to_address, subject, body)"
            " VALUES ('acme', 'k', 'a@b.example', 's', 'b'), ('globex', 'k', 'c@d.example', 's', 'b')",
            "uq_email_outbox_idempotency_key",
        ),
        (
            "INSERT INTO compensations (tenant_id, workflow_id, call_id, tool, compensation)"
            " VALUES ('acme', 'wf', 'c', 't', 'undo'), ('acme', 'wf', 'c', 't', 'undo')",
            "uq_compensations_workflow_id_conversation_id_call_id",
        ),
    ],
)
async def test_constraints_reject_bad_rows(db_session: AsyncSession, statement: str, constraint: str) -> None:
    with pytest.raises(IntegrityError, match=constraint):
        await db_session.execute(text(statement))


async def test_orm_defaults_fill_a_new_lead(db_session: AsyncSession) -> None:
    lead = schema.Lead(tenant_id="globex", email="new.person@example.com", name="New Person")
    db_session.add(lead)
    await db_session.flush()
    await db_session.refresh(lead)
    assert lead.id > 0 and lead.status == "new" and lead.created_at.tzinfo is not None
