"""The policy gate's reads (countersign/db/policies.py `gate_reads`) against a real PostgreSQL: the sets, the
requester's roles and the history the sets name in one statement while the sets are unchanged,
and a set applied since is read in full (its history too), never decided on a stale guess."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import session_factory
from countersign.db.policies import gate_reads
from tests.fixtures.policies import ApplyPolicies
from tools.registry import REGISTRY

RULE = '@id("{}") forbid(principal, action == Countersign::Action::"search_leads", resource) when {{ {} }};'
COUNTED = RULE.format("c", "context.history.calls_today_by_tenant > 10000")
SUMMED = RULE.format("s", "context.history.sum_today_by_tenant.limit < 0")


@pytest.fixture
def statements(db_engine: AsyncEngine) -> Iterator[list[str]]:
    """Every statement the engine sends while the test runs."""
    sent: list[str] = []

    def record(*args: Any) -> None:
        sent.append(args[2])

    event.listen(db_engine.sync_engine, "before_cursor_execute", record)
    yield sent
    event.remove(db_engine.sync_engine, "before_cursor_execute", record)


async def test_the_gate_reads_in_one_statement_until_the_sets_change(
    db_engine: AsyncEngine, policies: ApplyPolicies, statements: list[str]
) -> None:
    async def read() -> tuple[Any, int]:
        before = len(statements)
        async with session_factory(db_engine)() as session:
            reads = await gate_reads(
                session,
                tenant_id="acme",
                user="alice",
                spec=REGISTRY["search_leads"].spec(),
                at=datetime.now(UTC),
            )
        return reads, len([s for s in statements[before:] if s.lstrip().upper().startswith("SELECT")])

    await policies(COUNTED)
    await read()  # this process may have seen other sets for acme: the guess is settled now
    reads, selects = await read()
    assert selects == 1
    assert reads is not None and "enforced" in reads.sets and "sales" in reads.roles
    assert set(reads.history.counts) == {"calls_today_by_tenant"} and reads.history.sums == {}

    await policies(SUMMED)  # the guess names the counter, the set now a sum: read again, in full
    reads, selects = await read()
    assert selects == 2
    assert reads is not None and reads.history.counts == {}
    assert set(reads.history.sums) == {("sum_today_by_tenant", "limit")}
    assert (await read())[1] == 1
