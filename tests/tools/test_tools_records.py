"""The admin-assistant's generic record tools on the real PostgreSQL and the contract's seed data.

Each test runs in `db_session`'s transaction, rolled back afterwards; the idempotency test commits
through the real tool activity and cleans up after itself.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from activities.tools import ToolActivities
from countersign.core.calls import CallerContext, ToolInvocation, ToolResult
from countersign.core.guards import sanitize
from countersign.db.engine import session_factory
from countersign.db.schema import Lead, Notification, Task, ToolExecution
from tools import REGISTRY
from tools.arguments import validate
from tools.records import COLLECTIONS, NEVER_WRITABLE, WRITABLE_COLLECTIONS
from tools.registry import ToolArgs, ToolContext, ToolFailure


def context(
    session: AsyncSession, tenant: str = "acme", user: str = "carol", roles: list[str] | None = None
) -> ToolContext:
    caller = CallerContext(
        tenant_id=tenant, user_id=user, roles=["admin"] if roles is None else roles, agent="admin-assistant"
    )
    return ToolContext(
        caller=caller,
        session=session,
        workflow_id=f"wf-{uuid.uuid4()}",
        call_id="call-1",
        now=datetime.now(UTC),
    )


def parse(tool: str, **raw: Any) -> ToolArgs:
    return validate(REGISTRY[tool], json.dumps(raw))


async def call(ctx: ToolContext, tool: str, **raw: Any) -> dict[str, Any]:
    """Validate and run a tool the way the tool activity does (partial writes roll back on failure)."""
    args = parse(tool, **raw)
    async with ctx.session.begin_nested():
        result = await REGISTRY[tool].run(ctx, args)
    return result.model_dump(mode="json")


async def undo(ctx: ToolContext, tool: str, args: dict[str, Any], result: dict[str, Any] | None) -> str:
    compensation = REGISTRY[tool].compensation
    assert compensation is not None
    return await compensation(ctx, parse(tool, **args), result)


def invalid(tool: str, **raw: Any) -> str:
    with pytest.raises(ToolFailure) as failure:
        parse(tool, **raw)
    assert failure.value.code == "VALIDATION_ERROR"
    return failure.value.message


async def rows(
    ctx: ToolContext, collection: str, *filters: dict[str, Any], **extra: Any
) -> list[dict[str, Any]]:
    result = await call(ctx, "query_records", collection=collection, filters=list(filters), **extra)
    return list(result["records"])


async def record(ctx: ToolContext, collection: str, record_id: int) -> dict[str, Any]:
    return dict((await call(ctx, "get_record", collection=collection, id=record_id))["record"])


PEOPLE = ("leads", "contacts")


async def stored(ctx: ToolContext, model: type[Lead] | type[Notification]) -> int:
    """How many rows of `model` the tenant has, counted without the tools."""
    query = select(func.count()).select_from(model).where(model.tenant_id == ctx.tenant_id)
    return int(await ctx.session.scalar(query) or 0)


def where(field: str, op: str, value: Any) -> dict[str, Any]:
    return {"field": field, "op": op, "value": value}


@pytest.fixture
def acme(db_session: AsyncSession) -> ToolContext:
    return context(db_session)


@pytest.fixture
def globex(db_session: AsyncSession) -> ToolContext:
    return context(db_session, tenant="globex", user="erin", roles=["reviewer"])


# --- the whitelist -------------------------------------------------------------------------------


@pytest.mark.parametrize("collection", sorted(COLLECTIONS))
async def test_describe_collection_never_exposes_tenant_nor_writes_keys(
    acme: ToolContext, collection: str
) -> None:
    info = await call(acme, "describe_collection", collection=collection)
    fields = {f["name"]: f for f in info["fields"]}
    assert "tenant_id" not in fields and "id" in fields
    writable = {name for name, f in fields.items() if f["writable"]}
    assert bool(writable) == (collection in WRITABLE_COLLECTIONS) and not writable & NEVER_WRITABLE
    assert all(f["filter_ops"] for f in fields.values())


async def test_describe_collection_tells_types_choices_and_requirements(acme: ToolContext) -> None:
    fields = {
        f["name"]: f
        for f in (await call(acme, "describe_collection", collection="calendar_events"))["fields"]
    }
    assert fields["starts_at"]["type"] == "datetime" and fields["starts_at"]["required_on_create"]
    assert fields["attendees"] == fields["attendees"] | {
        "type": "string_list",
        "filter_ops": ["contains"],
        "sortable": False,
    }
    assert fields["status"]["choices"] == ["tentative", "confirmed", "cancelled"]
    assert fields["title"]["searchable"] and not fields["created_at"]["writable"]


def test_internal_columns_are_not_exposed() -> None:
    assert "workflow_id" not in COLLECTIONS["notifications"].fields
    assert "call_id" not in COLLECTIONS["notifications"].fields


@pytest.mark.parametrize(
    ("tool", "raw", "expected"),
    [
        ("query_records", {"collection": "users"}, "collection"),
        ("query_records", {"collection": "tool_executions"}, "collection"),
        ("get_record", {"collection": "api_tokens", "id": 1}, "collection"),
        (
            "query_records",
            {"collection": "leads", "filters": [where("tenant_id", "eq", "globex")]},
            "tenant_id",
        ),
        (
            "count_records",
            {"collection": "leads", "filters": [where("tenant_id", "ne", "acme")]},
            "tenant_id",
        ),
        ("query_records", {"collection": "leads", "order_by": [{"field": "tenant_id"}]}, "tenant_id"),
        (
            "query_records",
            {"collection": "leads", "filters": [where("title", "eq", "x")]},
            "no field 'title'",
        ),
        (
            "query_records",
            {"collection": "notifications", "filters": [where("call_id", "eq", "x")]},
            "call_id",
        ),
        (
            "query_records",
            {"collection": "leads", "filters": [where("name; drop table leads", "eq", 1)]},
            "field",
        ),
        ("search_text", {"query": "jane", "collections": ["leads", "users"]}, "collections"),
        (
            "write_record",
            {"collection": "leads", "id": 1, "values": [{"field": "tenant_id", "value": "globex"}]},
            "tenant_id",
        ),
        ("write_record", {"collection": "leads", "id": 1, "values": {"id": 7}}, "read-only"),
        ("write_record", {"collection": "tasks", "id": 1, "values": {"created_by": "x"}}, "read-only"),
        ("write_record", {"collection": "leads", "values": {"name": "No Email"}}, "needs email"),
        ("write_record", {"collection": "leads", "id": 1, "values": []}, "values"),
    ],
)
def test_names_outside_the_whitelist_are_validation_errors(
    tool: str, raw: dict[str, Any], expected: str
) -> None:
    assert expected in invalid(tool, **raw)


def test_an_identity_argument_is_refused() -> None:
    assert "tenant_id" in invalid("query_records", collection="leads", tenant_id="globex")


@pytest.mark.parametrize(
    ("filter_", "expected"),
    [
        (where("status", "eq", "bogus"), "not one of"),
        (where("due_date", "gt", "tomorrow"), "YYYY-MM-DD"),
        (where("project_id", "eq", "abc"), "integer"),
        (where("project_id", "eq", True), "integer"),
        (where("title", "in", "x"), "`in` takes a list"),
        (where("title", "in", []), "`in` takes a list"),
        (where("title", "eq", ["a"]), "only `in`"),
        (where("due_date", "contains", "2026"), "supports"),
        (where("due_date", "lt", None), "null only"),
    ],
)
def test_values_are_coerced_with_a_clear_error(filter_: dict[str, Any], expected: str) -> None:
    assert expected in invalid("query_records", collection="tasks", filters=[filter_])


@pytest.mark.parametrize("limit", [0, 101, -1])
def test_limit_bounds(limit: int) -> None:
    assert "limit" in invalid("query_records", collection="leads", limit=limit)


# --- reads -----------------------------------------------------------------------------------------


async def test_query_records_reads_only_the_callers_tenant(acme: ToolContext, globex: ToolContext) -> None:
    acme_leads, globex_leads = await rows(acme, "leads", limit=50), await rows(globex, "leads", limit=50)
    assert len(acme_leads) == await stored(acme, Lead) and len(globex_leads) == await stored(globex, Lead)
    assert not {r["id"] for r in acme_leads} & {r["id"] for r in globex_leads}
    assert all("tenant_id" not in r for r in acme_leads + globex_leads)
    jane = [r for r in globex_leads if r["email"] == "jane.doe@example.com"]
    assert [r["company"] for r in jane] == ["Doe & Daughters"]


@pytest.mark.parametrize(
    ("collection", "filter_", "expected"),
    [
        ("leads", where("status", "eq", "new"), {"Jane Doe", "Peter Gibbons"}),
        ("leads", where("status", "ne", "new"), {"John Smith", "Maria Garcia", "Li Wei"}),
        ("leads", where("status", "in", ["new", "qualified"]), {"Jane Doe", "Peter Gibbons", "Maria Garcia"}),
        ("leads", where("company", "contains", "INITECH"), {"John Smith"}),
        ("leads", where("email", "contains", "@hooli."), {"Li Wei"}),
        ("leads", where("name", "contains", "%"), set()),  # LIKE wildcards are literal
        ("leads", where("owner_user_id", "eq", None), {"Peter Gibbons"}),
        ("leads", where("name", "lt", "K"), {"Jane Doe", "John Smith"}),
        ("tasks", where("due_date", "lt", "2026-12-10"), {"Follow up with Initech"}),
        (
            "tasks",
            where("due_date", "lte", "2026-12-10"),
            {"Follow up with Initech", "Draft landing page copy"},
        ),
        (
            "tasks",
            where("due_date", "gt", "2026-12-10"),
            {"Review pricing page", "Build outbound target list"},
        ),
        (
            "tasks",
            where("due_date", "gte", "2026-12-14"),
            {"Review pricing page", "Build outbound target list"},
        ),
        ("tasks", where("due_date", "eq", None), {"Merge duplicate contacts"}),
        (
            "tasks",
            where("assignee_user_id", "ne", "alice"),
            {"Review pricing page", "Merge duplicate contacts"},
        ),
        (
            "calendar_events",
            where("attendees", "contains", "bob"),
            {"Website relaunch standup", "Pricing review", "Quarterly planning"},
        ),
        (
            "calendar_events",
            where("starts_at", "gte", "2026-12-09T14:00:00+00:00"),
            {"Pricing review", "Quarterly planning"},
        ),
        (
            "calendar_events",
            where("starts_at", "lt", "2026-12-07T10:01:00+01:00"),
            {"Intro call with Initech", "Website relaunch standup"},
        ),
    ],
)
async def test_each_filter_op(
    acme: ToolContext, collection: str, filter_: dict[str, Any], expected: set[str]
) -> None:
    found = await rows(acme, collection, filter_, limit=50)
    label = "title" if collection != "leads" else "name"
    assert {r[label] for r in found} == expected
    count = await call(acme, "count_records", collection=collection, filters=[filter_])
    assert count["count"] == len(expected)


async def test_ne_keeps_rows_where_the_field_is_empty(acme: ToolContext) -> None:
    found = await rows(acme, "leads", where("owner_user_id", "ne", "alice"))
    assert [r["name"] for r in found] == ["Peter Gibbons"]


async def test_filters_combine_and_order_and_limit_apply(acme: ToolContext) -> None:
    by_name = await rows(acme, "leads", order_by=[{"field": "name", "direction": "desc"}], limit=2)
    assert [r["name"] for r in by_name] == ["Peter Gibbons", "Maria Garcia"]
    ascending = await rows(acme, "leads", where("status", "ne", "disqualified"), order_by=[{"field": "name"}])
    assert [r["name"] for r in ascending] == ["Jane Doe", "John Smith", "Maria Garcia", "Peter Gibbons"]
    by_owner = await rows(
        acme, "tasks", order_by=[{"field": "assignee_user_id"}, {"field": "due_date", "direction": "desc"}]
    )
    assert [r["title"] for r in by_owner][:3] == [
        "Build outbound target list",
        "Draft landing page copy",
        "Follow up with Initech",
    ]
    assert len(await rows(acme, "contacts", limit=1)) == 1


async def test_records_are_json_with_iso_dates(acme: ToolContext) -> None:
    (event,) = await rows(acme, "calendar_events", where("title", "eq", "Pricing review"))
    assert event["starts_at"] == "2026-12-09T14:00:00Z" and event["attendees"] == ["bob", "carol"]
    assert set(event) == set(COLLECTIONS["calendar_events"].fields)


async def test_get_record_by_id_only_within_the_tenant(acme: ToolContext, globex: ToolContext) -> None:
    (jane,) = await rows(acme, "contacts", where("email", "eq", "jane.doe@example.com"))
    found = await call(acme, "get_record", collection="contacts", id=jane["id"])
    assert found["record"] == jane
    with pytest.raises(ToolFailure) as failure:
        await call(globex, "get_record", collection="contacts", id=jane["id"])
    assert failure.value.code == "NOT_FOUND"


async def test_count_records(acme: ToolContext, globex: ToolContext) -> None:
    assert (await call(acme, "count_records", collection="leads"))["count"] == await stored(acme, Lead)
    notifications = await call(globex, "count_records", collection="notifications")
    assert notifications["count"] == await stored(globex, Notification) >= 1
    qualified = await call(
        acme, "count_records", collection="leads", filters=[where("status", "eq", "qualified")]
    )
    assert qualified == {"collection": "leads", "count": 1}


# --- search_text -------------------------------------------------------------------------------------


async def test_search_text_finds_seeded_text_in_the_tenant_only(
    acme: ToolContext, globex: ToolContext
) -> None:
    """Both tenants hold Jane Doe: each sees its own (other tests may have committed more mentions)."""
    for ctx, company in ((acme, "Doe Consulting"), (globex, "Doe & Daughters")):
        hits = (await call(ctx, "search_text", query="jane.doe@example.com"))["hits"]
        people = {(h["collection"], h["record"]["company"]) for h in hits if h["collection"] in PEOPLE}
        assert people == {("leads", company), ("contacts", company)}
        other = globex if ctx is acme else acme
        for hit in hits:
            assert await record(ctx, hit["collection"], hit["id"]) == hit["record"]
            with pytest.raises(ToolFailure, match="no record"):
                await record(other, hit["collection"], hit["id"])


async def test_search_text_never_returns_other_tenants_rows(acme: ToolContext, globex: ToolContext) -> None:
    assert (await call(acme, "search_text", query="Springfield"))["hits"] == []
    springfield = (await call(globex, "search_text", query="Springfield"))["hits"]
    assert {(h["collection"], h["record"].get("name") or h["record"]["title"]) for h in springfield} == {
        ("projects", "Warehouse automation"),
        ("calendar_events", "Warehouse site visit"),
    }


async def test_search_text_ranks_and_understands_web_syntax(acme: ToolContext) -> None:
    hits = (await call(acme, "search_text", query="pricing"))["hits"]
    assert {h["collection"] for h in hits} >= {
        "projects",
        "tasks",
        "calendar_events",
        "notifications",
        "leads",
    }
    assert [h["rank"] for h in hits] == sorted((h["rank"] for h in hits), reverse=True)
    phrase = await call(
        acme, "search_text", query='"pricing page" -review', collections=["tasks", "projects"]
    )
    assert [h["record"]["name"] for h in phrase["hits"]] == ["Website relaunch"]
    assert (await call(acme, "search_text", query="pricing", limit=2))["count"] == 2
    assert (await call(acme, "search_text", query="!!!"))["hits"] == []


# --- write_record ------------------------------------------------------------------------------------


def test_write_record_is_declared_admin_only_high_risk_and_compensable() -> None:
    tool = REGISTRY["write_record"]
    assert tool.required_roles == ("admin",)
    assert (tool.risk, tool.category, tool.default_tier) == ("high", "write", "needs_approval")
    assert tool.compensation is not None
    for name in ("query_records", "get_record", "count_records", "describe_collection", "search_text"):
        assert (REGISTRY[name].risk, REGISTRY[name].category, REGISTRY[name].required_roles) == (
            "low",
            "read",
            (),
        )


async def test_write_record_refuses_a_non_admin_caller(globex: ToolContext) -> None:
    with pytest.raises(ToolFailure) as failure:
        await call(globex, "write_record", collection="leads", values={"name": "X", "email": "x@x.example"})
    assert failure.value.code == "FORBIDDEN"


async def test_update_and_its_compensation_restore_exactly(
    acme: ToolContext, db_session: AsyncSession
) -> None:
    (maria,) = await rows(acme, "leads", where("email", "eq", "maria.garcia@umbrella.example"))
    args = {
        "collection": "leads",
        "id": maria["id"],
        "values": [{"field": "status", "value": "converted"}, {"field": "notes", "value": None}],
    }
    result = await call(acme, "write_record", **args)
    assert result["created"] is False
    assert result["written"] == {"status": "converted", "notes": None}
    assert result["previous"] == {"status": "qualified", "notes": maria["notes"]}
    after = await record(acme, "leads", maria["id"])
    assert after["status"] == "converted" and after["updated_at"] >= maria["updated_at"]

    assert await undo(acme, "write_record", args, result) == "undone"
    restored = await record(acme, "leads", maria["id"])
    assert {k: v for k, v in restored.items() if k != "updated_at"} == {
        k: v for k, v in maria.items() if k != "updated_at"
    }
    assert await undo(acme, "write_record", args, result) == "already_undone"


async def test_update_compensation_leaves_a_record_changed_since(
    acme: ToolContext, db_session: AsyncSession
) -> None:
    (task,) = await rows(acme, "tasks", where("title", "eq", "Review pricing page"))
    args = {
        "collection": "tasks",
        "id": task["id"],
        "values": {"status": "in_progress", "due_date": "2026-12-20"},
    }
    result = await call(acme, "write_record", **args)
    assert result["written"] == {"status": "in_progress", "due_date": "2026-12-20"}
    await db_session.execute(update(Task).where(Task.id == task["id"]).values(status="done"))
    with pytest.raises(ToolFailure) as failure:
        await undo(acme, "write_record", args, result)
    assert failure.value.code == "CONFLICT" and "status" in failure.value.message
    assert (await record(acme, "tasks", task["id"]))["status"] == "done"


async def test_create_then_compensation_cancels_a_task(acme: ToolContext) -> None:
    args = {
        "collection": "tasks",
        "values": {"title": "Call Maria", "due_date": "2026-12-11", "assignee_user_id": "alice"},
    }
    result = await call(acme, "write_record", **args)
    assert result["created"] is True and result["previous"] is None
    created = await record(acme, "tasks", result["id"])
    assert created | {"status": "open", "created_by": "carol", "project_id": None} == created
    assert result["written"]["title"] == "Call Maria" and result["written"]["status"] == "open"

    assert await undo(acme, "write_record", args, result) == "undone"
    assert (await record(acme, "tasks", result["id"]))["status"] == "cancelled"
    assert await undo(acme, "write_record", args, result) == "already_undone"


async def test_create_then_compensation_deletes_a_lead(acme: ToolContext) -> None:
    args = {"collection": "leads", "values": {"email": "new.person@example.com", "name": "New Person"}}
    result = await call(acme, "write_record", **args)
    assert result["written"]["status"] == "new" and result["written"]["owner_user_id"] is None
    assert await undo(acme, "write_record", args, result) == "undone"
    with pytest.raises(ToolFailure):
        await call(acme, "get_record", collection="leads", id=result["id"])
    assert await undo(acme, "write_record", args, result) == "already_undone"
    assert await undo(acme, "write_record", args, None) == "never_happened"


async def test_create_compensation_leaves_a_record_changed_since(
    acme: ToolContext, db_session: AsyncSession
) -> None:
    args = {"collection": "contacts", "values": {"name": "Kim Ode", "email": "kim@ode.example"}}
    result = await call(acme, "write_record", **args)
    await call(acme, "write_record", collection="contacts", id=result["id"], values={"phone": "+1 555 0199"})
    with pytest.raises(ToolFailure) as failure:
        await undo(acme, "write_record", args, result)
    assert failure.value.code == "CONFLICT"
    assert (await record(acme, "contacts", result["id"]))["name"] == "Kim Ode"


async def test_compensation_refuses_a_redacted_before_image(acme: ToolContext) -> None:
    """What the audit keeps went through the guards: a redacted secret must not be written back."""
    (li,) = await rows(acme, "leads", where("name", "eq", "Li Wei"))
    await call(
        acme, "write_record", collection="leads", id=li["id"], values={"notes": "portal password: hunter2"}
    )
    args = {"collection": "leads", "id": li["id"], "values": {"notes": "no secrets here"}}
    recorded = sanitize(await call(acme, "write_record", **args))
    assert recorded["previous"]["notes"] == "portal [REDACTED]"
    with pytest.raises(ToolFailure) as failure:
        await undo(acme, "write_record", args, recorded)
    assert failure.value.code == "CONFLICT" and "redacted" in failure.value.message
    assert (await record(acme, "leads", li["id"]))["notes"] == "no secrets here"


@pytest.mark.parametrize(
    ("values", "code", "message"),
    [
        ({"email": "john.smith@initech.example", "name": "Dup"}, "CONFLICT", "already has this email"),
        (
            {"email": "x@y.example", "name": "X", "owner_user_id": "dave"},
            "VALIDATION_ERROR",  # globex's user
            "owner_user_id: no such user",
        ),
    ],
)
async def test_refused_writes_are_clear_failures(
    acme: ToolContext, values: dict[str, Any], code: str, message: str
) -> None:
    with pytest.raises(ToolFailure) as failure:
        await call(acme, "write_record", collection="leads", values=values)
    assert failure.value.code == code and message in failure.value.message
    assert "tenant" not in failure.value.message
    assert len(await rows(acme, "leads", limit=50)) == await stored(acme, Lead), "the session is usable"


async def test_update_of_another_tenants_record_is_not_found(acme: ToolContext, globex: ToolContext) -> None:
    (jane,) = await rows(globex, "leads", where("email", "eq", "jane.doe@example.com"))
    with pytest.raises(ToolFailure) as failure:
        await call(acme, "write_record", collection="leads", id=jane["id"], values={"status": "converted"})
    assert failure.value.code == "NOT_FOUND"


async def test_write_record_through_the_activity_is_idempotent(db_engine: AsyncEngine) -> None:
    sessions = session_factory(db_engine)
    invocation = ToolInvocation(
        caller=CallerContext(tenant_id="acme", user_id="carol", roles=["admin"], agent="admin-assistant"),
        workflow_id=f"wf-{uuid.uuid4()}",
        run_id="run-1",
        call_id="call-1",
        tool="write_record",
        arguments=json.dumps(
            {"collection": "leads", "values": {"email": f"{uuid.uuid4()}@example.com", "name": "Once Only"}}
        ),
        approved_by="bob",  # write_record needs an approval under the rules in force (activities/rules.py)
    )
    activities = ToolActivities(sessions)
    try:
        first = await activities.execute_tool(invocation)
        second = await activities.execute_tool(invocation)
        assert isinstance(first, ToolResult) and first.ok and second == first
        async with sessions() as session:
            created = await session.scalars(select(Lead.id).where(Lead.name == "Once Only"))
            assert list(created) == [first.data["id"]]
    finally:
        async with sessions() as session, session.begin():
            await session.execute(delete(Lead).where(Lead.name == "Once Only"))
            await session.execute(
                delete(ToolExecution).where(ToolExecution.workflow_id == invocation.workflow_id)
            )
