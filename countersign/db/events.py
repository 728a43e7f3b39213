"""Conversation events: what a conversation's readers (the chat page, the CLI) are told as it happens.

Written outside workflow history, in `conversation_events`, by the activities that make things
happen: the model call (text deltas as they stream), the store (messages, tool calls, results and
turns, from the messages it stores, in the same transaction), the argument check (a question, as
it is asked), the approval activities (a call waits,
is decided, expires), the compensations (rollbacks). Each write ends with a NOTIFY on `CHANNEL`
(payload: the workflow id), delivered at commit, which wakes the server's readers; they read rows
after the last id they sent, so a reader that reconnects with `Last-Event-ID` misses nothing.

An event with a `key` is written once however often its activity is retried. Deltas have none: a
retried model call starts with a `delta` that has `reset: true`, and every delta names the model
call (`seq`) and attempt it belongs to, so a reader never shows two attempts' text mixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

import asyncpg
from pydantic import BaseModel
from sqlalchemy import Select, bindparam, func, literal, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from countersign.core.contract import TurnStop
from countersign.core.direct import MARKER_NAME
from countersign.core.shown import fold
from countersign.core.summaries import summarize_result
from countersign.db.instances import CURRENT_INSTANCE_SQL, current_instance
from countersign.db.schema import ConversationEvent, ConversationMessage

CHANNEL = "conversation_events"
TURN_STOPS: tuple[TurnStop, ...] = ("limit_reached", "error")  # a turn's closing note names how it stopped
QUESTION_TOOL = "ask_human"
ARGS_SHOWN = 2000  # a tool call's arguments in an event, at most (the transcript has them whole)
RESULT_SHOWN = 4000  # a tool call's result in an event, at most (the transcript has it whole)


class Event(BaseModel):
    id: int
    kind: str
    data: dict[str, Any]

    def sse(self) -> bytes:
        """The event as a server-sent event, its id the stream's resumption point."""
        return f"id: {self.id}\nevent: {self.kind}\ndata: {json.dumps(self.data)}\n\n".encode()


def _published() -> Select[tuple[int, Any]]:
    """The one statement of `publish`: the event inserted (a data-modifying CTE, which runs whether
    or not its rows are read) and, for a row it inserted, the NOTIFY, in one round trip. Built once:
    a statement built per call would have its cache key generated again at every event."""
    event = ConversationEvent.__table__
    inserted = (
        insert(ConversationEvent)
        .values({c: bindparam(c, type_=event.c[c].type) for c in PUBLISHED})
        .on_conflict_do_nothing()
        .returning(ConversationEvent.id, ConversationEvent.workflow_id)
        .cte("inserted")
    )
    return select(inserted.c.id, func.pg_notify(literal(CHANNEL), inserted.c.workflow_id))


PUBLISHED = ("workflow_id", "conversation_id", "tenant_id", "kind", "data", "key")
PUBLISH = _published()


async def publish(
    session: AsyncSession | AsyncConnection,
    workflow_id: str,
    conversation_id: str,
    tenant_id: str,
    kind: str,
    data: dict[str, Any],
    key: str | None = None,
) -> int | None:
    """Write one event in the caller's transaction and wake its readers at commit; None when an
    event with this `key` was written before (a retried activity)."""
    values = dict(zip(PUBLISHED, (workflow_id, conversation_id, tenant_id, kind, data, key), strict=True))
    inserted: int | None = await session.scalar(PUBLISH, values)
    return inserted


def arguments_of(arguments: str) -> Any:
    """A tool call's arguments as JSON for a reader (the text itself when it is not JSON); longer
    than ARGS_SHOWN, their first characters folded with the visible mark (countersign.core.shown):
    the transcript has them whole."""
    if len(arguments) > ARGS_SHOWN:
        return fold(arguments, ARGS_SHOWN)[0]
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def result_ok(content: str | None) -> bool:
    """Whether a stored tool message says `"ok": true`."""
    try:
        parsed = json.loads(content or "")
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("ok") is True


