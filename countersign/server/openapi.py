"""The server's OpenAPI 3.1 document (`GET /api/openapi.json`), built from the app's own route table
and the pydantic models that validate requests at the edge (`parse`, `ReplyQuery`): a request body
is documented by the very model that refuses what does not fit it, so the document cannot drift
from what the server accepts. What a route reads by hand (a page's `?limit=`, a path's number) and
what it answers are described beside the route in `OPERATIONS`, the one table of what each
`/api/` route is; a route missing from it is still listed (tagged `undescribed`, with no
schemas) and tests/server/test_openapi.py names it.

Only the JSON API under `/api/` is documented. Not in it: the pages (`/`, `/chat`, `/tools`,
`/policies`, `/drafts`, `/static/`, `/favicon.ico`) and the OIDC sign-in (`/auth/oidc/…`), which are
HTML for a browser; the channels' webhooks (`/channels/…`), whose bodies are Telegram's and Slack's
and whose authentication is their signature; and the MCP face (`/mcp/{agent}`), a JSON-RPC protocol
with its own specification."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ag_ui.core import RunAgentInput
from aiohttp import web
from pydantic import BaseModel, Field
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from countersign.core.approvals import Approval
from countersign.core.authority import ADMIN
from countersign.core.contract import Reply, StatusView
from countersign.core.messages import ChatMessage
from countersign.db.channels import (
    ChannelChange,
    ChannelSettings,
    ChannelView,
    DecidesSettings,
    SenderSettings,
)
from countersign.server.agent_tools import ToolsBody
from countersign.server.auth import Reviewer
from countersign.server.door import MAX_TURN, ReplyQuery
from countersign.server.http import COOKIE
from countersign.server.inbox import (
    MAX_CURSOR_CHARS,
    MAX_PAGE,
    AlwaysAllowRequest,
    BatchRequest,
    DecisionRequest,
    PendingItem,
)
from countersign.server.notifications import ResolveBody
from countersign.server.policies import PolicyText
from countersign.server.requesters import (
    AnswerBody,
    AnswerRequest,
    MessageBody,
    RatingBody,
    RollbackBody,
    StartBody,
    Started,
)
from countersign.server.signin import LoginRequest
from tools.drafts import DraftChanges, DraftDetail, DraftList

PATH = "/api/openapi.json"
UNDESCRIBED = "undescribed"  # the tag of a route OPERATIONS does not describe
VERSION = "1"
Schema = dict[str, Any]
ERROR = {"$ref": "#/components/schemas/Error"}
OBJECT: Schema = {"type": "object"}
OBJECTS: Schema = {"type": "array", "items": OBJECT}


# --- what the handlers answer without a model of their own (documentation only) ----------------


class Error(BaseModel):
    """Every refusal and failure: one line saying why (a 429 also carries `Retry-After`)."""

    error: str


class Token(BaseModel):
    token: str = Field(description="The session token (also set as the HttpOnly session cookie)")


class Done(BaseModel):
    ok: Literal[True]


class Me(Reviewer):
    roles: list[str]
    auth_mode: str


class Agent(BaseModel):
    name: str
    description: str | None


class Sent(BaseModel):
    sent: Literal["answer", "end", "rollback"]


class MessageSent(BaseModel):
    message_id: str


DECIDED: Schema = {
    "allOf": [
        Approval,
        {
            "type": "object",
            "properties": {"outcome": {"type": "string", "description": "The line a person is shown"}},
            "required": ["outcome"],
        },
    ]
}


class Notifications(BaseModel):
    notifications: list[dict[str, Any]]


class ToolTiers(BaseModel):
    tools: list[dict[str, Any]]


class PolicyApplied(BaseModel):
    accepted: Literal[True]
    version: int | None


class ChannelChanges(BaseModel):
    changes: list[ChannelChange]


# --- the route table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    """One route: what it does, what it reads and what it answers when it succeeds (a refusal is
    always the `Error` envelope). `returns` is a model, a JSON schema, or None for no JSON."""

    summary: str
    tag: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | dict[str, Schema] | None = None
    returns: type[BaseModel] | Schema | None = None
    status: int = 200
    media: str = "application/json"
    tokens: bool = False  # an API token may call it (the conversation API), besides a session
    public: bool = False  # no sign-in
    params: dict[str, Schema] = field(default_factory=dict)  # path parameters other than plain text


LIMIT = {"type": "string", "pattern": r"^[0-9]+$", "description": f"1 to {MAX_PAGE}"}
RECORD = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
TURN = {"type": "integer", "minimum": 1, "maximum": MAX_TURN}
SSE = "text/event-stream"
# the `after` of a page's `Link`: unpadded URL-safe base64 (the server's own token; anything else: 400)
CURSOR = {"type": "string", "pattern": r"^[A-Za-z0-9_-]*$", "maxLength": MAX_CURSOR_CHARS}
LISTING_LIMIT = {"type": "string", "pattern": r"^[0-9]+$", "description": "1 to 100"}


def _conversation(summary: str, **kwargs: Any) -> Operation:
    return Operation(summary, "conversations", tokens=True, **kwargs)


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", PATH): Operation("This document", "meta", returns=OBJECT, public=True),
    ("POST", "/api/login"): Operation(
        "Sign in with a password", "session", LoginRequest, returns=Token, public=True
    ),
    ("POST", "/api/logout"): Operation("Revoke the session", "session", returns=Done),
    ("GET", "/api/me"): Operation(
        "Who is signed in, their roles and the deployment's mode", "session", returns=Me
    ),
    # the reviewers' inbox
    ("GET", "/api/approvals"): Operation(
        "The caller's pending approvals (a page with `limit`, the next one with `after`)",
        "approvals",
        query={"limit": LIMIT, "after": CURSOR},
        returns={"type": "array", "items": PendingItem},
    ),
    ("GET", "/api/events"): Operation(
        "The caller's pending approvals as a stream", "approvals", query={"limit": LIMIT}, media=SSE
    ),
    ("POST", "/api/approvals/batch"): Operation(
        "Decide several calls", "approvals", BatchRequest, returns=OBJECTS
    ),
    ("POST", "/api/approvals/{workflow_id}/{call_id}"): Operation(
        "Approve or reject a call", "approvals", DecisionRequest, returns=DECIDED
    ),
    ("POST", "/api/approvals/{workflow_id}/{call_id}/always-allow"): Operation(
        "An admin's standing 'always allow' of the call's tool for its agent",
        "approvals",
        AlwaysAllowRequest,
        returns=OBJECT,
    ),
    ("GET", "/api/history"): Operation("The tenant's latest decisions", "approvals", returns=OBJECTS),
    ("GET", "/api/grants"): Operation("The grants the caller may see", "approvals", returns=OBJECTS),
    ("POST", "/api/grants/{grant_id}/revoke"): Operation(
        "Revoke a grant", "approvals", returns=OBJECT, params={"grant_id": RECORD}
    ),
    ("GET", "/api/audit/export"): Operation(
        "An admin's export of the tenant's audit (CSV of decisions, or the signed bundle)",
        "approvals",
        query={"format": {"type": "string", "enum": ["csv", "bundle"]}},
        media="text/csv",
    ),
    # the requesters' conversation API (shared/CONTRACT.md, "The front door")
    ("POST", "/api/conversations"): _conversation(
        "Start a conversation", body=StartBody, returns=Started, status=201
    ),
    ("GET", "/api/conversations"): Operation(
        "The caller's conversations, newest first", "conversations", returns=OBJECTS
    ),
    ("GET", "/api/conversations/{workflow_id}"): _conversation("A conversation's status", returns=StatusView),
    ("POST", "/api/conversations/{workflow_id}/messages"): _conversation(
        "Send a message", body=MessageBody, returns=MessageSent, status=202
    ),
    ("GET", "/api/conversations/{workflow_id}/transcript"): _conversation(
        "The conversation's messages", returns={"type": "array", "items": ChatMessage}
    ),
    ("GET", "/api/conversations/{workflow_id}/reply"): _conversation(
        "Wait for a turn's reply", query=ReplyQuery, returns=Reply
    ),
    ("GET", "/api/conversations/{workflow_id}/audit"): _conversation(
        "The conversation's tool calls", returns=OBJECTS
    ),
    ("POST", "/api/conversations/{workflow_id}/answers/{call_id}"): _conversation(
        "Answer a question the agent asked", body=AnswerBody, returns=Sent, status=202
    ),
    ("POST", "/api/conversations/{workflow_id}/answer"): _conversation(
        "Answer a question (the call in the body)", body=AnswerRequest, returns=Sent, status=202
    ),
    ("POST", "/api/conversations/{workflow_id}/rollback"): _conversation(
        "Undo a turn's or a call's steps", body=RollbackBody, returns=OBJECT, status=202
    ),
    ("POST", "/api/conversations/{workflow_id}/end"): _conversation(
        "End the conversation", returns=Sent, status=202
    ),
    ("GET", "/api/conversations/{workflow_id}/events"): _conversation(
        "The conversation's events as a stream", media=SSE
    ),
    ("GET", "/api/conversations/{workflow_id}/ratings"): _conversation(
        "The ratings of its replies", returns=OBJECTS
    ),
    ("PUT", "/api/conversations/{workflow_id}/ratings/{turn}"): _conversation(
        "Rate a turn's reply", body=RatingBody, returns=OBJECT, params={"turn": TURN}
    ),
    ("GET", "/api/agents"): Operation(
        "The agents one may talk to", "conversations", returns={"type": "array", "items": Agent}
    ),
    # drafts and notifications
    ("GET", "/api/drafts"): Operation(
        "The tenant's email drafts, newest first",
        "drafts",
        returns=DraftList,
        query={"state": {"type": "string", "enum": ["unsent", "sent", "all"]}, "limit": LISTING_LIMIT},
    ),
    ("GET", "/api/drafts/{draft_id}"): Operation(
        "One draft", "drafts", returns=DraftDetail, params={"draft_id": RECORD}
    ),
    ("PATCH", "/api/drafts/{draft_id}"): Operation(
        "Edit a draft", "drafts", DraftChanges, returns=DraftDetail, params={"draft_id": RECORD}
    ),
    ("GET", "/api/notifications"): Operation(
        "The caller's notifications, newest first",
        "notifications",
        returns=Notifications,
        query={"status": {"type": "string", "enum": ["open", "resolved", "all"]}, "limit": LISTING_LIMIT},
    ),
    ("POST", "/api/notifications/{notification_id}/resolve"): Operation(
        "Resolve a notification",
        "notifications",
        ResolveBody,
        returns=OBJECT,
        params={"notification_id": RECORD},
    ),
    # an admin's settings
    ("GET", "/api/agents/{agent}/tools"): Operation(
        "The tenant's tiers of an agent's tools", ADMIN, returns=ToolTiers
    ),
    ("PUT", "/api/agents/{agent}/tools"): Operation("Replace them", ADMIN, ToolsBody, returns=ToolTiers),
    ("GET", "/api/agents/{agent}/tools/catalog"): Operation("Every tool of the agent", ADMIN, returns=OBJECT),
    ("GET", "/api/agents/{agent}/tools/changes"): Operation(
        "The tier changes, newest first", ADMIN, returns=OBJECT
    ),
    ("GET", "/api/policies"): Operation("The tenant's Cedar policy sets", ADMIN, returns=OBJECT),
    ("POST", "/api/policies/validate"): Operation("Check a policy set", ADMIN, PolicyText, returns=Done),
    ("PUT", "/api/policies"): Operation("Apply a policy set", ADMIN, PolicyText, returns=PolicyApplied),
    ("GET", "/api/admin/channel"): Operation("The tenant's chat channel", ADMIN, returns=ChannelView),
    ("PUT", "/api/admin/channel"): Operation("Set it", ADMIN, ChannelSettings, returns=ChannelView),
    ("GET", "/api/admin/channel/changes"): Operation("Its changes", ADMIN, returns=ChannelChanges),
    ("PUT", "/api/admin/channel/senders/{sender}"): Operation(
        "Map a chat sender to a user and an agent", ADMIN, SenderSettings, returns=OBJECT
    ),
    ("GET", "/api/admin/channel/senders"): Operation("The sender map", ADMIN, returns=OBJECT),
    ("DELETE", "/api/admin/channel/senders/{sender}"): Operation(
        "Unlink a chat sender", ADMIN, returns=OBJECT
    ),
    ("PUT", "/api/admin/channel/decides"): Operation(
        "The highest risk a press in the chat decides", ADMIN, DecidesSettings, returns=ChannelView
    ),
    ("POST", "/api/admin/channel/test"): Operation("Post a test message to the chat", ADMIN, returns=OBJECT),
    # AG-UI 1.0 (docs/how-to/ag-ui.md): a run of the conversation as a stream of AG-UI events
    ("POST", "/api/conversations/{workflow_id}/agui"): _conversation(
        "Run or resume the conversation as an AG-UI agent", body=RunAgentInput, media=SSE
    ),
}


# --- the document ----------------------------------------------------------------------------------


class Schemas:
    """The models' JSON schemas, their `$defs` gathered as components/schemas (pydantic names a
    model used both ways `…-Input` and `…-Output` when the two differ)."""

    def __init__(self, operations: list[Operation]) -> None:
        wanted: set[tuple[type[BaseModel], JsonSchemaMode]] = {(Error, "serialization")}
        for op in operations:
            if op.body is not None:
                wanted.add((op.body, "validation"))
            if isinstance(op.query, type):
                wanted.add((op.query, "validation"))
            wanted |= {(model, "serialization") for model in _models_in(op.returns)}
        ordered = sorted(wanted, key=lambda pair: (pair[0].__name__, pair[1]))
        self.refs, defs = models_json_schema(ordered, ref_template="#/components/schemas/{model}")
        self.components: dict[str, Schema] = defs.get("$defs", {})

    def of(self, model: type[BaseModel], mode: JsonSchemaMode) -> Schema:
        return dict(self.refs[(model, mode)])

    def answer(self, returns: Any) -> Any:
        """`returns` with each model in it replaced by its schema (a reference)."""
        if isinstance(returns, type):
            return self.of(returns, "serialization")
        if isinstance(returns, dict):
            return {key: self.answer(value) for key, value in returns.items()}
        if isinstance(returns, list):
            return [self.answer(value) for value in returns]
        return returns

    def query_parameters(self, query: type[BaseModel] | dict[str, Schema]) -> list[Schema]:
        if isinstance(query, dict):
            fields = {name: (schema, False) for name, schema in query.items()}
        else:
            properties = self.components[query.__name__]
            required = set(properties.get("required", []))
            fields = {name: (s, name in required) for name, s in properties["properties"].items()}
        return [
            {"name": name, "in": "query", "required": required, "schema": _not_null(schema)}
            for name, (schema, required) in fields.items()
        ]


def _not_null(schema: Schema) -> Schema:
    """A query parameter's schema without the `null` of an optional field: a query names a value or
    leaves the parameter out."""
    kinds = [kind for kind in schema.get("anyOf", []) if kind != {"type": "null"}]
    if len(kinds) != 1:
        return schema
    return {**{k: v for k, v in schema.items() if k not in ("anyOf", "default")}, **kinds[0]}


def _models_in(returns: Any) -> list[type[BaseModel]]:
    """The models a response schema names, at any depth."""
    if isinstance(returns, type):
        return [returns]
    values = returns.values() if isinstance(returns, dict) else returns if isinstance(returns, list) else []
    return [model for value in values for model in _models_in(value)]


def _operation(method: str, path: str, op: Operation, schemas: Schemas) -> Schema:
    """One operation object of the document."""
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": op.params.get(name, {"type": "string"})}
        for name in names
    ]
    if op.query is not None:
        parameters += schemas.query_parameters(op.query)
    success: Schema = {"description": op.summary}
    if op.returns is not None:
        success["content"] = {op.media: {"schema": schemas.answer(op.returns)}}
    elif op.media != "application/json":
        success["content"] = {op.media: {"schema": {"type": "string"}}}
    document: Schema = {
        "operationId": f"{method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_')}",
        "summary": op.summary,
        "tags": [op.tag],
        "parameters": parameters,
        "responses": {
            str(op.status): success,
            "default": {
                "description": "Refused or failed",
                "content": {"application/json": {"schema": ERROR}},
            },
        },
        "security": []
        if op.public
        else [{"session": []}, {"bearer": []}] + ([{"apiToken": []}] if op.tokens else []),
    }
    if op.body is not None:
        body = schemas.of(op.body, "validation")
        document["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return document


def api_routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, path) of every route of `app` under /api/, as the router has them."""
    return sorted(
        (route.method, resource.canonical)
        for resource in app.router.resources()
        if resource.canonical.startswith("/api/")
        for route in resource
        if route.method not in ("HEAD", "OPTIONS")
    )


