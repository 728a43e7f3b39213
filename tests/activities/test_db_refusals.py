"""What the database cannot hold never fails a write, and a statement it refuses is never retried.

Issue 12's class "tool errors retried for minutes or forever", where the error is PostgreSQL's: a
NaN in the model's arguments made the audit row's insert fail on every attempt, and the tool call
was retried for the database-outage tolerance (five minutes). Two parts close the class:

- every JSON column is written through `countersign.core.bounds.dumps_storable` (countersign/db/engine.py):
  any JSON value, whoever produced it, is stored (property below, against real PostgreSQL);
- `activities.failures.DatabaseRefusals`: a statement the database refuses for good fails its
  activity once, as `DatabaseRefused` without SQL, while an unreachable database is still retried.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, Table, insert, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from temporalio.client import WorkflowExecutionStatus

from activities.failures import refused_by_database
from activities.tools import ToolActivities
from countersign.core.bounds import dumps_storable, storable_json
from countersign.core.calls import ToolInvocation, ToolResult
from countersign.db.engine import create_engine, session_factory
from countersign.db.schema import Task
from countersign.scripted_model.server import ScriptedModelServer
from tests.e2e.test_compromised_model import (  # noqa: F401 (a fixture)
    acme_restored,
    audit_rows,
    script_turn,
)
from tests.fixtures.agent import running_agent
from tests.fixtures.temporal import failed_tasks
from tools.registry import Tool, ToolFailure
from workflows.options import DB_OUTAGE_TOLERANCE

PROBE = Table("json_probe", MetaData(), Column("id", Integer, primary_key=True), Column("v", JSONB))
# Text with what jsonb refuses besides any other character: NUL and lone surrogates.
TEXTS = st.text(st.one_of(st.characters(), st.sampled_from(["\x00", "\ud800", "\udfff"])), max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXTS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXTS, inner, max_size=4),
    max_leaves=25,
)


def same(stored: Any, expected: Any) -> bool:
    """Equal, numbers within float precision (jsonb keeps numbers as exact decimals)."""
    if isinstance(expected, float) or (isinstance(stored, float) and not isinstance(expected, bool)):
        return isinstance(stored, int | float) and math.isclose(stored, expected, rel_tol=1e-15)
    if isinstance(expected, dict):
        return stored.keys() == expected.keys() and all(same(stored[k], v) for k, v in expected.items())
    if isinstance(expected, list):
        return len(stored) == len(expected) and all(map(same, stored, expected))
    return bool(stored == expected and type(stored) is type(expected))


@pytest_asyncio.fixture(scope="module")
async def probe(database_url: str) -> AsyncIterator[AsyncEngine]:
    """The application's engine, and a table with one jsonb column."""
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    async with engine.begin() as conn:
        await conn.run_sync(PROBE.create)
    yield engine
    async with engine.begin() as conn:
        await conn.run_sync(PROBE.drop)
    await engine.dispose()


@pytest.mark.security
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON_VALUES)
@example(value={"description": math.inf})  # the model's arguments that were retried for five minutes
@example(value={"\x00": [math.nan, -math.inf, "\ud800"], "\ufffd": 2**63})
async def test_any_json_value_is_stored(probe: AsyncEngine, value: Any) -> None:
    async with probe.begin() as conn:
        stored = (await conn.execute(insert(PROBE).values(v=value).returning(PROBE.c.v))).scalar_one()
    assert same(stored, storable_json(value)), (stored, value)


@settings(max_examples=500, deadline=None, database=None)
@given(value=JSON_VALUES)
def test_the_fast_path_writes_what_the_walk_would(value: Any) -> None:
    assert dumps_storable(value) == json.dumps(storable_json(value), allow_nan=False)


def test_what_json_has_no_number_for_is_written_as_text_saying_what_it_was() -> None:
    assert storable_json([math.inf, -math.inf, math.nan, "a\x00", {"\ud800": 1}]) == [
        "Infinity",
        "-Infinity",
        "NaN",
        "a\ufffd",
        {"\ufffd": 1},
    ]


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def failure(engine: AsyncEngine, statement: str, **params: Any) -> BaseException:
    async with AsyncSession(engine) as session:
        try:
            await session.execute(text(statement), params)
        except Exception as exc:
            return exc
    raise AssertionError(f"{statement} did not fail")


