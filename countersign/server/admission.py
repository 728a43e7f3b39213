"""Every API request takes a token from its caller's buckets before it does anything: the person's
(`api:user:USER`) and, for an API token, the token's (`api:token:ID`), the same buckets in
PostgreSQL (`rate_limit_buckets`, countersign.db.ratelimit) for every route and every server
process, at the same rate (`ApiRate`). A caller whose bucket is empty gets 429 with Retry-After.

The conversation API takes its own, once it knows whom the request acts for (an API token acts for
the conversation's user: countersign.server.door, `admits_itself`); this middleware takes for the
rest: the inbox's routes, drafts, the tools API, the chat page's lists, and the opening of the
approvals stream. Logging in has its own limit (countersign.server.throttle)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from countersign.server.door import ADMITS_ITSELF, CALLER, REQUESTERS


@web.middleware
async def per_caller(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Inside the authentication middleware, which names the caller (none: not an API request)."""
    caller = request.get(CALLER)
    if caller is not None and request.match_info.handler not in ADMITS_ITSELF:
        await request.app[REQUESTERS].admit(caller, caller.person)
    return await handler(request)
