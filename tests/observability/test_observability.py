"""Metrics, traces and the usage audit on real parts: a worker with COUNTERSIGN_METRICS_PORT's
endpoint on the time-skipping Temporal server, embedded PostgreSQL and the scripted model over HTTP;
/metrics scraped over HTTP, spans caught by OpenTelemetry's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from countersign.core.approvals import Decision
from countersign.core.calls import CallerContext, PolicyDecision, ToolInvocation, ToolSpec, outcome_of
from countersign.core.contract import StartConversation
from countersign.core.policy import PolicyCheck
from countersign.db.engine import session_factory
from countersign.db.schema import ModelCall
from countersign.observability import tracing
from countersign.observability.metrics import CountersignMetrics, WorkerMetrics
from countersign.runtime.config import PROJECT_ROOT, Settings
from countersign.runtime.ports import free_port
from countersign.scripted_model.server import ScriptedModelServer
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import ECHO_RESULT, pending, qualify
from tests.fixtures.postgres import reset_jane
from tests.fixtures.scripted_model import scenario_from
from tests.fixtures.updates import execute_update
from tests.workflows.test_agent_workflow import FIND_JANE
from worker import build_worker
from workflows.agent import AgentWorkflow

DASHBOARD = PROJECT_ROOT / "deploy" / "grafana" / "countersign-dashboard.json"
Sample = tuple[str, frozenset[tuple[str, str]]]


@pytest.fixture(scope="session")
def spans() -> InMemorySpanExporter:
    """The process's tracer provider (set once per process), exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@dataclass
class Observed:
    harness: AgentHarness
    url: str
    spans: InMemorySpanExporter


@pytest_asyncio.fixture
async def observed(
    temporal_env: WorkflowEnvironment,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
    spans: InMemorySpanExporter,
) -> AsyncIterator[Observed]:
    """A worker as `worker.py` runs it with COUNTERSIGN_METRICS_PORT and tracing on: a client on a
    runtime exporting the SDK's metrics, the tracing interceptor on that client, /metrics served."""
    port = free_port()
    metrics = WorkerMetrics(port, CountersignMetrics(), host="127.0.0.1")
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        namespace="default",
        data_converter=pydantic_data_converter,
        runtime=metrics.runtime,
        interceptors=[TracingInterceptor(trace.get_tracer("countersign"))],
    )
    settings = Settings(
        task_queue=f"agent-{uuid.uuid4()}", database_url=database_url, llm_base_url=scripted_model.base_url
    )
    harness = AgentHarness(client=client, settings=settings, model=scripted_model)
    await metrics.server.start()
    try:
        async with build_worker(client, settings, session_factory(db_engine), metrics=metrics.metrics):
            try:
                yield Observed(harness, f"http://127.0.0.1:{port}/metrics", spans)
            finally:
                await harness.terminate_leftovers()
    finally:
        await metrics.server.stop()


