"""The state a waiting MCP tool call carries through its client (pure).

A call that waits for a reviewer answers the client `input_required` with a `requestState` it must
echo when it asks again (MCP 2026-07-28, SEP-2322). The client holds it, so it is
attacker-controlled: the server MACs it (HMAC-SHA256 under a key derived from the deployment's
server key, countersign/server/mcp_face.py), binds it to the principal (tenant, token, user), the
agent, the conversation, the call, the tool and the arguments' digest, gives it a short life, and
spends its `nonce` once in PostgreSQL (`mcp_continuations`). `opened` says why a state is refused;
it never raises on what a client sent.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from datetime import datetime, timedelta

from pydantic import BaseModel, ValidationError

CONTINUATION_VERSION = "countersign-mcp-continuation-v1"
CONTINUATION_TTL = timedelta(minutes=10)
MAX_STATE_CHARS = 4096


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


def arguments_digest(arguments: str) -> str:
    """The digest of a call's arguments as the client sent them, canonical when they are a JSON
    object (so key order or spacing does not matter), else of the text itself."""
    try:
        parsed = json.loads(arguments)
        canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        canonical = arguments
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _mac(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, CONTINUATION_VERSION.encode() + b"\0" + body, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sealed(key: bytes, continuation: Continuation) -> str:
    body = continuation.model_dump_json().encode()
    return f"{_b64(body)}.{_b64(_mac(key, body))}"


def opened(key: bytes, state: str, expected: CallBinding, now: datetime) -> Continuation | str:
    """The continuation `state` carries, when it is ours, unexpired and for exactly `expected`;
    else why not (whether its nonce is spent is for the database to say)."""
    if len(state) > MAX_STATE_CHARS or state.count(".") != 1:
        return "the request state is not one this server issued"
    body_text, tag_text = state.split(".")
    try:
        body, tag = _unb64(body_text), _unb64(tag_text)
    except (binascii.Error, ValueError):
        return "the request state is not one this server issued"
    if not hmac.compare_digest(tag, _mac(key, body)):
        return "the request state was altered or forged"
    try:
        continuation = Continuation.model_validate_json(body)
    except ValidationError:
        return "the request state is not one this server issued"
    if now >= continuation.expires_at:
        return f"the request state expired at {continuation.expires_at.isoformat()}: call the tool again"
    if CallBinding.model_validate(continuation.model_dump()) != expected:
        return "the request state was issued for another caller, tool or arguments"
    return continuation