def document(routes: list[tuple[str, str]]) -> Schema:
    """The OpenAPI 3.1 document of the JSON API routes `routes` ((method, path) pairs: the app's
    `api_routes`; the docs site, which has no app, documents those of `OPERATIONS`)."""
    schemas = Schemas([OPERATIONS[r] for r in routes if r in OPERATIONS])
    paths: dict[str, Schema] = {}
    for method, path in routes:
        op = OPERATIONS.get((method, path), Operation("(not described)", UNDESCRIBED, returns=OBJECT))
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, op, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Countersign",
            "version": VERSION,
            "description": "The conversation API, the reviewers' inbox and the admins' settings. "
            "Sign in with POST /api/login (a session token, also set as a cookie), or send an API "
            'token as a bearer token (the conversation API only). Every refusal is `{"error": …}`, '
            "but one the HTTP parser makes before any route is read: a request line (path and query) "
            "over 8,190 bytes, or a header over 8,190, answers a plain-text 400.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.components,
            "securitySchemes": {
                "session": {"type": "apiKey", "in": "cookie", "name": COOKIE},
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A session token (POST /api/login)",
                },
                "apiToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token (`countersign tokens create`): the conversation API only",
                },
            },
        },
    }


DOCUMENT = web.AppKey("openapi_document", dict)


async def serve(request: web.Request) -> web.Response:
    return web.json_response(request.app[DOCUMENT])


def add_routes(app: web.Application) -> None:
    """The document's route; the document itself is built as the app starts, once every route is in."""

    async def build(app: web.Application) -> None:
        app[DOCUMENT] = document(api_routes(app))

    app.on_startup.append(build)
    app.router.add_get(PATH, serve)
