"""What observability costs: metrics and spans per call, a scrape, the usage audit's insert per model
call, and `stats` over a large audit. Writes the `bench.observability` section of
docs/benchmark.md (bench/sections.py), leaving the rest of the file as it is.

    .venv/bin/python -m bench.observability [--rows 200000] [--markdown docs/benchmark.md]

Runs on an embedded PostgreSQL it starts itself (free port, temporary directory).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer, Tracer
from sqlalchemy import text

from bench.sections import put_section, run_to_the_end
from bench.stats import Summary
from countersign.core.calls import CallerContext, ToolInvocation, ToolResult
from countersign.db.engine import create_engine, session_factory
from countersign.devstack.postgres import seeded_postgres
from countersign.observability.metrics import CountersignMetrics
from countersign.observability.stats import collect
from countersign.observability.tracing import tool_attributes
from countersign.observability.usage import insert_model_call
from countersign.runtime.ports import free_port
from tools.registry import REGISTRY

OUTCOMES = ("executed", "failed", "invalid", "rejected", "expired", "blocked", "limit_reached")
RAN = ("executed", "failed", "invalid")


def per_call_us(fn: Callable[[], object], n: int) -> float:
    """Mean microseconds per call of `fn`, over `n` calls."""
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def invocation() -> ToolInvocation:
    caller = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="lead-qualifier")
    return ToolInvocation(
        caller=caller, workflow_id="w", run_id="r", call_id="c1", tool="get_lead", arguments="{}", turn=1
    )


def span_us(tracer: Tracer, n: int) -> float:
    attributes = tool_attributes(invocation())

    def one() -> None:
        with tracer.start_as_current_span("execute_tool get_lead", attributes=attributes) as span:
            span.set_attribute("countersign.tool.outcome", "executed")

    return per_call_us(one, n)


def in_process(n: int) -> dict[str, float]:
    metrics = CountersignMetrics()
    call, result = invocation(), ToolResult.success({"id": 1})
    observe = per_call_us(lambda: metrics.observe("execute_tool", [call], result, 0.004), n)
    for tool in REGISTRY:  # every tool with every outcome: the largest exposition there can be
        for outcome in OUTCOMES:  # (calls that ran have a duration; refused ones do not)
            metrics.tool_call("acme", tool, outcome, 0.01 if outcome in RAN else None)
    rendered = metrics.render()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter(), max_queue_size=n + 1))
    numbers = {
        "observe_us": observe,
        "render_us": per_call_us(metrics.render, 200),
        "render_kb": len(rendered) / 1024,
        "tools": len(REGISTRY),
        "span_sdk_us": span_us(provider.get_tracer("bench"), n),
        "span_off_us": span_us(NoOpTracer(), n),
    }
    provider.shutdown()
    return numbers


async def in_postgres(url: str, inserts: int, rows: int) -> dict[str, float]:
    engine = create_engine(url)
    sessions = session_factory(engine)
    try:
        samples = []
        for i in range(inserts):
            row = {
                "tenant_id": "acme",
                "agent": "lead-qualifier",
                "workflow_id": f"bench-{i // 5}",
                "turn": 1 + i % 5,
                "model": "scripted",
                "prompt_tokens": 700,
                "completion_tokens": 20,
                "tool_calls": 1,
                "finish_reason": "tool_calls",
                "duration_ms": 40,
                "attempt_key": f"bench:{i}",
            }
            started = time.perf_counter()
            await insert_model_call(sessions, row)
            samples.append((time.perf_counter() - started) * 1000)
        async with engine.begin() as conn:  # a large audit: `rows` tool calls over 30 days
            await conn.execute(
                text(
                    """INSERT INTO tool_executions (tenant_id, agent, user_id, workflow_id, run_id, call_id,
                           tool, args, result, outcome, duration_ms, created_at)
                       SELECT 'acme', 'lead-qualifier', 'alice', 'bench-' || (g / 10), 'r', 'c' || g,
                           (ARRAY['get_lead', 'search_leads', 'create_task', 'send_email'])[1 + g % 4],
                           '{}', CASE WHEN g % 9 = 0 THEN '{"ok": false, "error": {"code": "NOT_FOUND"}}'
                                      ELSE '{"ok": true}' END::jsonb,
                           CASE WHEN g % 9 = 0 THEN 'failed' ELSE 'executed' END, g % 200,
                           now() - (g % 720) * interval '1 hour'
                       FROM generate_series(1, :rows) g"""
                ),
                {"rows": rows},
            )
            await conn.execute(text("ANALYZE tool_executions"))
        timings = {}
        for label, window in (("stats_24h_ms", timedelta(hours=24)), ("stats_30d_ms", timedelta(days=30))):
            runs = []
            for _ in range(5):
                started = time.perf_counter()
                async with sessions() as session:
                    await collect(session, datetime.now(UTC) - window, "acme")
                runs.append((time.perf_counter() - started) * 1000)
            timings[label] = Summary.of(runs).p50
        insert = Summary.of(samples)
        return {"insert_p50_ms": insert.p50, "insert_p95_ms": insert.p95, "rows": rows, **timings}
    finally:
        await engine.dispose()


def section(numbers: dict[str, float]) -> str:
    n = numbers
    return f"""## Observability overhead

Measured by `python -m bench.observability` on this machine (2 shared cores), in process and on an
embedded PostgreSQL.

| what | cost |
|---|---|
| metrics per tool call (`MetricsInterceptor`: counter + histogram) | {n["observe_us"]:.1f} µs |
| a span per call, tracing on (SDK provider, batch processor) | {n["span_sdk_us"]:.1f} µs |
| a span per call, tracing off (no-op tracer) | {n["span_off_us"]:.2f} µs |
| our part of a scrape, {n["tools"]:.0f} tools with every outcome | {n["render_us"] / 1000:.2f} ms, \
{n["render_kb"]:.0f} KB |
| usage audit: the `model_calls` insert after each model reply, p50 / p95 | {n["insert_p50_ms"]:.2f} / \
{n["insert_p95_ms"]:.2f} ms |
| `stats --since 24h` over {n["rows"]:,.0f} audited tool calls (30 days) | {n["stats_24h_ms"]:.0f} ms |
| `stats --since 30d` over the same | {n["stats_30d_ms"]:.0f} ms |

Per tool call, metrics and a span cost microseconds against the milliseconds of the call's own
transaction; the one addition in the database is the usage row per model call, which comes after
the reply (a model call takes hundreds of milliseconds to seconds). `stats` aggregates in PostgreSQL
on the `(tenant_id, created_at)` index: its time grows with the rows in the window, not the table.
"""


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="audited tool calls for `stats`")
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmark.md"))
    args = parser.parse_args()
    numbers = in_process(20_000)
    with tempfile.TemporaryDirectory() as tmp:
        async with seeded_postgres(Path(tmp), free_port()) as url:
            numbers |= await in_postgres(url, 500, args.rows)
    body = section(numbers)
    put_section(args.markdown, "bench.observability", body)
    print(body)


if __name__ == "__main__":
    run_to_the_end(main())
