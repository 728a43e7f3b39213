"""A person's notifications over HTTP (the page's session; countersign.db.notifications scopes them):

- `GET /api/notifications?status=open|resolved|all&limit=N`: their own and their tenant's tenant-wide
  ones, newest first, open by default;
- `POST /api/notifications/{id}/resolve` (JSON body, `{}`): resolve one; an already resolved one is
  left as it was (`"changed": false`). Another user's or another tenant's answers 404.

The person is the session's, never a name in the request: unlike the CLI's `--as`, this works in the
signed mode too. An API token cannot reach these routes (the middleware keeps tokens to the
conversation API).
"""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from countersign.db.notifications import (
    MAX_LISTED,
    StatusFilter,
    as_row,
    mark_resolved,
    notification_of,
    notifications_of,
)
from countersign.server.door import REQUESTERS
from countersign.server.http import REVIEWER, HttpRefusal, parse
from tools.registry import record_id

STATUSES: dict[str, StatusFilter] = {"open": "open", "resolved": "resolved", "all": "all"}


class ResolveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


async def list_notifications(request: web.Request) -> web.Response:
    person, limit = request[REVIEWER], request.query.get("limit", "50")
    status = STATUSES.get(request.query.get("status", "open"))
    if status is None or not (
        len(limit) <= 3 and limit.isascii() and limit.isdigit() and 1 <= int(limit) <= MAX_LISTED
    ):
        raise HttpRefusal(400, f"status is open, resolved or all; limit is 1-{MAX_LISTED}")
    async with request.app[REQUESTERS].sessions() as session:
        found = await notifications_of(session, person.tenant_id, person.user_id, status, int(limit))
        return web.json_response({"notifications": [as_row(n) for n in found]})


async def resolve(request: web.Request) -> web.Response:
    await parse(request, ResolveBody, invalid=400)
    person, raw = request[REVIEWER], request.match_info["notification_id"]
    notification_id = record_id(raw)
    if notification_id is None:
        raise HttpRefusal(404, f"no notification {raw[:40]!r}")
    async with request.app[REQUESTERS].sessions.begin() as session:
        found = await notification_of(session, person.tenant_id, person.user_id, notification_id)
        if found is None:
            raise HttpRefusal(404, f"no notification {notification_id} for {person.user_id}")
        changed = mark_resolved(found, person.user_id, datetime.now(UTC))
        await session.flush()
        return web.json_response(as_row(found) | {"changed": changed})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/notifications", list_notifications)
    app.router.add_post("/api/notifications/{notification_id}/resolve", resolve)
