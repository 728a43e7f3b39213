"""`GET /api/conversations/{workflow_id}/events`: a conversation as it happens, as server-sent events.

The events are rows of `conversation_events` (countersign.db.events), written by the activities;
this reads them in id order, after the caller's `Last-Event-ID` (header, or `?after=` for clients
that cannot set headers), so a reader that reconnects misses nothing and sees nothing twice. One
LISTEN connection per server process (`Feed`) wakes the streams of a conversation when a NOTIFY
names it; a stream also reads on every keep-alive, so a lost NOTIFY delays an event, never drops it.

`ended` is the one event not written by an activity: the stream sends it when Temporal says the
conversation's workflow has closed (checked after each turn and on every keep-alive), then closes.

Those who may read the conversation's transcript may read its events (the `conversations` row
says whose it is); anyone else gets 404, as for a conversation that does not exist. Each person has
at most MAX_STREAMS_PER_PERSON open streams (429 beyond), their MCP event streams (`GET /mcp/{agent}`,
countersign.server.mcp_face) counted with them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import asyncpg
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from countersign.db.events import CHANNEL, EventLog, listen_dsn
from countersign.server.http import HttpRefusal

MAX_STREAMS_PER_PERSON = 8
KEEPALIVE_S = 15.0
MAX_EVENT_ID = 2**63 - 1  # conversation_events.id is a PostgreSQL bigint


class Feed:
    """One LISTEN connection per process; `watch(workflow_id)` gives a queue woken per NOTIFY."""

    def __init__(self, database_url: str) -> None:
        self._dsn = listen_dsn(database_url)
        self._connection: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._watchers: defaultdict[str, set[asyncio.Queue[None]]] = defaultdict(set)

    async def _listening(self) -> None:
        async with self._lock:
            if self._connection is not None and not self._connection.is_closed():
                return
            self._connection = await asyncpg.connect(self._dsn)
            await self._connection.add_listener(CHANNEL, self._notified)

    def _notified(self, _connection: object, _pid: int, _channel: str, workflow_id: str) -> None:
        for queue in self._watchers.get(workflow_id, ()):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)

    @contextlib.asynccontextmanager
    async def watch(self, workflow_id: str) -> AsyncIterator[asyncio.Queue[None]]:
        with contextlib.suppress(OSError, asyncpg.PostgresError):  # else: keep-alive reads only
            await self._listening()
        queue: asyncio.Queue[None] = asyncio.Queue(maxsize=1)
        self._watchers[workflow_id].add(queue)
        try:
            yield queue
        finally:
            self._watchers[workflow_id].discard(queue)
            if not self._watchers[workflow_id]:
                del self._watchers[workflow_id]

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None


class ConversationEvents:
    """What the events route needs: the log, the feed, and the open streams per person (bounded)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], database_url: str) -> None:
        self.log = EventLog(sessions)
        self.feed = Feed(database_url)
        self.limit = MAX_STREAMS_PER_PERSON
        self._open: Counter[tuple[str, str]] = Counter()

    @contextlib.contextmanager
    def opened(self, tenant_id: str, user_id: str) -> Iterator[None]:
        person = (tenant_id, user_id)
        if self._open[person] >= self.limit:
            raise HttpRefusal(429, f"at most {self.limit} open event streams per person", retry_after_s=5)
        self._open[person] += 1
        try:
            yield
        finally:
            self._open[person] -= 1


def resume_point(request: web.Request) -> int:
    """The id after which to send: `Last-Event-ID`, else `?after=`, else 0 (from the start).
    Bounded here, at the edge: an event id is a bigint, and anything but a decimal number within
    it (one past 64 bits would fail the store's query and close the stream empty) is a 400."""
    raw = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    decimal = raw.isascii() and raw.isdigit() and len(raw) <= len(str(MAX_EVENT_ID))
    if not decimal or int(raw) > MAX_EVENT_ID:
        raise HttpRefusal(400, f"Last-Event-ID and ?after= are event ids: 0 to {MAX_EVENT_ID}")
    return int(raw)


async def workflow_closed(client: Client, workflow_id: str) -> bool:
    """Whether Temporal says the conversation's workflow is no longer running."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return False
    return described.status not in (None, WorkflowExecutionStatus.RUNNING)


async def stream_events(
    response: web.StreamResponse,
    events: ConversationEvents,
    client: Client,
    workflow_id: str,
    after: int,
    live: Callable[[], Awaitable[bool]],
    gone: Callable[[], bool],
) -> None:
    """Send the conversation's events after `after` as they are written, until it ends (then
    `ended`) or the session does (logout, expiry: the stream closes)."""
    async with events.feed.watch(workflow_id) as woken:
        check_closed = True
        while await live():
            batch = await events.log.after(workflow_id, after)
            for event in batch:
                await response.write(event.sse())
                after = event.id
            check_closed = check_closed or any(e.kind in ("turn", "rollback") for e in batch)
            if check_closed and await workflow_closed(client, workflow_id):
                if not await events.log.after(workflow_id, after):  # nothing written since: the end
                    await response.write(b"event: ended\ndata: {}\n\n")
                    return
                continue
            check_closed = False
            if not await woken_or_idle(woken, gone):
                await response.write(b": keep-alive\n\n")
                check_closed = True


async def woken_or_idle(woken: asyncio.Queue[None], gone: Callable[[], bool]) -> bool:
    """Wait for a wake-up (True) or KEEPALIVE_S (False); a reader that went away ends the stream
    within a second (ConnectionResetError), so that it stops counting against the person's bound."""
    loop = asyncio.get_running_loop()
    until = loop.time() + KEEPALIVE_S
    while (left := until - loop.time()) > 0:
        try:
            await asyncio.wait_for(woken.get(), min(left, 1.0))
        except TimeoutError:
            if gone():
                raise ConnectionResetError("the reader went away") from None
            continue
        return True
    return False
