"""Countersign's own Prometheus metrics and the worker's `/metrics` endpoint.

With COUNTERSIGN_METRICS_PORT set, the worker serves `http://0.0.0.0:PORT/metrics`: Countersign's
metrics (a prometheus-client registry, filled by `MetricsInterceptor` around every activity) followed
by the Temporal SDK's. The SDK's come from the Rust core's own Prometheus exporter (`PrometheusConfig`
on the runtime the client is connected with), bound to a loopback port and fetched per scrape.

Why a merge of two expositions rather than one registry: the core's exporter already renders the
SDK's metrics, and the workflow's replay-safe `workflow.metric_meter()` metrics, exactly (buckets,
`_total` suffixes); draining a `MetricBuffer` into prometheus-client instead would mean re-deriving
counters and histograms from raw updates and a polling loop that drops updates when it falls behind.
Our own metrics stay in prometheus-client for what the core's meter lacks: values computed at scrape
time (the SMTP circuit breaker's state) and fixed bucket lists per metric.

Cardinality is bounded: labels are tool names (names the model made up count as `unknown`), agent
profiles, outcomes and risks. Tenants become a label only with COUNTERSIGN_METRICS_TENANT_LABEL=1;
workflow ids never do.
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter as Counter_
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from temporalio import activity
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from countersign.core.activity_refs import CALL_MODEL, EVALUATE_POLICY, EXECUTE_TOOL, RECORD_UNEXECUTED_CALL
from countersign.core.calls import (
    PolicyDecision,
    StoredResult,
    ToolInvocation,
    ToolResult,
    UnexecutedCall,
    outcome_of,
)
from countersign.core.messages import ModelReply, ModelRequest
from countersign.core.policy import PolicyCheck
from countersign.observability.workflow_metrics import (
    APPROVAL_WAIT,
    APPROVAL_WAIT_BUCKETS,
    HISTORY_BYTES,
    HISTORY_BYTES_BUCKETS,
)
from countersign.runtime.circuit import CircuitBreaker
from countersign.runtime.logs import get_logger
from countersign.runtime.ports import free_port
from tools.registry import REGISTRY

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A policy evaluation: a few database reads and Cedar's (sub-millisecond) decision.
POLICY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BREAKER_STATES = ("closed", "open", "half_open")
log = get_logger("countersign.metrics")

# No `<name>_created` series: in the text format Prometheus ingests each as one more series per
# label set (a third more lines to scrape) and nothing here reads them. Process-wide, as the
# library offers it; the worker process has no other prometheus-client registry.
disable_created_metrics()  # type: ignore[no-untyped-call]


def tool_label(name: str) -> str:
    """A registered tool's name, or `unknown`: the model may name any tool, the label may not."""
    return name if name in REGISTRY else "unknown"


class _BreakerCollector(Collector):
    """`countersign_breaker_state{breaker, state}`: 1 for the state each breaker is in right now, and
    `countersign_breaker_retry_seconds{breaker}`: how long an open one still refuses calls; read at
    scrape time (an open breaker turns half-open by the clock, with no call to notice) from
    `sources`, each naming the breakers it has now (an MCP pool makes one per server it calls)."""

    def __init__(self, sources: list[Callable[[], Iterable[CircuitBreaker]]]) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "countersign_breaker_state",
            "Circuit breaker state: 1 for the current state (closed, open, half_open)",
            labels=["breaker", "state"],
        )
        retry = GaugeMetricFamily(
            "countersign_breaker_retry_seconds",
            "Seconds an open circuit breaker still refuses calls before it lets a probe through",
            labels=["breaker"],
        )
        for breaker in (b for source in self._sources for b in source()):
            current = breaker.state
            for state in BREAKER_STATES:
                family.add_metric([breaker.name, state], 1.0 if state == current else 0.0)
            retry.add_metric([breaker.name], breaker.retry_in)
        yield family
        yield retry


# (tenant, agent, rating) -> how many replies people rated so, as PostgreSQL holds them
RatingTotals = Mapping[tuple[str, str, str], int]


