"""The reviewers' live view of their pending approvals: one poll loop per tenant and kind of
reviewer (what they may decide: `Decidable`) with an open `approvals` events stream
(`GET /api/events`), shared by those reviewers, and the stream itself, which sends each reviewer
the calls they may decide at once and after every change. A loop reads only the head its streams
show (the largest page one asked for, `?limit=`), never the whole tenant."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from aiohttp import web

from countersign.server.auth import SessionClaims
from countersign.server.http import HttpRefusal
from countersign.server.inbox import Decidable, Inbox, Page, PendingItem
from countersign.server.signin import SignIn

# How often the events stream looks for new, decided and expired approvals (one poll per tenant and
# Decidable with an open inbox, shared by those reviewers), and how often an idle stream sends a
# keep-alive.
POLL_INTERVAL_S = 0.25
KEEPALIVE_S = 15.0
MAX_STREAMS_PER_SESSION = 8  # a reviewer's tabs; each stream holds a connection open


@dataclass
class Feed:
    """What a poll loop last read for its streams (the calls, by key, in the inbox's order; how
    many more wait) and how far it read (`head`: None for all)."""

    items: dict[str, PendingItem] = field(default_factory=dict)
    more: int = 0
    head: int | None = 0
    listeners: dict[asyncio.Queue[None], int | None] = field(default_factory=dict)  # each one's page
    task: asyncio.Task[None] | None = None
    # Held while the first stream loads the list and starts the loop: streams opened together wait
    # for it instead of each starting a loop of their own (all but the last ran forever); and while
    # a read is under way, so a poll that began with a shorter head never overwrites a longer one.
    reading: asyncio.Lock = field(default_factory=asyncio.Lock)

    def wanted(self) -> int | None:
        """The largest page an open stream shows (None: one shows them all)."""
        pages = list(self.listeners.values())
        return None if None in pages else max((p for p in pages if p is not None), default=0)

    def read(self, page: Page, head: int | None) -> None:
        self.items, self.more, self.head = {i.key: i for i in page.items}, page.more, head

    def shown(self, limit: int | None) -> Page:
        """The page a stream of `limit` calls shows (None: all of them)."""
        items = list(self.items.values())
        if limit is None or limit >= len(items):
            return Page(items=items, more=self.more)
        return Page(items=items[:limit], more=len(items) - limit + self.more)


def covers(head: int | None, limit: int | None) -> bool:
    """Whether a read of `head` calls (None: all) holds a page of `limit` (None: all)."""
    return head is None or (limit is not None and limit <= head)


def listed_differently(now: dict[str, PendingItem], before: dict[str, PendingItem]) -> bool:
    """Whether reviewers must be told: a request came or went, a call was asked again (same key,
    a new request: its nonce), or a quorum's call was approved by one more person (still pending:
    its card says "1 of 2: bob approved"). A poll can miss the moment between a decision and the
    call being asked again (its effect changed before it ran), so the keys alone may not change."""

    def shown(items: dict[str, PendingItem]) -> dict[str, tuple[str, list[str]]]:
        return {k: (i.nonce, i.approved_by) for k, i in items.items()}

    return shown(now) != shown(before)


class Watcher:
    """One poll loop per tenant and `Decidable` with an open events stream: it reads the head of
    the pending approvals those reviewers may decide and wakes their streams when it changes (a
    call waits, is decided, expires, or the count of the rest moves)."""

    def __init__(self, inbox: Inbox) -> None:
        self._inbox = inbox
        self._feeds: dict[tuple[str, Decidable], Feed] = {}
        self._streams: dict[str, int] = {}  # open streams per session
        self.loops = 0  # poll loops running now: one per tenant and Decidable with an open stream

    @contextlib.contextmanager
    def stream_of(self, session_id: str) -> Iterator[None]:
        """Count one open stream of a session; HttpRefusal 429 past MAX_STREAMS_PER_SESSION."""
        if self._streams.get(session_id, 0) >= MAX_STREAMS_PER_SESSION:
            raise HttpRefusal(
                429,
                f"at most {MAX_STREAMS_PER_SESSION} live streams per session; close a tab",
                retry_after_s=5,
            )
        self._streams[session_id] = self._streams.get(session_id, 0) + 1
        try:
            yield
        finally:
            self._streams[session_id] -= 1
            if not self._streams[session_id]:
                del self._streams[session_id]

    def listed(self, tenant_id: str, workflow_id: str, call_id: str) -> PendingItem | None:
        """The call as an open stream of the tenant last listed it (None: no stream, or not listed)."""
        key = f"{workflow_id}/{call_id}"
        for (tenant, _), feed in self._feeds.items():
            if tenant == tenant_id and key in feed.items:
                return feed.items[key]
        return None

    @contextlib.asynccontextmanager
    async def listen(
        self, tenant_id: str, decidable: Decidable, limit: int | None
    ) -> AsyncIterator[tuple[Feed, asyncio.Queue[None]]]:
        """Join (or start) the poll loop of these reviewers, with a page of `limit` calls (None:
        all): a page longer than the loop read so far is read at once, not at its next poll."""
        feed = self._feeds.setdefault((tenant_id, decidable), Feed())
        queue: asyncio.Queue[None] = asyncio.Queue(maxsize=1)
        feed.listeners[queue] = limit
        try:
            async with feed.reading:
                if feed.task is None or not covers(feed.head, limit):
                    head = feed.wanted()
                    feed.read(await self._inbox.page(tenant_id, decidable, head, known=feed.items), head)
                if feed.task is None:
                    feed.task = asyncio.create_task(self._poll(tenant_id, decidable, feed))
            yield feed, queue
        finally:
            del feed.listeners[queue]
            if not feed.listeners:
                if feed.task is not None:
                    feed.task.cancel()
                if self._feeds.get((tenant_id, decidable)) is feed:
                    del self._feeds[(tenant_id, decidable)]

    async def _poll(self, tenant_id: str, decidable: Decidable, feed: Feed) -> None:
        self.loops += 1
        try:
            await self._polling(tenant_id, decidable, feed)
        finally:
            self.loops -= 1

    async def _polling(self, tenant_id: str, decidable: Decidable, feed: Feed) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            async with feed.reading:
                head = feed.wanted()
                try:
                    page = await self._inbox.page(tenant_id, decidable, head, known=feed.items)
                except Exception:  # Temporal briefly unreachable: keep the last view, try again
                    continue
                items = {i.key: i for i in page.items}
                changed = listed_differently(items, feed.items) or page.more != feed.more
                feed.read(page, head)
            if changed:
                for queue in feed.listeners:
                    with contextlib.suppress(asyncio.QueueFull):
                        queue.put_nowait(None)

    async def close(self) -> None:
        for feed in self._feeds.values():
            if feed.task is not None:
                feed.task.cancel()


def approvals_event(page: Page, limit: int | None) -> bytes:
    """An `approvals` event: the calls as a list (a stream without `limit`: all of them, as
    before paging), or `{"items", "more"}` (the page, and how many more wait after it)."""
    items = [i.as_json() for i in page.items]
    data = items if limit is None else {"items": items, "more": page.more}
    return f"event: approvals\ndata: {json.dumps(data)}\n\n".encode()


async def stream_approvals(
    response: web.StreamResponse,
    watcher: Watcher,
    sign_in: SignIn,
    claims: SessionClaims,
    decidable: Decidable,
    limit: int | None,
) -> None:
    """Until the session ends (logout, password change, user removed, expiry), checked at every
    change and keep-alive: then the stream closes, and the page's reconnect is refused."""
    async with watcher.listen(claims.reviewer.tenant_id, decidable, limit) as (feed, changed):
        changed_now = True
        while await sign_in.live(claims):
            if changed_now:
                await response.write(approvals_event(feed.shown(limit), limit))
            try:  # until the next change; a comment now and then keeps proxies from closing it
                await asyncio.wait_for(changed.get(), KEEPALIVE_S)
                changed_now = True
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                changed_now = False
