"""How an MCP client learns the outcome of a call that waits for a reviewer (pure parts).

Three paths, chosen per request from what the client declares (`waiting_path`):

- a task it polls: the client asked for one (2025-11-25: the call's `task` parameter) or declared
  the tasks extension (`io.modelcontextprotocol/tasks`, 2026-07-28). The call answers a task at
  once; `tasks/get` says how it stands (`working` while it waits, `completed` with the tool's
  result once decided, `cancelled` once its requester withdrew it), `tasks/result` (2025-11-25)
  waits for the result and gives it.
- a URL elicitation (2026-07-28, a client that declares URL elicitation): `input_required`
  naming the call's inbox card, then asking again with the request state.
- neither: the request is held for the decision up to a bound; then a result saying the call
  still waits, where its card is, and that the `countersign_outcome` tool (OUTCOME_TOOL) with the
  call id waits for it and gives its result.

A task's state is never in its id nor taken from the client: the server reads it from the
conversation's store (the call's tool message) each time it is asked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from countersign.core.continuation import TaskHandle

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"  # the 2026-07-28 tasks extension's identifier
RELATED_TASK = "io.modelcontextprotocol/related-task"  # 2025-11-25: a task's result names its task
OUTCOME_TOOL = "countersign_outcome"
TASK_POLL_MS = 5000  # the polling interval a task suggests
WITHDRAWN = "withdrawn by the requester"  # how the reason of a withdrawn call's rejection begins

Path = Literal["task", "elicitation", "hold"]
TaskStatus = Literal["working", "completed", "cancelled"]


def waiting_path(
    protocol_version: str, capabilities: types.ClientCapabilities | None, task: types.TaskMetadata | None
) -> Path:
    """How this request's client learns the outcome of a call that waits (the module's doc)."""
    if protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return "task" if task is not None else "hold"
    if capabilities is not None and TASKS_EXTENSION in (capabilities.extensions or {}):
        return "task"
    elicitation = capabilities.elicitation if capabilities is not None else None
    return "elicitation" if elicitation is not None and elicitation.url is not None else "hold"


def status_of(text: str | None, withdrawn: bool) -> TaskStatus:
    """A task's status from its call's stored result (None: not decided yet) and whether its
    approval was rejected by its own requester (tasks/cancel, a declined card, the inbox): then
    `cancelled`, else `completed` (a rejection or an expiry too: the call's result is an error
    result, which the specification calls completed)."""
    if text is None:
        return "working"
    return "cancelled" if withdrawn else "completed"


def task_wire(
    protocol_version: str, task_id: str, handle: TaskHandle, status: TaskStatus, message: str, now: datetime
) -> dict[str, Any]:
    """A task as each protocol spells it (2026-07-28's `ttlMs` and `pollIntervalMs`; 2025-11-25's
    `ttl` and `pollInterval`)."""
    modern = protocol_version in MODERN_PROTOCOL_VERSIONS
    ttl = int((handle.expires_at - handle.created_at).total_seconds() * 1000)
    return {
        "taskId": task_id,
        "status": status,
        "statusMessage": message,
        "createdAt": handle.created_at.isoformat(),
        "lastUpdatedAt": (handle.created_at if status == "working" else now).isoformat(),
        "ttlMs" if modern else "ttl": ttl,
        "pollIntervalMs" if modern else "pollInterval": TASK_POLL_MS,
    }


def task_created(protocol_version: str, task: dict[str, Any]) -> dict[str, Any]:
    """The answer to a call that became a task: 2026-07-28's `resultType: "task"` with the task's
    fields, 2025-11-25's `{"task": …}`."""
    if protocol_version in MODERN_PROTOCOL_VERSIONS:
        return {"resultType": "task", **task}
    return {"task": task}


def outcome_tool() -> types.Tool:
    """The tool a client that can neither elicit nor poll a task calls for a waiting call's result."""
    return types.Tool(
        name=OUTCOME_TOOL,
        description=(
            "The result of a tool call that waited for a reviewer's approval, by its call id (the "
            "waiting call's result names it): waits a while for the decision, then gives the "
            "called tool's result, or says the call still waits."
        ),
        input_schema={
            "type": "object",
            "properties": {"call_id": {"type": "string", "description": "the waiting call's id"}},
            "required": ["call_id"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True),
    )


def still_waiting(tool: str, call_id: str, card: str, waited_s: float) -> str:
    """What a client that cannot wait in the protocol is told when the decision has not come."""
    return (
        f"{tool} waits for a reviewer's decision ({card}); none came within {waited_s:.0f} s. Do not "
        f"call {tool} again: call the tool {OUTCOME_TOOL} with "
        f'{{"call_id": "{call_id}"}} to wait for its result and get it.'
    )