async def scrape(url: str) -> dict[Sample, float]:
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = await answer.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    """The sum of `name` over the samples carrying `labels` (other labels, e.g. the SDK's
    namespace and task queue, summed over)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


async def scrape_until(
    url: str, name: str, minimum: float, timeout_s: float = 5, **labels: str
) -> dict[Sample, float]:
    """Wait for a metric: workflow metrics reach the SDK's exporter asynchronously, and a worker
    process takes a while to listen."""
    for _ in range(int(timeout_s * 10)):
        try:
            samples = await scrape(url)
        except aiohttp.ClientConnectionError:
            samples = {}
        if value(samples, name, **labels) >= minimum:
            return samples
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name}{labels} never reached {minimum}")


async def test_metrics_count_a_conversation_with_an_approval(
    observed: Observed, db_engine: AsyncEngine
) -> None:
    agent = observed.harness
    before = await scrape(observed.url)
    agent.script(qualify(), ECHO_RESULT, *FIND_JANE)
    assert (await agent.converse("find jane")).turns == 1

    await reset_jane(db_engine)
    try:
        handle = await agent.start("qualify jane", single_turn=True)
        (waiting,) = (await pending(handle)).pending_approvals
        await execute_update(
            handle,
            AgentWorkflow.decide,
            Decision(call_id=waiting.call_id, decision="approve", approver="bob"),
        )
        await handle.result()
    finally:
        await reset_jane(db_engine)

    after = await scrape_until(observed.url, "countersign_turns_total", 2, stop="completed")

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for tool in ("search_leads", "get_lead", "update_lead_status"):
        assert grew("countersign_tool_calls_total", tool=tool, outcome="executed") == 1, tool
        assert grew("countersign_tool_duration_seconds_count", tool=tool, outcome="executed") == 1, tool
    assert value(after, "countersign_tool_duration_seconds_sum", tool="get_lead") > 0
    agent_name = "lead-qualifier"
    assert grew("countersign_model_tokens_total", agent=agent_name, kind="prompt") > 0
    assert grew("countersign_model_tokens_total", agent=agent_name, kind="completion") > 0
    assert grew("countersign_model_call_duration_seconds_count", agent=agent_name, outcome="ok") == 5
    assert grew("countersign_turns_total", agent=agent_name, stop="completed") == 2
    assert value(after, "countersign_approval_wait_seconds_count", risk="high", decision="approved") >= 1
    buckets = {dict(ls)["le"] for (n, ls) in after if n == "countersign_approval_wait_seconds_bucket"}
    assert {"60", "3600", "86400", "+Inf"} <= buckets, buckets  # human-scale buckets, in seconds
    assert value(after, "countersign_breaker_state", breaker="smtp", state="closed") == 1
    assert value(after, "countersign_breaker_state", breaker="smtp", state="open") == 0
    # the Temporal SDK's own metrics, from the same endpoint
    assert value(after, "temporal_workflow_completed_total") >= 2
    assert value(after, "temporal_activity_execution_latency_count", activity_type="execute_tool") >= 1
    # low cardinality: no workflow ids or tenants as labels
    label_names = {k for (_, ls) in after for k, _ in ls}
    assert not label_names & {"workflow_id", "run_id", "tenant", "tenant_id"}

    # the usage audit: one row per model call, with the turn it served
    async with db_engine.connect() as conn:
        rows = list(
            await conn.execute(
                select(ModelCall).where(ModelCall.workflow_id == handle.id).order_by(ModelCall.id)
            )
        )
    assert [(r.turn, r.tool_calls) for r in rows] == [(1, 1), (1, 0)]
    assert all(r.agent == agent_name and r.tenant_id == "acme" and r.prompt_tokens > 0 for r in rows)

    # the Grafana dashboard plots only metrics this endpoint exports
    exported = {n for (n, _) in after}
    exported |= {re.sub(r"_(bucket|count|sum)$", "", n) for n in exported}
    used = dashboard_metrics()
    assert used and used <= exported, used - exported


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return {m for e in exprs for m in re.findall(r"\b((?:countersign|temporal)_[a-z_]+)\b", e)}


def by_name(finished: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


async def test_one_trace_from_the_client_to_the_tool_activity(observed: Observed) -> None:
    agent = observed.harness
    observed.spans.clear()
    agent.script(*FIND_JANE)
    handle = await agent.start("find jane", single_turn=True)
    await handle.result()

    finished = observed.spans.get_finished_spans()
    (start,) = by_name(finished, "StartWorkflow:AgentWorkflow")
    trace_id = start.context.trace_id
    ours = [s for s in finished if s.context.trace_id == trace_id]
    names = {s.name for s in ours}
    assert {"RunWorkflow:AgentWorkflow", "RunActivity:call_model", "RunActivity:execute_tool"} <= names

    (tool,) = by_name(ours, "execute_tool get_lead")
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "get_lead"
    assert tool.attributes["gen_ai.tool.call.id"] == "c2"
    assert tool.attributes["countersign.tool.outcome"] == "executed"
    parents = {s.context.span_id: s for s in ours}
    chain = []
    span: ReadableSpan | None = tool
    while span is not None:
        chain.append(span.name)
        span = parents.get(span.parent.span_id) if span.parent else None
    assert chain[1] == "RunActivity:execute_tool" and chain[-1] == "StartWorkflow:AgentWorkflow", chain

    chats = [s for s in ours if s.name.startswith("chat ")]
    assert len(chats) == 3
    for chat in chats:
        assert chat.attributes is not None
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == agent.settings.llm_model
        assert int(chat.attributes["gen_ai.usage.input_tokens"]) > 0  # type: ignore[arg-type]
        assert int(chat.attributes["gen_ai.usage.output_tokens"]) >= 0  # type: ignore[arg-type]


def test_dashboard_is_valid_grafana_json() -> None:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "prometheus"


class OtlpReceiver:
    """An OTLP/HTTP endpoint that keeps the protobuf bodies POSTed to /v1/traces."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    async def _traces(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def test_worker_process_serves_metrics_and_exports_traces_over_otlp(
    temporal_env: WorkflowEnvironment, database_url: str, scripted_model: ScriptedModelServer, tmp_path: Path
) -> None:
    """`python worker.py` as operators run it: COUNTERSIGN_METRICS_PORT and OTEL_EXPORTER_OTLP_ENDPOINT
    in its environment, nothing else configured."""
    scripted_model.set_scenario(scenario_from({"name": "find jane", "rules": list(FIND_JANE)}))
    port, task_queue = free_port(), f"agent-{uuid.uuid4()}"
    async with OtlpReceiver() as otlp:
        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
            "TEMPORAL_NAMESPACE": "default",
            "TASK_QUEUE": task_queue,
            "DATABASE_URL": database_url,
            "LLM_BASE_URL": scripted_model.base_url,
            "COUNTERSIGN_DATA_DIR": str(tmp_path),
            "COUNTERSIGN_METRICS_PORT": str(port),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp.port}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "worker.py", cwd=PROJECT_ROOT, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            await scrape_until(url, "temporal_num_pollers", 1, timeout_s=60)
            start = StartConversation(
                tenant_id="acme",
                user_id="alice",
                agent="lead-qualifier",
                message="find jane",
                single_turn=True,
            )
            handle = await temporal_env.client.start_workflow(
                AgentWorkflow.run, start, id=f"test-{uuid.uuid4()}", task_queue=task_queue
            )
            assert (await handle.result()).turns == 1
            samples = await scrape(url)
            assert value(samples, "countersign_tool_calls_total", tool="get_lead", outcome="executed") == 1
            for _ in range(100):  # batched: exported within 100 ms of the spans ending
                if any(b"execute_tool get_lead" in body for body in otlp.bodies):
                    break
                await asyncio.sleep(0.1)
            exported = b"".join(otlp.bodies)
            for name in (b"execute_tool get_lead", b"RunActivity:call_model", b"gen_ai.usage.input_tokens"):
                assert name in exported, name
        finally:
            worker.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(worker.wait(), 15)
            except TimeoutError:
                worker.kill()
                await worker.wait()