def result_shown(content: str | None) -> dict[str, str]:
    """A tool result as its step shows it: one line (`summary`: what the transcript prints, an
    error's code and message, an approver's edit and why) and the result as the model read it
    (`result`: already bounded and redacted by the tool activity's guards, cut at RESULT_SHOWN)."""
    text = content or ""
    cut = text if len(text) <= RESULT_SHOWN else text[: RESULT_SHOWN - 1] + "…"
    return {"summary": summarize_result(text), "result": cut}


def tool_result_event(row: dict[str, Any]) -> tuple[str, dict[str, Any], str] | None:
    """The event of a tool's result message (a `conversation_messages` row's values): its kind,
    data and key; None for any other message."""
    if row["role"] != "tool" or not row["tool_call_id"]:
        return None
    call_id = row["tool_call_id"]
    data = {"call_id": call_id, "tool": row["name"], "ok": result_ok(row["content"]), "seq": row["seq"]}
    return "tool_result", data | result_shown(row["content"]), f"tool_result:{call_id}"


def published_with(inserted: Any) -> tuple[Any, Any]:
    """`publish`'s insert and NOTIFY as parts of a caller's statement: a CTE inserting the event
    (its values the parameters `e_` + PUBLISHED) for each row of the CTE `inserted` (so only when
    that row was inserted), and a scalar subquery that NOTIFYs for the event inserted, to select in
    the statement (a retried write inserts neither, and wakes nobody)."""
    event = ConversationEvent.__table__
    values = [bindparam(f"e_{c}", type_=event.c[c].type) for c in PUBLISHED]
    told = (
        insert(ConversationEvent)
        .from_select(list(PUBLISHED), select(*values).select_from(inserted))
        .on_conflict_do_nothing()
        .returning(ConversationEvent.workflow_id)
        .cte("told")
    )
    return told, select(func.pg_notify(literal(CHANNEL), told.c.workflow_id)).scalar_subquery()


async def publish_message(session: AsyncSession | AsyncConnection, row: dict[str, Any]) -> None:
    """The events of a message the store has just inserted (a `conversation_messages` row's values):
    the user's message, an assistant's tool calls, a tool's result, or the reply that ends a turn.
    (A question is told by the activity that checks it, when it is asked: activities.tools.)"""
    tenant_id, instance = row["tenant_id"], (row["workflow_id"], row["conversation_id"])
    if row["role"] == "user":
        said = {"text": row["content"], "user": row["name"]}
        await publish(session, *instance, tenant_id, "message", said, f"message:{row['seq']}")
    if (told := tool_result_event(row)) is not None:
        kind, data, key = told
        await publish(session, *instance, tenant_id, kind, data, key)
    if row["role"] != "assistant" or row["name"] == MARKER_NAME:  # direct mode's marker: the turn goes on
        return
    for call in row["tool_calls"] or []:
        call_id, tool = str(call.get("id", "")), str(call.get("name", ""))
        args = arguments_of(str(call.get("arguments") or ""))
        data = {"call_id": call_id, "tool": tool, "args": args, "seq": row["seq"]}
        await publish(session, *instance, tenant_id, "tool_call", data, f"tool_call:{call_id}")
    if not row["tool_calls"]:
        turn = await session.scalar(
            select(func.count()).where(
                ConversationMessage.workflow_id == instance[0],
                ConversationMessage.conversation_id == instance[1],
                ConversationMessage.role == "user",
            )
        )
        stop = row["name"] if row["name"] in TURN_STOPS else "completed"
        data = {"turn": turn, "reply": row["content"], "stop": stop, "seq": row["seq"]}
        await publish(session, *instance, tenant_id, "turn", data, f"turn:{row['seq']}")


