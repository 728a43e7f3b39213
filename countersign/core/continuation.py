"""The state a waiting MCP tool call carries through its client (pure).

A call that waits for a reviewer answers the client `input_required` with a `requestState` it must
echo when it asks again (MCP 2026-07-28, SEP-2322). The client holds it, so it is
attacker-controlled: the server MACs it (HMAC-SHA256 under a key derived from the deployment's
server key, countersign/server/mcp_face.py), binds it to the principal (tenant, token, user), the
agent, the conversation, the call, the tool and the arguments' digest, gives it a short life, and
spends its `nonce` once in PostgreSQL (`mcp_continuations`). `opened` says why a state is refused;
it never raises on what a client sent.

A call that waits, made by a client that polls tasks (MCP's tasks: 2025-11-25, and the
`io.modelcontextprotocol/tasks` extension of 2026-07-28), is named by a task id the server seals
the same way, under another label (so neither passes as the other): a `TaskHandle` binds the
principal, the agent, the conversation, the call and the tool, and lives TASK_TTL. It is never
spent: polling asks again and again. How the task stands is never in it: the server reads that
from the conversation's store each time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel, ValidationError

CONTINUATION_VERSION = "countersign-mcp-continuation-v1"
CONTINUATION_TTL = timedelta(minutes=10)
TASK_VERSION = "countersign-mcp-task-v1"
TASK_TTL = timedelta(hours=24)
MAX_STATE_CHARS = 4096
M = TypeVar("M", bound=BaseModel)


class Principal(BaseModel):
    """Who asks: the tenant, the API token (its id) and the user it acts for."""

    tenant_id: str
    token_id: int
    user_id: str


class CallBinding(BaseModel):
    """What a request state must be for: whose call, on which agent's conversation, of which tool
    with which arguments (their digest)."""

    principal: Principal
    agent: str
    workflow_id: str
    tool: str
    args_sha256: str


class Continuation(CallBinding):
    call_id: str  # the call it asks about
    nonce: str
    expires_at: datetime


class TaskHandle(BaseModel):
    """What a task id names: whose call, on which agent's conversation, of which tool."""

    principal: Principal
    agent: str
    workflow_id: str
    call_id: str
    tool: str
    created_at: datetime
    expires_at: datetime


def arguments_digest(arguments: str) -> str:
    """The digest of a call's arguments as the client sent them, canonical when they are a JSON
    object (so key order or spacing does not matter), else of the text itself."""
    try:
        parsed = json.loads(arguments)
        canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        canonical = arguments
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _mac(key: bytes, body: bytes, label: str) -> bytes:
    return hmac.new(key, label.encode() + b"\0" + body, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _seal(key: bytes, model: BaseModel, label: str) -> str:
    """`model` and its MAC under `label`, each base64url."""
    body = model.model_dump_json().encode()
    return f"{_b64(body)}.{_b64(_mac(key, body, label))}"


FORGED, UNKNOWN = "forged", "unknown"


def _unsealed(key: bytes, sealed_text: str, label: str, model: type[M]) -> M | str:
    """The `model` `sealed_text` carries when this server sealed it under `label`, else FORGED (a
    wrong tag) or UNKNOWN (not the shape of anything it seals)."""
    if len(sealed_text) > MAX_STATE_CHARS or sealed_text.count(".") != 1:
        return UNKNOWN
    body_text, tag_text = sealed_text.split(".")
    try:
        body, tag = _unb64(body_text), _unb64(tag_text)
    except (binascii.Error, ValueError):
        return UNKNOWN
    if not hmac.compare_digest(tag, _mac(key, body, label)):
        return FORGED
    try:
        return model.model_validate_json(body)
    except ValidationError:
        return UNKNOWN


def sealed(key: bytes, continuation: Continuation) -> str:
    """A request state: the continuation and its MAC."""
    return _seal(key, continuation, CONTINUATION_VERSION)


def opened(key: bytes, state: str, expected: CallBinding, now: datetime) -> Continuation | str:
    """The continuation `state` carries, when it is ours, unexpired and for exactly `expected`;
    else why not (whether its nonce is spent is for the database to say)."""
    continuation = _unsealed(key, state, CONTINUATION_VERSION, Continuation)
    if continuation == FORGED:
        return "the request state was altered or forged"
    if isinstance(continuation, str):
        return "the request state is not one this server issued"
    if now >= continuation.expires_at:
        return f"the request state expired at {continuation.expires_at.isoformat()}: call the tool again"
    if CallBinding.model_validate(continuation.model_dump()) != expected:
        return "the request state was issued for another caller, tool or arguments"
    return continuation


def task_id(key: bytes, handle: TaskHandle) -> str:
    """A task id: the handle and its MAC, under a label of its own."""
    return _seal(key, handle, TASK_VERSION)


def task_opened(
    key: bytes, sealed_id: str, principal: Principal, agent: str, now: datetime
) -> TaskHandle | str:
    """The handle a task id names, when this server issued it to `principal` on `agent` and it has
    not expired; else why not (the spec's "task not found" or "task has expired")."""
    handle = _unsealed(key, sealed_id, TASK_VERSION, TaskHandle)
    if isinstance(handle, str) or (handle.principal, handle.agent) != (principal, agent):
        return "no such task"  # another caller's: its existence is not this caller's to learn
    if now >= handle.expires_at:
        return f"the task has expired (at {handle.expires_at.isoformat()})"
    return handle