class _RatingsCollector(Collector):
    """`countersign_reply_ratings_total{agent, rating}`: the replies people rated helpful or not
    (countersign.db.ratings), as PostgreSQL holds them at the scrape. The server records ratings,
    not a worker, so every worker reports the same totals: aggregate them with max, not sum."""

    def __init__(self, metrics: CountersignMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        tenant = ["tenant"] if self._metrics.tenant_label else []
        family = CounterMetricFamily(
            "countersign_reply_ratings",
            "Agent replies people rated, by agent and rating (helpful, not_helpful)",
            labels=[*tenant, "agent", "rating"],
        )
        totals: Counter_[tuple[str, ...]] = Counter_()
        for (tenant_id, agent, rating), n in self._metrics.rating_totals.items():
            totals[(*self._metrics._tenant(tenant_id), agent, rating)] += n
        for labels, n in sorted(totals.items()):
            family.add_metric(list(labels), n)
        yield family


class CountersignMetrics:
    """Countersign's metrics in their own registry (not the process-global one: tests and several
    workers in one process each get theirs)."""

    def __init__(self, *, tenant_label: bool = False) -> None:
        self.tenant_label = tenant_label
        self.registry = CollectorRegistry(auto_describe=True)
        tenant = ["tenant"] if tenant_label else []
        self.tool_calls = Counter(
            "countersign_tool_calls",
            "Tool calls by tool and audit outcome (executed, failed, invalid, refused, rejected, "
            "expired, blocked, limit_reached)",
            [*tenant, "tool", "outcome"],
            registry=self.registry,
        )
        self.tool_duration = Histogram(
            "countersign_tool_duration_seconds",
            "Time a tool call's activity took, by tool and outcome",
            ["tool", "outcome"],
            buckets=TOOL_BUCKETS,
            registry=self.registry,
        )
        self.tool_needs = Counter(
            "countersign_tool_needs",
            "Tool calls answered with `needs` (the tool asked for clarification)",
            [*tenant, "tool"],
            registry=self.registry,
        )
        self.model_tokens = Counter(
            "countersign_model_tokens",
            "Model tokens by agent and kind (prompt, completion)",
            [*tenant, "agent", "kind"],
            registry=self.registry,
        )
        self.model_calls = Histogram(
            "countersign_model_call_duration_seconds",
            "Time a model call took, by agent and outcome (ok, error)",
            ["agent", "outcome"],
            buckets=MODEL_BUCKETS,
            registry=self.registry,
        )
        self.policy_evaluations = Histogram(
            "countersign_policy_evaluation_seconds",
            "Time the policy gate took for one call (policy sets read, history counts, Cedar), by outcome "
            "(forbid, permit_run, permit_approvals, no_match)",
            ["outcome"],
            buckets=POLICY_BUCKETS,
            registry=self.registry,
        )
        self._breakers: list[Callable[[], Iterable[CircuitBreaker]]] = []
        self.registry.register(_BreakerCollector(self._breakers))
        self._ratings: Callable[[], Awaitable[RatingTotals]] | None = None
        self.rating_totals: RatingTotals = {}
        self.registry.register(_RatingsCollector(self))

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> CountersignMetrics:
        return cls(
            tenant_label=env.get("COUNTERSIGN_METRICS_TENANT_LABEL", "").lower() in ("1", "true", "yes")
        )

    def watch_breakers(self, source: Callable[[], Iterable[CircuitBreaker]]) -> None:
        """Report the breakers `source` names at each scrape."""
        self._breakers.append(source)

    def watch_ratings(self, source: Callable[[], Awaitable[RatingTotals]]) -> None:
        """Read the ratings' totals from `source` before each scrape (`refresh`)."""
        self._ratings = source

    async def refresh(self) -> None:
        """What is read at scrape time from outside the process: the ratings' totals. When the
        database does not answer, the last totals read stay (a scrape never fails for them)."""
        if self._ratings is None:
            return
        try:
            self.rating_totals = await self._ratings()
        except (OSError, SQLAlchemyError) as exc:
            log.warning("reply ratings unread at this scrape", error=type(exc).__name__)

    def _tenant(self, tenant_id: str) -> list[str]:
        return [tenant_id] if self.tenant_label else []

    def tool_call(self, tenant_id: str, tool: str, outcome: str, seconds: float | None = None) -> None:
        name = tool_label(tool)
        self.tool_calls.labels(*self._tenant(tenant_id), name, outcome).inc()
        if seconds is not None:
            self.tool_duration.labels(name, outcome).observe(seconds)

    def observe(self, activity_type: str, args: list[Any], result: Any, seconds: float) -> None:
        """Count what one activity that returned did, from its input and result."""
        arg = args[0] if args else None
        if activity_type == EXECUTE_TOOL.name and isinstance(arg, ToolInvocation):
            if isinstance(result, ToolResult | StoredResult):
                self.tool_call(arg.caller.tenant_id, arg.tool, outcome_of(result.code, ran=True), seconds)
                if result.needs is not None:
                    self.tool_needs.labels(*self._tenant(arg.caller.tenant_id), tool_label(arg.tool)).inc()
        elif activity_type == RECORD_UNEXECUTED_CALL.name and isinstance(arg, UnexecutedCall):
            self.tool_call(
                arg.invocation.caller.tenant_id, arg.invocation.tool, outcome_of(arg.result.code, ran=False)
            )
        elif activity_type == CALL_MODEL.name and isinstance(arg, ModelRequest):
            self.model_call(arg, result if isinstance(result, ModelReply) else None, seconds)
        elif activity_type == EVALUATE_POLICY.name and isinstance(arg, PolicyCheck):
            if isinstance(result, PolicyDecision):
                self.policy_evaluations.labels(result.outcome).observe(seconds)

    def model_call(self, request: ModelRequest, reply: ModelReply | None, seconds: float) -> None:
        caller = request.caller
        agent = caller.agent if caller else "unknown"
        self.model_calls.labels(agent, "ok" if reply else "error").observe(seconds)
        if reply is not None:
            tenant = self._tenant(caller.tenant_id if caller else "unknown")
            self.model_tokens.labels(*tenant, agent, "prompt").inc(reply.usage.prompt_tokens)
            self.model_tokens.labels(*tenant, agent, "completion").inc(reply.usage.completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsInterceptor(Interceptor):
    """Worker interceptor: counts tool calls (executed ones in `execute_tool`, refused, rejected and
    expired ones in `record_unexecuted_call`, with the audit's outcome names) and model calls.

    An attempt that raises counts as no tool call (the Temporal SDK counts activity failures); a
    model call that raises counts in the duration histogram as `error`.
    """

    def __init__(self, metrics: CountersignMetrics) -> None:
        self._metrics = metrics

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Observe(next, self._metrics)


class _Observe(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, metrics: CountersignMetrics) -> None:
        super().__init__(next)
        self._metrics = metrics

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        activity_type = activity.info().activity_type
        args = list(input.args)
        started = time.perf_counter()
        try:
            result = await super().execute_activity(input)
        except BaseException:
            if activity_type == CALL_MODEL.name:
                self._metrics.observe(activity_type, args, None, time.perf_counter() - started)
            raise
        self._metrics.observe(activity_type, args, result, time.perf_counter() - started)
        return result


def sdk_runtime(bind_address: str) -> Runtime:
    """A Temporal runtime whose core serves the SDK's metrics (and the workflows' own) in Prometheus
    format at `bind_address`: counters end in `_total`, durations are seconds."""
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(
                bind_address=bind_address,
                counters_total_suffix=True,
                durations_as_seconds=True,
                histogram_bucket_overrides={
                    APPROVAL_WAIT: list(APPROVAL_WAIT_BUCKETS),
                    HISTORY_BYTES: list(HISTORY_BYTES_BUCKETS),
                },
            )
        )
    )


