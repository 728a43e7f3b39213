"""structlog set-up: readable console lines locally, JSON in production (COUNTERSIGN_LOG_FORMAT=json).

Standard-library loggers (the Temporal SDK's, the activity and workflow loggers) go through the same
renderer, so one process writes one format. `ActivityLogContext`, a worker interceptor, binds the
running activity's identity to every line logged while it runs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import structlog
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor


def configure(level: str | None = None) -> None:
    json_logs = os.environ.get("COUNTERSIGN_LOG_FORMAT", "console") == "json"
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json_logs
        # plain tracebacks, whatever is installed: by default the console renderer draws them with
        # `rich` when some other package brought it in, at several milliseconds of CPU a traceback
        # (with the locals of every frame), which an outage's retries log by the hundred
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("COUNTERSIGN_LOG_LEVEL", "INFO"))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger


def activity_fields() -> dict[str, object]:
    """Who is logging, from inside an activity: its workflow, run, type and attempt."""
    info = activity.info()
    return {
        "workflow_id": info.workflow_id,
        "run_id": info.workflow_run_id,
        "activity_type": info.activity_type,
        "attempt": info.attempt,
    }


def call_fields(args: Sequence[object]) -> dict[str, object]:
    """The tool and call id of an activity about one tool call (`ToolInvocation` and kin)."""
    for arg in args:
        for holder in (arg, getattr(arg, "invocation", None)):
            tool, call_id = getattr(holder, "tool", None), getattr(holder, "call_id", None)
            if isinstance(tool, str) and isinstance(call_id, str):
                return {"tool": tool, "call_id": call_id}
    return {}


# Standard library, not structlog: filtered by level even where logging was never configured.
timing = logging.getLogger("countersign.activity")


class ActivityLogContext(Interceptor):
    """Worker interceptor: every log line written while an activity runs, through structlog or the
    standard library, carries its workflow id, run id, activity type, attempt and, for a tool
    call, the tool and call id. Ends with a DEBUG line timing the activity."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _BindActivityFields(next)


class _BindActivityFields(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        started = time.monotonic()
        outcome = "failed"
        with structlog.contextvars.bound_contextvars(**activity_fields(), **call_fields(input.args)):
            try:
                result = await super().execute_activity(input)
                outcome = "completed"
                return result
            finally:
                elapsed_ms = round((time.monotonic() - started) * 1000, 1)
                timing.debug("activity finished", extra={"outcome": outcome, "duration_ms": elapsed_ms})