def test_audit_rows_and_metrics_read_one_outcome_table() -> None:
    """What the audit writes and the metrics count: a call the access gate refused is `refused`
    whether it ran or was stopped; a tool's own FORBIDDEN `failed`, policy's `blocked`."""
    assert outcome_of(None, ran=True) == "executed"
    assert outcome_of("SCOPES_MISSING", ran=True) == outcome_of("SCOPES_MISSING", ran=False) == "refused"
    assert outcome_of("VALIDATION_ERROR", ran=True) == outcome_of("UNKNOWN_TOOL", ran=False) == "invalid"
    assert outcome_of("FORBIDDEN", ran=True) == "failed"
    assert outcome_of("FORBIDDEN", ran=False) == "blocked"
    assert outcome_of("REJECTED", ran=False) == "rejected"
    assert outcome_of("NOT_FOUND", ran=True) == outcome_of("INTERNAL_ERROR", ran=False) == "failed"


def test_labels_are_bounded_and_tenants_only_on_request() -> None:
    plain, per_tenant = (
        CountersignMetrics(),
        CountersignMetrics.from_env({"COUNTERSIGN_METRICS_TENANT_LABEL": "1"}),
    )
    for metrics in (plain, per_tenant):
        metrics.tool_call("acme", "get_lead", "executed", 0.02)
        metrics.tool_call("acme", "x" * 500, "invalid")  # a name the model made up
    text = plain.render().decode()
    assert 'countersign_tool_calls_total{outcome="executed",tool="get_lead"} 1.0' in text
    assert 'countersign_tool_calls_total{outcome="invalid",tool="unknown"} 1.0' in text
    assert "tenant" not in text and "xxx" not in text
    assert 'countersign_tool_calls_total{outcome="executed",tenant="acme",tool="get_lead"} 1.0' in (
        per_tenant.render().decode()
    )


def test_a_bad_metrics_port_stops_the_worker_with_the_reason() -> None:
    assert WorkerMetrics.from_env({}) is None
    for raw, reason in (("http", "must be a port number"), ("70000", "between 1 and 65535")):
        with pytest.raises(SystemExit, match=reason):
            WorkerMetrics.from_env({"COUNTERSIGN_METRICS_PORT": raw})


def test_tracing_is_off_without_an_otlp_endpoint() -> None:
    assert tracing.client_interceptors({}) == []
    assert tracing.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}) is None


POLICY_CHECK = PolicyCheck(
    invocation=ToolInvocation(
        caller=CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="lead-qualifier"),
        workflow_id="wf-1", run_id="r1", call_id="c1", tool="update_lead_status", arguments="{}",
    ),
    spec=ToolSpec(
        name="update_lead_status", description="", parameters={}, risk="high", category="write",
        tier="needs_approval",
    ),
)  # fmt: skip
FORBID = PolicyDecision(outcome="forbid", policy="never-qualify")


def test_each_policy_evaluation_is_a_metric_by_outcome() -> None:
    metrics = CountersignMetrics()
    metrics.observe("evaluate_policy", [POLICY_CHECK], FORBID, 0.0015)
    text = metrics.render().decode()
    assert 'countersign_policy_evaluation_seconds_bucket{le="0.002",outcome="forbid"} 1.0' in text
    assert 'countersign_policy_evaluation_seconds_bucket{le="0.001",outcome="forbid"} 0.0' in text


async def test_each_policy_evaluation_is_a_span_naming_the_policy() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    class Decides(ActivityInboundInterceptor):
        def __init__(self) -> None:  # the activity itself: answers the decision
            pass

        async def execute_activity(self, input: ExecuteActivityInput) -> Any:
            return FORBID

    spans = tracing._Spans(Decides(), "m", provider.get_tracer("t"))
    assert await spans._policy(None, POLICY_CHECK.invocation) == FORBID  # type: ignore[arg-type]
    (span,) = exporter.get_finished_spans()
    assert span.name == "policy update_lead_status"
    assert span.attributes is not None
    assert span.attributes["countersign.policy.outcome"] == "forbid"
    assert span.attributes["countersign.policy.id"] == "never-qualify"
