"""The requesters' side of the server: the conversation API over HTTP (CONTRACT.md, "The front
door") and a conversation's events stream; the work is in countersign.server.requesters. Every API
request is recorded there, refused ones included."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError
from temporalio.service import RPCError

from countersign.client.handles import derived_key
from countersign.core.bounds import Identifier
from countersign.db.schema import Conversation
from countersign.server import sessions
from countersign.server.conversation_events import ConversationEvents, resume_point, stream_events
from countersign.server.http import SESSION, SSE_HEADERS, HttpRefusal, bearer_of, invalid_request, parse
from countersign.server.requesters import (
    AnswerBody,
    AnswerRequest,
    Caller,
    MessageBody,
    RatingBody,
    RequesterActionName,
    Requesters,
    RollbackBody,
    StartBody,
)

MAX_TURN = 2**31 - 1  # past any conversation's turns, within what PostgreSQL takes as an OFFSET

CALLER = web.RequestKey("caller", Caller)
REQUESTERS = web.AppKey("requesters", Requesters)
EVENTS = web.AppKey("conversation_events", ConversationEvents)
H = TypeVar("H", bound=Callable[..., Any])
# Handlers that take from the caller's buckets themselves (countersign.server.admission takes for
# every other API request): whom a request acts for is known only once its conversation is.
ADMITS_ITSELF: set[Callable[..., Any]] = set()


def admits_itself(handler: H) -> H:
    ADMITS_ITSELF.add(handler)
    return handler


@dataclass
class Record:
    workflow_id: str | None = None
    user_id: str | None = None
    status: int = 200


@contextlib.asynccontextmanager
async def recorded(request: web.Request, action: RequesterActionName) -> AsyncIterator[Record]:
    """One `requester_actions` row for the request, with the status it was answered."""
    requesters, caller = request.app[REQUESTERS], request[CALLER]
    record = Record(workflow_id=request.match_info.get("workflow_id"))
    try:
        yield record
    except HttpRefusal as err:
        await requesters.record(caller, record.user_id, action, record.workflow_id, err.status, str(err))
        raise
    except RPCError as err:
        await requesters.record(caller, record.user_id, action, record.workflow_id, 503, err.message)
        raise
    await requesters.record(caller, record.user_id, action, record.workflow_id, record.status)


async def on_conversation(
    request: web.Request, action: RequesterActionName, record: Record
) -> tuple[Requesters, Caller, Any]:
    """The service, the caller and the conversation's row, once the caller may take `action` on it
    and their bucket has room."""
    requesters, caller = request.app[REQUESTERS], request[CALLER]
    row = await requesters.conversation(caller, request.match_info["workflow_id"], action)
    record.user_id = requesters.actor(caller, row)
    await requesters.admit(caller, record.user_id)
    return requesters, caller, row


@admits_itself
async def start(request: web.Request) -> web.Response:
    async with recorded(request, "start") as record:
        requesters, caller = request.app[REQUESTERS], request[CALLER]
        body = await parse(request, StartBody)
        if body.key is not None and derived_key(body.key):
            raise HttpRefusal(
                403,
                f"the conversation key {body.key} is one the server keeps for a chat sender or an MCP client",
            )
        record.user_id = body.user_id  # as claimed, until checked
        record.user_id = requesters.requester_of(caller, body)
        await requesters.admit(caller, record.user_id)
        started = await requesters.start(caller, record.user_id, body)
        record.workflow_id, record.status = started.workflow_id, 201
    return web.json_response(started.model_dump(exclude_none=True), status=201)


@admits_itself
async def send(request: web.Request) -> web.Response:
    async with recorded(request, "message") as record:
        requesters, _, row = await on_conversation(request, "message", record)
        message_id = await requesters.send(row, await parse(request, MessageBody))
        record.status = 202
    return web.json_response({"message_id": message_id}, status=202)


@admits_itself
async def status(request: web.Request) -> web.Response:
    async with recorded(request, "status") as record:
        requesters, _, row = await on_conversation(request, "status", record)
        view = await requesters.status(row)
    return web.json_response(view.model_dump(mode="json"))


@admits_itself
async def transcript(request: web.Request) -> web.Response:
    async with recorded(request, "transcript") as record:
        requesters, _, row = await on_conversation(request, "transcript", record)
        messages = await requesters.transcript(row)
    return web.json_response([m.model_dump(mode="json") for m in messages])


@admits_itself
async def audit(request: web.Request) -> web.Response:
    """The conversation's tool calls as `audit --workflow WF --json` prints them."""
    async with recorded(request, "audit") as record:
        requesters, _, row = await on_conversation(request, "audit", record)
        rows = await requesters.audit(row)
    return web.json_response(rows, dumps=lambda v: json.dumps(v, default=str))


class ReplyQuery(BaseModel):
    """`GET …/reply`'s query, bounded before it reaches Temporal or SQL (a turn past int64 would
    fail the store's lookup; a NaN wait would never run out)."""

    message_id: Identifier | None = None
    turn: int | None = Field(None, ge=0, le=MAX_TURN)  # 0 reads as 1, as before
    wait: float = Field(30.0, ge=0, allow_inf_nan=False)  # held at most MAX_WAIT_S (requesters.reply)


@admits_itself
async def reply(request: web.Request) -> web.Response:
    """Not in the contract's table: the CLI's wait for a turn (`?message_id=` or `?turn=`, and
    `wait` seconds, at most 50), so that it needs nothing but the server."""
    async with recorded(request, "reply") as record:
        requesters, _, row = await on_conversation(request, "reply", record)
        try:
            asked = ReplyQuery.model_validate(dict(request.query))
        except ValidationError as err:
            raise invalid_request(err) from None
        answer = await requesters.reply(row, asked.message_id, asked.turn, asked.wait)
    return web.json_response(answer.model_dump(mode="json"))


