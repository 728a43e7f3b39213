"""OpenTelemetry traces: client → workflow → every activity, model and tool calls described.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT is set; then spans go over OTLP/HTTP (protobuf) to it, e.g.
`http://localhost:4318` (the exporter adds `/v1/traces`), under OTEL_SERVICE_NAME (default
`countersign`). The exporter reads the other standard OTEL_EXPORTER_OTLP_* variables (headers,
timeout) itself.

The Temporal SDK's `TracingInterceptor` (temporalio.contrib.opentelemetry) does the propagation:
on the client it opens `StartWorkflow:…` / `SignalWorkflow:…` spans and puts their context in the
headers; the worker, which inherits the client's interceptors, continues the trace in
`RunWorkflow:…`, `StartActivity:…` and `RunActivity:…`. It is chosen over the SDK's newer
`OpenTelemetryPlugin`, which is experimental and only shows workflow spans once the workflow
completes: a conversation runs for hours.

`GenAiSpans`, a worker interceptor inside it, adds a span per model call with the GenAI semantic
conventions (`gen_ai.request.model`, `gen_ai.usage.input_tokens`, …) and one per tool call with the
tool's name, call id and outcome.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from temporalio import activity
from temporalio.contrib.opentelemetry import TracingInterceptor
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
from countersign.observability import ENDPOINT_ENV

TRACER_NAME = "countersign"

_provider: TracerProvider | None = None


def configure(env: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """The process's tracer provider exporting over OTLP, set up once; None when tracing is off."""
    global _provider
    if _provider is None and env.get(ENDPOINT_ENV, "").strip():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        service = env.get("OTEL_SERVICE_NAME") or "countersign"
        _provider = TracerProvider(resource=Resource.create({"service.name": service}))
        _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(_provider)
    return _provider


def shutdown() -> None:
    """Export the spans still batched (a CLI process exits right after its command)."""
    if _provider is not None:
        _provider.shutdown()


def client_interceptors(env: Mapping[str, str] = os.environ) -> list[TracingInterceptor]:
    """The client's interceptors: the SDK's tracing one when tracing is on (workers built on the
    client inherit it)."""
    provider = configure(env)
    return [TracingInterceptor(provider.get_tracer(TRACER_NAME))] if provider else []


class GenAiSpans(Interceptor):
    """Worker interceptor: a `chat <model>` span per model call and an `execute_tool <tool>` span per
    tool call (and a `tool_call <tool>` span for each call audited without running). Without a
    configured provider the tracer is OpenTelemetry's no-op one."""

    def __init__(self, request_model: str, tracer: trace.Tracer | None = None) -> None:
        self._model = request_model
        self._tracer = tracer

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Spans(next, self._model, self._tracer or trace.get_tracer(TRACER_NAME))


def tool_attributes(invocation: ToolInvocation) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": invocation.tool,
        "gen_ai.tool.call.id": invocation.call_id,
        "countersign.agent": invocation.caller.agent,
        "countersign.turn": invocation.turn,
    }


def result_attributes(result: ToolResult | StoredResult, outcome: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {"countersign.tool.outcome": outcome}
    if result.code is not None:
        attributes["error.type"] = result.code
    if result.needs is not None:
        attributes["countersign.tool.needs"] = sorted(result.needs)
    return attributes


class _Spans(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, model: str, tracer: trace.Tracer) -> None:
        super().__init__(next)
        self._model = model
        self._tracer = tracer

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        activity_type = activity.info().activity_type
        arg = input.args[0] if input.args else None
        if activity_type == CALL_MODEL.name and isinstance(arg, ModelRequest):
            return await self._model_call(input, arg)
        if activity_type == EXECUTE_TOOL.name and isinstance(arg, ToolInvocation):
            return await self._tool_call(input, arg)
        if activity_type == EVALUATE_POLICY.name and isinstance(arg, PolicyCheck):
            return await self._policy(input, arg.invocation)
        if activity_type == RECORD_UNEXECUTED_CALL.name and isinstance(arg, UnexecutedCall):
            call, result = arg.invocation, arg.result
            attributes = tool_attributes(call) | result_attributes(result, outcome_of(result.code, ran=False))
            with self._tracer.start_as_current_span(f"tool_call {call.tool}", attributes=attributes):
                return await super().execute_activity(input)
        return await super().execute_activity(input)

    async def _policy(self, input: ExecuteActivityInput, invocation: ToolInvocation) -> Any:
        """A `policy <tool>` span per evaluation, with the deciding policy and its outcome."""
        attributes = tool_attributes(invocation) | {"gen_ai.operation.name": "policy"}
        with self._tracer.start_as_current_span(f"policy {invocation.tool}", attributes=attributes) as span:
            decision = await super().execute_activity(input)
            if isinstance(decision, PolicyDecision):
                span.set_attribute("countersign.policy.outcome", decision.outcome)
                if decision.policy is not None:
                    span.set_attribute("countersign.policy.id", decision.policy)
            return decision

    async def _model_call(self, input: ExecuteActivityInput, request: ModelRequest) -> Any:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": self._model,
        }
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if request.caller is not None:
            attributes |= {"countersign.agent": request.caller.agent, "countersign.turn": request.caller.turn}
        with self._tracer.start_as_current_span(
            f"chat {self._model}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            reply = await super().execute_activity(input)
            if isinstance(reply, ModelReply):
                span.set_attributes(
                    {
                        "gen_ai.response.model": reply.model or self._model,
                        "gen_ai.usage.input_tokens": reply.usage.prompt_tokens,
                        "gen_ai.usage.output_tokens": reply.usage.completion_tokens,
                        "gen_ai.response.finish_reasons": [reply.finish_reason or "unknown"],
                    }
                )
            return reply

    async def _tool_call(self, input: ExecuteActivityInput, invocation: ToolInvocation) -> Any:
        with self._tracer.start_as_current_span(
            f"execute_tool {invocation.tool}", attributes=tool_attributes(invocation)
        ) as span:
            result = await super().execute_activity(input)
            if isinstance(result, ToolResult | StoredResult):
                outcome = outcome_of(result.code, ran=True)
                span.set_attributes(result_attributes(result, outcome))
                if outcome != "executed":
                    span.set_status(Status(StatusCode.ERROR, result.code))
            return result
