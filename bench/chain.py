"""The audit chain's cost per call (issue 38), against a real PostgreSQL.

    .venv/bin/python -m bench.chain [--calls 400]

Each call is what `record_unexecuted_call` does: one transaction inserting a `tool_executions`
row, once without the chain and once appending it to the tenant's chain (countersign.db.chain:
the advisory lock, the head read, the hash and the insert, in one
round trip to `audit_chain_append`). Measured: the time of `chain()` itself, and of
the whole transaction with and without it, one writer at a time (the machine is shared: a
sequential measure is the honest one). A PostgreSQL of its own (embedded, migrated and seeded)
unless DATABASE_URL is set. Prints a Markdown table for docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import delete
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.sections import run_to_the_end
from countersign.db.chain import chain
from countersign.db.engine import create_engine, session_factory
from countersign.db.schema import AuditChainRecord, Tenant, ToolExecution
from countersign.devstack.postgres import seeded_postgres
from countersign.runtime.ports import free_port


def row(tenant: str, n: int) -> dict[str, object]:
    return {
        "tenant_id": tenant, "agent": "operations", "user_id": "alice", "workflow_id": f"wf-{uuid.uuid4()}",
        "run_id": "run-1", "call_id": f"c{n}", "tool": "create_task", "risk": "medium", "category": "write",
        "args": {"title": f"Call back {n}"}, "result": {"ok": False, "error": {"code": "REJECTED"}},
        "outcome": "rejected", "decision_reason": "rejected by bob",
    }  # fmt: skip


def ms(samples: list[float], q: float) -> str:
    return f"{statistics.quantiles(samples, n=100)[int(q) - 1] * 1000:.2f}"


async def measure(
    sessions: async_sessionmaker[AsyncSession], tenant: str, calls: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {
        "transaction, no chain": [],
        "transaction with chain": [],
        "chain() alone": [],
    }

    async def once(n: int, chained: bool) -> None:
        async with sessions() as session, session.begin():
            inserted = await session.scalar(
                insert(ToolExecution).values(**row(tenant, n)).returning(ToolExecution)
            )
            if chained and inserted is not None:
                started = time.perf_counter()
                await chain(session, inserted)
                times["chain() alone"].append(time.perf_counter() - started)

    for n in range(calls):  # interleaved, so both see the same machine
        for chained in (False, True):
            started = time.perf_counter()
            await once(n * 2 + chained, chained)
            times["transaction with chain" if chained else "transaction, no chain"].append(
                time.perf_counter() - started
            )
    return times


async def run(url: str, calls: int) -> str:
    engine = create_engine(url)
    sessions = session_factory(engine)
    tenant = f"bench-chain-{uuid.uuid4().hex[:6]}"
    async with sessions.begin() as session:
        session.add(Tenant(id=tenant, name=tenant))
    try:
        await measure(sessions, tenant, 20)  # warm the pool and the plans
        times = await measure(sessions, tenant, calls)
    finally:
        async with engine.begin() as conn:
            for model in (AuditChainRecord, ToolExecution):
                await conn.execute(delete(model).where(model.tenant_id == tenant))
            await conn.execute(delete(Tenant).where(Tenant.id == tenant))
        await engine.dispose()
    lines = ["| measured (ms) | p50 | p95 | p99 |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {ms(s, 50)} | {ms(s, 95)} | {ms(s, 99)} |" for name, s in times.items()]
    return (
        f"{calls} calls per row, one writer at a time, the tenant's chain grown to {calls + 20} records\n\n"
        + "\n".join(lines)
    )


async def main(calls: int) -> None:
    url = os.environ.get("DATABASE_URL")
    if url:
        print(await run(url, calls))
        return
    with tempfile.TemporaryDirectory() as data:
        async with seeded_postgres(Path(data), free_port()) as own:
            print(await run(own, calls))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    run_to_the_end(main(parser.parse_args().calls))
