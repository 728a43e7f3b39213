"""Joins for parent entities (the database-agent design's "mandatory join resolution for parent
entities", issue 53): the schema map states each link (`tasks.project_id -> projects.id`) and the
admin assistant's instructions say to resolve a parent named in words before filtering its
children. On real parts (the time-skipping Temporal server, PostgreSQL, the scripted model over
HTTP): "the open tasks of project Apollo" is answered through the link, with exactly those tasks.
The links are held against the tables' foreign keys, so the map cannot name a link the database
does not have."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import Project, Task
from tests.fixtures.agent import AgentHarness
from tools.records import COLLECTIONS, schema_map

APOLLO_TASKS = ("Book the launch venue", "Order the mission patches")


@pytest.fixture
async def apollo(db_engine: AsyncEngine) -> AsyncIterator[tuple[int, str]]:
    """Project "Apollo <tag>" in acme with two open tasks, a done one, and an open task of another
    project: only the first two are its open tasks."""
    name = f"Apollo {uuid.uuid4().hex[:6]}"
    async with db_engine.begin() as conn:
        project_id = (
            await conn.execute(
                insert(Project).values(tenant_id="acme", name=name, status="active").returning(Project.id)
            )
        ).scalar_one()
        other = await conn.scalar(select(Project.id).where(Project.tenant_id == "acme", Project.name != name))
        rows: list[dict[str, Any]] = [
            *({"title": f"{t} ({name})", "status": "open", "project_id": project_id} for t in APOLLO_TASKS),
            {"title": f"Write the press kit ({name})", "status": "done", "project_id": project_id},
            {"title": f"Unrelated open task ({name})", "status": "open", "project_id": other},
        ]
        await conn.execute(
            insert(Task).values([{"tenant_id": "acme", "created_by": "tests", **r} for r in rows])
        )
    yield project_id, name
    async with db_engine.begin() as conn:
        await conn.execute(delete(Task).where(Task.title.endswith(f"({name})")))
        await conn.execute(delete(Project).where(Project.id == project_id))


def test_every_link_is_a_foreign_key_of_the_tables_and_every_key_between_collections_a_link() -> None:
    tables = {c.table.name: name for name, c in COLLECTIONS.items()}
    for name, c in COLLECTIONS.items():
        keyed = {
            element.parent.name: tables[element.column.table.name]
            for constraint in c.table.foreign_key_constraints
            for element in constraint.elements
            if element.column.table.name in tables and element.parent.name != "tenant_id"
        }
        for child, parent in keyed.items():
            assert c.links.get(child) == parent, f"{name}.{child} -> {parent}.id is not in the map"
        for child, linked in c.links.items():
            assert child in c.fields and linked in COLLECTIONS, (name, child, linked)
            assert child.endswith("_id") and c.kind(child) == "integer", (name, child)
    assert "tasks.project_id -> projects.id" in schema_map()


async def test_the_open_tasks_of_project_apollo_come_through_the_link(
    agent: AgentHarness, apollo: tuple[int, str]
) -> None:
    project_id, name = apollo
    find_parent = {
        "collection": "projects",
        "filters": [{"field": "name", "op": "contains", "value": name}],
        "order_by": [],
        "limit": 5,
    }
    children = {
        "collection": "tasks",
        "filters": [
            {"field": "project_id", "op": "eq", "value": project_id},
            {"field": "status", "op": "eq", "value": "open"},
        ],
        "order_by": [{"field": "title", "direction": "asc"}],
        "limit": 20,
    }
    agent.script(
        {"when": {"user_contains": "open tasks of project"},
         "reply": {"tool_calls": [{"name": "query_records", "arguments": find_parent}]}},
        {"when": {"after_tool": "query_records", "turn_calls": 1},
         "reply": {"tool_calls": [{"name": "query_records", "arguments": children}]}},
        {"when": {"after_tool": "query_records", "turn_calls": 2},
         "reply": {"content": "Two open tasks: the venue and the patches."}},
    )  # fmt: skip
    before = len(agent.model.requests)
    result = await agent.converse(f"What are the open tasks of project {name}?", agent="admin-assistant")
    assert (result.last_reply or "").endswith("Two open tasks: the venue and the patches.")
    first, second, third = agent.model.requests[before:]
    prompt = first["messages"][0]["content"]
    assert "tasks.project_id -> projects.id" in prompt  # the map states the link
    assert "resolve it to its id first, then filter its children by that id" in prompt  # the instruction
    found_parent = json.loads(second["messages"][-1]["content"])
    assert [r["id"] for r in found_parent["data"]["records"]] == [project_id]
    found = json.loads(third["messages"][-1]["content"])
    titles = [r["title"] for r in found["data"]["records"]]
    assert titles == [f"{t} ({name})" for t in sorted(APOLLO_TASKS)]