def turn_of(request: web.Request) -> int:
    """The `{turn}` of a ratings path: a turn number (1 is the first), else 422."""
    raw = request.match_info["turn"]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10) or not 1 <= int(raw) <= MAX_TURN:
        raise HttpRefusal(422, f"a turn is a number from 1 to {MAX_TURN}")
    return int(raw)


@admits_itself
async def rate(request: web.Request) -> web.Response:
    """`PUT …/ratings/{turn}` `{"rating": "helpful"|"not_helpful", "comment"?}`: the conversation's
    user (or a token acting for them; nobody else, admins included) rates the turn's reply; a
    second rating replaces the first (`"replaced": true`), both chained in the audit."""
    async with recorded(request, "rate") as record:
        requesters, caller, row = await on_conversation(request, "rate", record)
        turn, body = turn_of(request), await parse(request, RatingBody)
        rated = await requesters.rate(row, turn, body, caller.via)
    return web.json_response(rated)


@admits_itself
async def ratings(request: web.Request) -> web.Response:
    """`GET …/ratings`: the ratings of the conversation's replies, by turn."""
    async with recorded(request, "rate") as record:
        requesters, _, row = await on_conversation(request, "rate", record)
        rated = await requesters.ratings(row)
    return web.json_response(rated)


@admits_itself
async def answer(request: web.Request) -> web.Response:
    async with recorded(request, "answer") as record:
        requesters, caller, row = await on_conversation(request, "answer", record)
        body = await parse(request, AnswerBody)
        await requesters.answer(caller, row, request.match_info["call_id"], body)
        record.status = 202
    return web.json_response({"sent": "answer"}, status=202)


@admits_itself
async def rollback(request: web.Request) -> web.Response:
    async with recorded(request, "rollback") as record:
        requesters, caller, row = await on_conversation(request, "rollback", record)
        entries = await requesters.rollback(caller, row, await parse(request, RollbackBody))
        record.status = 202
    undone = None if entries is None else [e.model_dump(mode="json") for e in entries]
    return web.json_response({"sent": "rollback", "entries": undone}, status=202)


@admits_itself
async def end(request: web.Request) -> web.Response:
    async with recorded(request, "end") as record:
        requesters, caller, row = await on_conversation(request, "end", record)
        await requesters.end(caller, row)
        record.status = 202
    return web.json_response({"sent": "end"}, status=202)


@admits_itself
async def answer_by_body(request: web.Request) -> web.Response:
    """The inbox's older spelling of an answer (`POST …/answer {"call_id", "text"}`), kept working:
    the same as `POST …/answers/{call_id}`."""
    body: AnswerRequest = await parse(request, AnswerRequest, invalid=400)
    async with recorded(request, "answer") as record:
        requesters, caller, row = await on_conversation(request, "answer", record)
        await requesters.answer(caller, row, body.call_id, AnswerBody(text=body.text))
        record.status = 202
    return web.json_response({"sent": "answer"}, status=202)


def liveness(request: web.Request, row: Conversation) -> Callable[[], Awaitable[bool]]:
    """Whether a stream of the request may go on: a logout, an expiry, a revoked token or a
    deactivated user closes it (a token: while it still acts for the conversation's user)."""
    requesters, claims, bearer = request.app[REQUESTERS], request.get(SESSION), bearer_of(request)

    async def live() -> bool:
        if claims is not None:
            return await sessions.is_live(requesters.sessions, claims)
        now = await requesters.token_caller(bearer) if bearer is not None else None
        return now is not None and now.may_act_for(row.user_id)

    return live


@admits_itself
async def conversation_events(request: web.Request) -> web.StreamResponse:
    """A conversation's events (countersign.server.conversation_events), for those who may read its
    transcript (its user, a token acting for them, an admin of its tenant; 404 for anyone else)."""
    requesters, caller, events = request.app[REQUESTERS], request[CALLER], request.app[EVENTS]
    after, workflow_id = resume_point(request), request.match_info["workflow_id"]
    row = await requesters.conversation(caller, workflow_id, "transcript")
    await requesters.admit(caller, requesters.actor(caller, row))
    live = liveness(request, row)
    with events.opened(caller.tenant_id, requesters.actor(caller, row)):
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the reader went away
            await stream_events(
                response,
                events,
                requesters.client,
                row.workflow_id,
                after,
                live,
                lambda: request.transport is None or request.transport.is_closing(),
            )
    return response


def add_routes(app: web.Application, requesters: Requesters, readers: ConversationEvents) -> None:
    app[REQUESTERS] = requesters
    app[EVENTS] = readers

    async def close_feed(app: web.Application) -> None:
        await app[EVENTS].feed.close()

    app.on_shutdown.append(close_feed)
    app.router.add_post("/api/conversations", start)
    app.router.add_get("/api/conversations/{workflow_id}", status)
    app.router.add_post("/api/conversations/{workflow_id}/messages", send)
    app.router.add_get("/api/conversations/{workflow_id}/transcript", transcript)
    app.router.add_get("/api/conversations/{workflow_id}/reply", reply)
    app.router.add_get("/api/conversations/{workflow_id}/audit", audit)
    app.router.add_post("/api/conversations/{workflow_id}/answers/{call_id}", answer)
    app.router.add_post("/api/conversations/{workflow_id}/rollback", rollback)
    app.router.add_post("/api/conversations/{workflow_id}/end", end)
    app.router.add_post("/api/conversations/{workflow_id}/answer", answer_by_body)
    app.router.add_get("/api/conversations/{workflow_id}/events", conversation_events)
    app.router.add_get("/api/conversations/{workflow_id}/ratings", ratings)
    app.router.add_put("/api/conversations/{workflow_id}/ratings/{turn}", rate)
