"""Saved email drafts for the people of a tenant, over HTTP (the inbox's session):

- `GET /api/drafts?state=unsent|sent|all&limit=N`: newest first, unsent by default;
- `GET /api/drafts/{id}`: one draft in full;
- `PATCH /api/drafts/{id}` with `{"to", "subject", "body", "html_body"}` (any of them): an edit, checked
  as the agent's `update_draft` checks it (`tools/drafts.py` `edit_draft`), by the draft's author or
  an admin, recorded with its diff as the session's person's.

There is no send route: a draft is sent by the agent's `send_draft`, which waits for a reviewer and the
undo window like every email. Another tenant's draft answers 404; a sent one, or one a call waiting
for a decision names, 409; someone else's draft (to a non-admin) 403.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import ValidationError

from countersign.server.door import CALLER, REQUESTERS
from countersign.server.http import HttpRefusal, parse
from tools.drafts import (
    DraftChanges,
    DraftDetail,
    DraftEditor,
    DraftState,
    UpdateDraftArgs,
    draft_of,
    drafts_of,
    edit_draft,
)
from tools.registry import ToolFailure, record_id

STATES: dict[str, DraftState] = {"unsent": "unsent", "sent": "sent", "all": "all"}
FAILURE_STATUS = {"NOT_FOUND": 404, "CONFLICT": 409, "FORBIDDEN": 403}


def refused(failure: ToolFailure) -> HttpRefusal:
    return HttpRefusal(FAILURE_STATUS.get(failure.code, 400), str(failure))


def draft_id_of(request: web.Request) -> int:
    raw = request.match_info["draft_id"]
    draft_id = record_id(raw)
    if draft_id is None:
        raise HttpRefusal(404, f"no draft {raw[:40]!r}")
    return draft_id


async def list_drafts(request: web.Request) -> web.Response:
    state = STATES.get(request.query.get("state", "unsent"))
    limit = request.query.get("limit", "50")
    if state is None or not (
        len(limit) <= 3 and limit.isascii() and limit.isdigit() and 1 <= int(limit) <= 100
    ):
        raise HttpRefusal(400, "state is unsent, sent or all; limit is 1-100")
    async with request.app[REQUESTERS].sessions() as session:
        found = await drafts_of(session, request[CALLER].tenant_id, state, int(limit))
    return web.json_response(found.model_dump(mode="json"))


async def get_draft(request: web.Request) -> web.Response:
    async with request.app[REQUESTERS].sessions() as session:
        try:
            draft = await draft_of(session, request[CALLER].tenant_id, draft_id_of(request))
        except ToolFailure as failure:
            raise refused(failure) from None
        return web.json_response(DraftDetail.model_validate(draft).model_dump(mode="json"))


async def edit(request: web.Request) -> web.Response:
    changes: DraftChanges = await parse(request, DraftChanges, invalid=400)
    draft_id = draft_id_of(request)
    try:
        args = UpdateDraftArgs.model_validate({**changes.model_dump(exclude_none=True), "draft": draft_id})
    except ValidationError:
        raise HttpRefusal(400, "give to, subject, body or html_body to change") from None
    caller = request[CALLER]
    if caller.person is None:  # the middleware admits only sessions here; never an anonymous edit
        raise HttpRefusal(403, "drafts are edited by a person's session")
    async with request.app[REQUESTERS].sessions.begin() as session:
        try:
            draft = await draft_of(session, caller.tenant_id, draft_id, lock=True)
            await edit_draft(session, draft, args, DraftEditor(caller.person, "inbox"))
        except ToolFailure as failure:
            raise refused(failure) from None
        return web.json_response(DraftDetail.model_validate(draft).model_dump(mode="json"))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/drafts", list_drafts)
    app.router.add_get("/api/drafts/{draft_id}", get_draft)
    app.router.add_patch("/api/drafts/{draft_id}", edit)
