"""One way to reach Temporal: the pydantic data converter (countersign.runtime.payloads), so payloads stay
typed end to end."""

from __future__ import annotations

import os

from temporalio.client import Client, Interceptor
from temporalio.runtime import Runtime

from countersign.observability import ENDPOINT_ENV
from countersign.runtime.config import Settings
from countersign.runtime.payloads import data_converter


async def connect(settings: Settings, runtime: Runtime | None = None) -> Client:
    """`runtime`: one whose core exports metrics (the worker's, see observability.metrics). With
    OTEL_EXPORTER_OTLP_ENDPOINT set, the client traces (observability.tracing)."""
    try:
        return await Client.connect(
            settings.temporal_address,
            namespace=settings.namespace,
            data_converter=data_converter,
            interceptors=_interceptors(),
            runtime=runtime,
        )
    except RuntimeError as exc:
        raise RuntimeError(
            f"cannot reach Temporal at {settings.temporal_address}: start the embedded stack "
            "(`countersign dev up`) or set TEMPORAL_ADDRESS"
        ) from exc


def _interceptors() -> list[Interceptor]:
    """Tracing's, imported only when it is on: OpenTelemetry and the metrics it pulls in cost a CLI
    command a third of a second to import."""
    if not os.environ.get(ENDPOINT_ENV, "").strip():
        return []
    from countersign.observability import tracing

    return list(tracing.client_interceptors())