@pytest.mark.parametrize(
    ("statement", "params", "refused"),
    [
        ("SELECT CAST('x' AS integer)", {}, "22P02"),  # a value the type cannot hold
        ("SELECT 1 / 0", {}, "22012"),
        ("SELECT CAST(:v AS int4)", {"v": 2**40}, "22000"),  # the driver cannot even encode it
        ("SELECT * FROM no_such_table", {}, "42P01"),
        ("INSERT INTO tenants (id, name) VALUES ('acme', 'again')", {}, "23505"),
        # a timeout, a cancelled or a serialization-failed statement can succeed next time
        ("SET LOCAL statement_timeout = 10; SELECT pg_sleep(1)", {}, None),
    ],
)
async def test_a_statement_the_database_refuses_for_good_is_named(
    db_engine: AsyncEngine, statement: str, params: dict[str, Any], refused: str | None
) -> None:
    parts = statement.split("; ")
    async with AsyncSession(db_engine) as session, session.begin():
        for part in parts[:-1]:
            await session.execute(text(part))
        try:
            await session.execute(text(parts[-1]), params)
        except Exception as exc:
            assert refused_by_database(exc) == refused, repr(exc)
        else:
            raise AssertionError(f"{statement} did not fail")


async def test_an_unreachable_database_is_not_a_refusal() -> None:
    engine = create_engine(f"postgresql+asyncpg://nobody@127.0.0.1:{unused_port()}/none")
    try:
        assert refused_by_database(await failure(engine, "SELECT 1")) is None
    finally:
        await engine.dispose()
    assert refused_by_database(ValueError("a bug, not the database")) is None


class RefusedAudit(ToolActivities):
    """The tool activities, with the audit row of every call carrying a turn number PostgreSQL's
    integer column cannot hold: the call's transaction is refused at commit, every attempt."""

    attempts = 0

    async def _run(
        self,
        session: AsyncSession,
        tool: Tool,
        invocation: ToolInvocation,
        refusal: ToolFailure | None = None,
    ) -> tuple[ToolResult, dict[str, Any]]:
        RefusedAudit.attempts += 1
        return await super()._run(session, tool, invocation.model_copy(update={"turn": 2**40}), refusal)


@pytest.mark.security
@pytest.mark.usefixtures("acme_restored")
async def test_a_tool_call_the_database_refuses_is_tried_once_and_audited(
    temporal_env: Any, database_url: str, db_engine: AsyncEngine, scripted_model: ScriptedModelServer
) -> None:
    tools = RefusedAudit(session_factory(db_engine))
    title = "refused by the database"
    async with running_agent(temporal_env, database_url, db_engine, scripted_model, tools) as agent:
        script_turn(agent, [("create_task", {"title": title})])
        handle = await agent.start("Add the task.", agent="operations", single_turn=True)
        await handle.result()
        described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.COMPLETED
    assert described.close_time and described.start_time
    assert described.close_time - described.start_time < DB_OUTAGE_TOLERANCE / 10  # no retry loop
    assert RefusedAudit.attempts == 1
    assert await failed_tasks(handle) == []
    [row] = await audit_rows(db_engine, handle.id)  # audited once, as the call that did not run
    assert row.outcome == "failed" and row.turn == 1
    assert row.error == "create_task was refused by the database; it did not run"
    async with db_engine.connect() as conn:  # the effect rolled back with the refused transaction
        assert not (await conn.execute(select(Task).where(Task.title == title))).first()


async def test_a_value_that_cannot_be_bound_is_a_refusal(probe: AsyncEngine) -> None:
    try:
        async with probe.begin() as conn:
            await conn.execute(insert(PROBE).values(v={"when": object()}))  # a bug: not JSON
    except Exception as exc:
        assert refused_by_database(exc) == "TypeError"
    else:
        raise AssertionError("an object was stored as JSON")
