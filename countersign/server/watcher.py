"""The reviewers' live view of their pending approvals: one poll loop per tenant with an open
`approvals` events stream (`GET /api/events`), shared by the tenant's reviewers, and the stream
itself, which sends each reviewer the calls they may decide at once and after every change."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from aiohttp import web

from countersign.server.auth import SessionClaims
from countersign.server.http import HttpRefusal
from countersign.server.inbox import Inbox, PendingItem

# How often the events stream looks for new, decided and expired approvals (one poll per tenant
# with an open inbox, shared by its reviewers), and how often an idle stream sends a keep-alive.
POLL_INTERVAL_S = 0.25
KEEPALIVE_S = 15.0
MAX_STREAMS_PER_SESSION = 8  # a reviewer's tabs; each stream holds a connection open


@dataclass
class TenantFeed:
    items: dict[str, PendingItem] = field(default_factory=dict)
    listeners: set[asyncio.Queue[None]] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    # Held while the first stream loads the list and starts the loop: streams opened together wait
    # for it instead of each starting a loop of their own (all but the last ran forever).
    starting: asyncio.Lock = field(default_factory=asyncio.Lock)


def listed_differently(now: dict[str, PendingItem], before: dict[str, PendingItem]) -> bool:
    """Whether reviewers must be told: a request came or went, a call was asked again (same key,
    a new request: its nonce), or a quorum's call was approved by one more person (still pending:
    its card says "1 of 2: bob approved"). A poll can miss the moment between a decision and the
    call being asked again (its effect changed before it ran), so the keys alone may not change."""

    def shown(items: dict[str, PendingItem]) -> dict[str, tuple[str, list[str]]]:
        return {k: (i.nonce, i.approved_by) for k, i in items.items()}

    return shown(now) != shown(before)


class Watcher:
    """One poll loop per tenant with an open events stream: it reads the tenant's pending approvals
    and wakes the tenant's streams when the set changes (a call waits, is decided, expires)."""

    def __init__(self, inbox: Inbox) -> None:
        self._inbox = inbox
        self._feeds: dict[str, TenantFeed] = {}
        self._streams: dict[str, int] = {}  # open streams per session
        self.loops = 0  # poll loops running now: one per tenant with an open stream, never more

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

    def current(self, tenant_id: str) -> list[PendingItem]:
        feed = self._feeds.get(tenant_id)
        return list(feed.items.values()) if feed else []

    def listed(self, tenant_id: str, workflow_id: str, call_id: str) -> PendingItem | None:
        """The call as the tenant's open stream last listed it (None: no stream, or not listed)."""
        feed = self._feeds.get(tenant_id)
        return feed.items.get(f"{workflow_id}/{call_id}") if feed else None

    @contextlib.asynccontextmanager
    async def listen(self, tenant_id: str) -> AsyncIterator[asyncio.Queue[None]]:
        feed = self._feeds.setdefault(tenant_id, TenantFeed())
        queue: asyncio.Queue[None] = asyncio.Queue(maxsize=1)
        feed.listeners.add(queue)
        try:
            async with feed.starting:
                if feed.task is None:
                    feed.items = {i.key: i for i in await self._inbox.tenant_pending(tenant_id)}
                    feed.task = asyncio.create_task(self._poll(tenant_id, feed))
            yield queue
        finally:
            feed.listeners.discard(queue)
            if not feed.listeners:
                if feed.task is not None:
                    feed.task.cancel()
                if self._feeds.get(tenant_id) is feed:
                    del self._feeds[tenant_id]

    async def _poll(self, tenant_id: str, feed: TenantFeed) -> None:
        self.loops += 1
        try:
            await self._polling(tenant_id, feed)
        finally:
            self.loops -= 1

    async def _polling(self, tenant_id: str, feed: TenantFeed) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            try:
                items = {i.key: i for i in await self._inbox.tenant_pending(tenant_id, feed.items)}
            except Exception:  # Temporal briefly unreachable: keep the last view, try again
                continue
            if listed_differently(items, feed.items):
                feed.items = items
                for queue in feed.listeners:
                    with contextlib.suppress(asyncio.QueueFull):
                        queue.put_nowait(None)

    async def close(self) -> None:
        for feed in self._feeds.values():
            if feed.task is not None:
                feed.task.cancel()


async def stream_approvals(
    response: web.StreamResponse, watcher: Watcher, inbox: Inbox, claims: SessionClaims, roles: list[str]
) -> None:
    """Until the session ends (logout, password change, user removed, expiry), checked at every
    change and keep-alive: then the stream closes, and the page's reconnect is refused."""
    reviewer = claims.reviewer
    async with watcher.listen(reviewer.tenant_id) as changed:
        changed_now = True
        while await inbox.live(claims):
            if changed_now:
                mine = [
                    i.as_json()
                    for i in watcher.current(reviewer.tenant_id)
                    if inbox.may_decide(i, reviewer, roles)
                ]
                await response.write(f"event: approvals\ndata: {json.dumps(mine)}\n\n".encode())
            try:  # until the next change; a comment now and then keeps proxies from closing it
                await asyncio.wait_for(changed.get(), KEEPALIVE_S)
                changed_now = True
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                changed_now = False
