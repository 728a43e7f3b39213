"""Observability: Prometheus metrics, OpenTelemetry traces, and `starter.py stats` over the audit.

- `metrics`: Countersign's own metrics (prometheus-client) and the worker's `/metrics` endpoint,
  which merges them with the Temporal SDK's (COUNTERSIGN_METRICS_PORT).
- `workflow_metrics`: what only the workflow knows (how turns stop, how long approvals wait),
  recorded through the replay-safe `workflow.metric_meter()`.
- `tracing`: OpenTelemetry spans from the client through the workflow to every activity, exported
  over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set.
- `usage`: the model-call audit (`model_calls`) that `stats` reads tokens and turns from.
- `stats`: the per-tool and per-agent summary of the audit.
"""

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"  # tracing is on when it is set (here so clients can ask cheaply)