def streamed_text(events: list[Event]) -> dict[int, str]:
    """What a reader shows of each model call's text (by `seq`) after `events`: a reset voids what
    earlier attempts of that call showed, and a delta of an older attempt is ignored."""
    text: dict[int, str] = {}
    attempt: dict[int, int] = {}
    for event in events:
        if event.kind != "delta":
            continue
        seq, tried = int(event.data["seq"]), int(event.data["attempt"])
        if tried < attempt.get(seq, 0):
            continue
        if tried > attempt.get(seq, 0) or event.data.get("reset"):
            text[seq] = ""
        attempt[seq] = tried
        text[seq] = text.get(seq, "") + str(event.data["text"])
    return text


class EventLog:
    """Reads and writes `conversation_events` in transactions of its own."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def publish(
        self,
        workflow_id: str,
        conversation_id: str,
        tenant_id: str,
        kind: str,
        data: dict[str, Any],
        key: str | None = None,
    ) -> int | None:
        async with self.sessions() as session, session.begin():
            return await publish(session, workflow_id, conversation_id, tenant_id, kind, data, key)

    async def after(self, workflow_id: str, last_id: int, limit: int = 500) -> list[Event]:
        """The events of the conversation instance `workflow_id` names now after `last_id`, oldest
        first (none of an earlier conversation under the same id: db.instances)."""
        query = (
            select(ConversationEvent.id, ConversationEvent.kind, ConversationEvent.data)
            .where(
                ConversationEvent.workflow_id == workflow_id,
                ConversationEvent.conversation_id == current_instance(workflow_id),
                ConversationEvent.id > last_id,
            )
            .order_by(ConversationEvent.id)
            .limit(limit)
        )
        async with self.sessions() as session:
            rows = (await session.execute(query)).all()
        return [Event(id=i, kind=k, data=d) for i, k, d in rows]

    async def latest_id(self, workflow_id: str) -> int:
        """The id of the latest event of the instance `workflow_id` names now (0: none yet)."""
        query = select(func.coalesce(func.max(ConversationEvent.id), 0)).where(
            ConversationEvent.workflow_id == workflow_id,
            ConversationEvent.conversation_id == current_instance(workflow_id),
        )
        async with self.sessions() as session:
            return int(await session.scalar(query) or 0)


def listen_dsn(database_url: str) -> str:
    """The plain libpq URL of a SQLAlchemy one (`postgresql+asyncpg://…`), for an asyncpg LISTEN."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


async def follow(
    database_url: str, workflow_id: str, after: int = 0, idle_s: float = 15.0
) -> AsyncGenerator[Event]:
    """A conversation's events after `after`, as they are written, for as long as the caller reads:
    one connection that LISTENs and reads (the CLI's view; the server shares one per process). A
    lost NOTIFY delays an event by at most `idle_s`, it never drops one."""
    connection = await asyncpg.connect(listen_dsn(database_url))
    woken: asyncio.Queue[None] = asyncio.Queue(maxsize=1)

    def notified(_connection: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == workflow_id:
            with contextlib.suppress(asyncio.QueueFull):
                woken.put_nowait(None)

    try:
        await connection.add_listener(CHANNEL, notified)
        while True:
            rows = await connection.fetch(
                "SELECT id, kind, data::text FROM conversation_events WHERE workflow_id = $1"
                f" AND conversation_id = {CURRENT_INSTANCE_SQL} AND id > $2 ORDER BY id LIMIT 500",
                workflow_id,
                after,
            )
            for row in rows:
                after = row["id"]
                yield Event(id=row["id"], kind=row["kind"], data=json.loads(row["data"]))
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.get(), idle_s)
    finally:
        await connection.close()


async def last_id(database_url: str, workflow_id: str) -> int:
    """The id of the conversation's latest event (0: none): where a reader that has shown the
    transcript so far starts following."""
    connection = await asyncpg.connect(listen_dsn(database_url))
    try:
        found = await connection.fetchval(
            "SELECT coalesce(max(id), 0) FROM conversation_events WHERE workflow_id = $1"
            f" AND conversation_id = {CURRENT_INSTANCE_SQL}",
            workflow_id,
        )
    finally:
        await connection.close()
    return int(found)