class MetricsServer:
    """`GET /metrics` on `host:port`: Countersign's metrics, then the SDK's from `sdk_url`.

    If the SDK's exporter cannot be read, Countersign's are still served, with a comment saying
    why: a scrape never fails for half its content.
    """

    def __init__(self, metrics: CountersignMetrics, sdk_url: str, host: str, port: int) -> None:
        self._metrics = metrics
        self._sdk_url = sdk_url
        self._host, self._port = host, port
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _scrape(self, request: web.Request) -> web.Response:
        await self._metrics.refresh()
        own = self._metrics.render()
        assert self._session is not None
        try:
            async with self._session.get(self._sdk_url) as answer:
                answer.raise_for_status()
                sdk = await answer.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            sdk = f"# temporal sdk metrics unavailable: {type(exc).__name__}\n".encode()
        return web.Response(body=own + sdk, headers={"Content-Type": CONTENT_TYPE})

    async def start(self) -> int:
        """Serve, and answer the port served on. A port another process holds (a second worker on
        the same host: a deploy runs the new build beside the old one) is no reason to stop the
        worker: its metrics go on a free port instead, said in the log, rather than a crash."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        app = web.Application()
        app.router.add_get("/metrics", self._scrape)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self._host, self._port).start()
        except OSError as taken:
            if taken.errno != errno.EADDRINUSE:
                raise
            await web.TCPSite(self._runner, self._host, 0).start()
            log.warning(
                "metrics port taken; serving on a free port instead",
                wanted=self._port,
                port=self.port,
                hint="another worker on this host holds COUNTERSIGN_METRICS_PORT: give each its own",
            )
        return self.port

    @property
    def port(self) -> int:
        """The port metrics are served on (after `start`)."""
        assert self._runner is not None
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


class WorkerMetrics:
    """Everything metrics need in one worker process: the runtime to connect the client with, the
    registry and interceptor to build the worker with, and the server to start."""

    def __init__(self, port: int, metrics: CountersignMetrics, *, host: str = "0.0.0.0") -> None:
        sdk_address = f"127.0.0.1:{free_port()}"
        self.metrics = metrics
        self.runtime = sdk_runtime(sdk_address)
        self.interceptor = MetricsInterceptor(self.metrics)
        self.server = MetricsServer(self.metrics, f"http://{sdk_address}/metrics", host, port)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> WorkerMetrics | None:
        raw = env.get("COUNTERSIGN_METRICS_PORT", "").strip()
        if not raw:
            return None
        try:
            port = int(raw)
        except ValueError:
            raise SystemExit(f"worker: COUNTERSIGN_METRICS_PORT must be a port number, not {raw!r}") from None
        if not 0 < port < 65536:
            raise SystemExit(f"worker: COUNTERSIGN_METRICS_PORT must be between 1 and 65535, not {port}")
        return cls(port, CountersignMetrics.from_env(env))
