"""The reviewers' side of the server: the calls waiting for them (listed, and streamed as they
change), decisions one by one or in a batch across conversations, the history of decisions, the
grants reviewers made (listed, revoked), an admin's "always allow" and an admin's export of the
audit. The work is in countersign.server.inbox; the live view in countersign.server.watcher."""

from __future__ import annotations

import contextlib
from typing import Any

from aiohttp import web

from countersign.core.approvals import Approval
from countersign.server.http import REVIEWER, SESSION, SSE_HEADERS, HttpRefusal, parse
from countersign.server.inbox import (
    MAX_PAGE,
    AlwaysAllowRequest,
    BatchRequest,
    Cursor,
    DecisionRequest,
    Inbox,
)
from countersign.server.signin import SIGN_IN
from countersign.server.watcher import Watcher, stream_approvals

INBOX = web.AppKey("inbox", Inbox)
WATCHER = web.AppKey("watcher", Watcher)


def page_limit(request: web.Request) -> int | None:
    """`?limit=N`: how many calls a page lists, 1 to MAX_PAGE (None when not asked: all of them)."""
    raw = request.query.get("limit")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= len(str(MAX_PAGE)) and 1 <= int(raw) <= MAX_PAGE):
        raise HttpRefusal(400, f"limit must be a whole number from 1 to {MAX_PAGE}, not {raw[:20]!r}")
    return int(raw)


def page_after(request: web.Request, limit: int | None) -> Cursor | None:
    """`?after=CURSOR`: the page after the one whose `Link: <…>; rel="next"` gave it."""
    raw = request.query.get("after")
    if raw is None:
        return None
    if limit is None:
        raise HttpRefusal(400, "after comes with limit (the next page's link has both)")
    try:
        return Cursor.parse(raw)
    except ValueError:
        raise HttpRefusal(400, "after is not a cursor this server gave (take the next page's link)") from None


async def events(request: web.Request) -> web.StreamResponse:
    """`approvals` events: the caller's pending approvals (all, or the first `?limit=` and how many
    more wait), sent at once and after every change."""
    limit = page_limit(request)
    inbox, watcher = request.app[INBOX], request.app[WATCHER]
    decidable = await inbox.decidable(request[REVIEWER])
    response = web.StreamResponse(headers=SSE_HEADERS)
    with watcher.stream_of(request[SESSION].session_id):
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the reviewer closed the page
            await stream_approvals(
                response, watcher, request.app[SIGN_IN], request[SESSION], decidable, limit
            )
    return response


async def approvals(request: web.Request) -> web.Response:
    """The caller's pending approvals: all of them, or with `?limit=N` the first N (after
    `?after=`), how many more wait (`More-Waiting`) and the next page's `Link` (rel="next")."""
    limit = page_limit(request)
    page = await request.app[INBOX].pending_for(request[REVIEWER], limit, page_after(request, limit))
    response = web.json_response([i.as_json() for i in page.items])
    if limit is not None:
        response.headers["More-Waiting"] = str(page.more)
        if page.next is not None:
            url = request.rel_url.update_query(after=page.next.token())
            response.headers["Link"] = f'<{url}>; rel="next"'
    return response


def decided(approval: Approval) -> dict[str, Any]:
    """A recorded decision as the API answers it, with `outcome`: the line a person is shown
    ("approved by bob", "1 of 2 approved (bob); 1 more approval needed")."""
    return {**approval.model_dump(mode="json"), "outcome": approval.outcome()}


async def decide(request: web.Request) -> web.Response:
    body: DecisionRequest = await parse(request, DecisionRequest, invalid=400)
    reviewer, match = request[REVIEWER], request.match_info
    known = request.app[WATCHER].listed(reviewer.tenant_id, match["workflow_id"], match["call_id"])
    approval = await request.app[INBOX].decide(reviewer, match["workflow_id"], match["call_id"], body, known)
    return web.json_response(decided(approval))


async def decide_batch(request: web.Request) -> web.Response:
    """Decide several calls, across conversations; each item answers on its own (one refusal does
    not undo the others)."""
    body: BatchRequest = await parse(request, BatchRequest, invalid=400)
    inbox, reviewer = request.app[INBOX], request[REVIEWER]
    results = []
    for item in body.items:
        single = DecisionRequest(decision=body.decision, reason=body.reason)
        try:
            known = request.app[WATCHER].listed(reviewer.tenant_id, item.workflow_id, item.call_id)
            approval = await inbox.decide(reviewer, item.workflow_id, item.call_id, single, known)
            results.append({**item.model_dump(), "status": 200, "decision": decided(approval)})
        except HttpRefusal as err:
            results.append({**item.model_dump(), "status": err.status, "error": str(err)})
    return web.json_response(results)


async def always_allow(request: web.Request) -> web.Response:
    """An admin's "always allow this tool for this agent", from a pending call (see Inbox.always_allow)."""
    await parse(request, AlwaysAllowRequest, invalid=400)
    change = await request.app[INBOX].always_allow(
        request[REVIEWER], request.match_info["workflow_id"], request.match_info["call_id"]
    )
    return web.json_response(change)


async def grants(request: web.Request) -> web.Response:
    """The tenant's grants the caller may see (Inbox.grants)."""
    return web.json_response(await request.app[INBOX].grants(request[REVIEWER]))


async def revoke_grant(request: web.Request) -> web.Response:
    """Revoke a grant: its approver, or an admin of the tenant (Inbox.revoke_grant)."""
    raw = request.match_info["grant_id"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise HttpRefusal(404, f"no grant {raw}")
    return web.json_response(await request.app[INBOX].revoke_grant(request[REVIEWER], int(raw)))


async def history(request: web.Request) -> web.Response:
    return web.json_response(await request.app[INBOX].history(request[REVIEWER]))


EXPORTS = {
    "csv": ("text/csv", "decisions.csv"),
    "bundle": ("application/x-tar", "audit-bundle.tar"),
}


async def export_audit(request: web.Request) -> web.Response:
    """An admin's download of the tenant's audit: `?format=csv` (the decisions) or `bundle` (the
    signed hash chain, for `audit verify`)."""
    form = request.query.get("format", "csv")
    if form not in EXPORTS:
        raise HttpRefusal(400, f"format must be one of {', '.join(EXPORTS)}")
    body = await request.app[INBOX].export_audit(request[REVIEWER], "csv" if form == "csv" else "bundle")
    content_type, name = EXPORTS[form]
    disposition = f'attachment; filename="{request[REVIEWER].tenant_id}-{name}"'
    return web.Response(body=body, content_type=content_type, headers={"Content-Disposition": disposition})


def add_routes(app: web.Application, inbox: Inbox) -> None:
    app[INBOX] = inbox
    app[WATCHER] = Watcher(inbox)

    async def close_watcher(app: web.Application) -> None:
        await app[WATCHER].close()

    app.on_shutdown.append(close_watcher)
    app.router.add_get("/api/approvals", approvals)
    app.router.add_get("/api/history", history)
    app.router.add_get("/api/grants", grants)
    app.router.add_post("/api/grants/{grant_id}/revoke", revoke_grant)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/audit/export", export_audit)
    app.router.add_post("/api/approvals/batch", decide_batch)
    app.router.add_post("/api/approvals/{workflow_id}/{call_id}", decide)
    app.router.add_post("/api/approvals/{workflow_id}/{call_id}/always-allow", always_allow)
