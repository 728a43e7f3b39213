"""The admin assistant's read list and write list, apart, and the schema map its prompt carries.

The lists are checked where the arguments are validated (the same `validate` the tool activity
runs), so a refused write never reaches a reviewer; reads run on the real PostgreSQL and seed data.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from temporalio.testing import ActivityEnvironment

from activities.context import ContextActivities
from countersign.core.calls import CallerContext
from countersign.core.contract import StartConversation
from countersign.db.engine import session_factory
from countersign.db.schema import Base
from tools import REGISTRY
from tools.arguments import validate
from tools.records import (
    COLLECTIONS,
    READ_ONLY_COLLECTIONS,
    SCHEMA_MAP_TOKENS,
    WRITABLE_COLLECTIONS,
    ReadOnlyCollection,
    schema_map,
)
from tools.registry import ToolContext, ToolFailure

READ_TOOLS = ("query_records", "count_records", "describe_collection")
# Tables that hold the house's own bookkeeping: people, permissions, approvals, proofs, audit,
# tokens, conversations. Neither list may name one.
INTERNAL = sorted(set(Base.metadata.tables) - set(COLLECTIONS))


def refusal(tool: str, **raw: Any) -> str:
    with pytest.raises(ToolFailure) as failure:
        validate(REGISTRY[tool], json.dumps(raw))
    assert failure.value.code == "VALIDATION_ERROR"
    return failure.value.message


def a_write(collection: str) -> dict[str, Any]:
    return {"collection": collection, "id": 1, "values": [{"field": "status", "value": "open"}]}


def test_the_lists_are_apart_and_cover_the_whitelist() -> None:
    assert set(WRITABLE_COLLECTIONS).isdisjoint(READ_ONLY_COLLECTIONS)
    assert set(WRITABLE_COLLECTIONS) | set(READ_ONLY_COLLECTIONS) == set(COLLECTIONS)
    assert len(WRITABLE_COLLECTIONS) == 5 and len(READ_ONLY_COLLECTIONS) >= 5
    for name in READ_ONLY_COLLECTIONS:
        assert COLLECTIONS[name].writable == ()
    internal = {"users", "user_roles", "approval_decisions", "proof_checks", "input_audit", "api_tokens",
                "inbox_sessions", "tool_executions", "agent_tool_permissions"}  # fmt: skip
    assert internal <= set(INTERNAL)


@pytest.mark.parametrize("collection", READ_ONLY_COLLECTIONS)
def test_a_write_to_a_read_only_collection_is_a_clear_tool_error(collection: str) -> None:
    message = refusal("write_record", **a_write(collection))
    assert f"{collection} is read-only" in message
    assert all(name in message for name in WRITABLE_COLLECTIONS)  # says what can be written


def test_the_write_schema_offers_only_the_write_list() -> None:
    schema = REGISTRY["write_record"].spec().parameters
    assert schema["properties"]["collection"]["enum"] == list(WRITABLE_COLLECTIONS)
    for tool in READ_TOOLS:
        offered = REGISTRY[tool].spec().parameters["properties"]["collection"]["enum"]
        assert set(offered) == set(COLLECTIONS)


@given(st.sampled_from(INTERNAL) | st.sampled_from(sorted(COLLECTIONS)) | st.text(max_size=40))
def test_every_name_is_read_and_written_only_as_its_list_says(name: str) -> None:
    """Property: for any collection name, a read validates iff the name is whitelisted, a write
    iff it is in the write list; everything else is a VALIDATION_ERROR, never an exception."""
    for tool in READ_TOOLS:
        try:
            validate(REGISTRY[tool], json.dumps({"collection": name}))
            read = True
        except ToolFailure as failure:
            assert failure.code == "VALIDATION_ERROR"
            read = False
        assert read == (name in COLLECTIONS)
    try:
        validate(REGISTRY["write_record"], json.dumps(a_write(name) | {"values": {"notes": "x"}}))
        written = True
    except ToolFailure as failure:
        assert failure.code == "VALIDATION_ERROR"
        assert name not in WRITABLE_COLLECTIONS or "notes" in failure.message  # a field problem only
        written = name in WRITABLE_COLLECTIONS and "notes" in failure.message
    assert written == (name in WRITABLE_COLLECTIONS)


@pytest.mark.parametrize("collection", READ_ONLY_COLLECTIONS)
async def test_read_only_collections_are_read_in_the_tenant_only(
    db_session: AsyncSession, collection: ReadOnlyCollection
) -> None:
    ctx = ToolContext(
        caller=CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="admin-assistant"),
        session=db_session,
        workflow_id=f"wf-{uuid.uuid4()}",
        call_id="c1",
        now=datetime.now(UTC),
    )
    args = validate(REGISTRY["query_records"], json.dumps({"collection": collection, "limit": 50}))
    result = (await REGISTRY["query_records"].run(ctx, args)).model_dump(mode="json")
    assert result["collection"] == collection
    for row in result["records"]:
        assert set(row) == set(COLLECTIONS[collection].fields)  # no tenant, no internal column


# --- the schema map -------------------------------------------------------------------------------


def test_the_schema_map_is_bounded_deterministic_and_complete() -> None:
    text = schema_map()
    assert len(text) // 4 + 1 < SCHEMA_MAP_TOKENS  # the estimate the context window uses
    schema_map.cache_clear()
    assert schema_map() == text
    lines = text.splitlines()[1:-1]  # between the header and the links
    assert [line.split(" ", 2)[1] for line in lines] == list(COLLECTIONS)
    assert text.splitlines()[-1].startswith("Links (a child's field holds its parent's id): tasks.project_id")
    for line, (name, c) in zip(lines, COLLECTIONS.items(), strict=True):
        assert ("WRITABLE" in line) == (name in WRITABLE_COLLECTIONS)
        for field in c.fields:
            assert f" {field}:" in line
        for field, values in c.choices.items():
            assert f"{field}:text={'|'.join(values)}" in line
    assert "tenant_id" not in text and "idempotency_key" not in text


@pytest.mark.parametrize(("agent", "mapped"), [("admin-assistant", True), ("operations", False)])
async def test_the_prompt_carries_the_map_for_agents_with_record_tools(
    db_engine: AsyncEngine, agent: str, mapped: bool
) -> None:
    activities = ContextActivities(session_factory(db_engine))
    start = StartConversation(tenant_id="acme", user_id="carol", agent=agent)
    context = await ActivityEnvironment().run(activities.load_conversation_context, start)
    assert (schema_map() in context.agent.system_prompt) is mapped
