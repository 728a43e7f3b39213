"""The server's pages and what they share: the templates, who is signed in (the session behind the
bearer token or the page's cookie), and the header every page draws (its links: the inbox, the chat,
one's drafts and notifications, and for a tenant's admins the tools page).

The pages added here, beside the inbox (`/`) and the chat (`/chat`) that countersign.server.app serves:

- `/tools`: a tenant admin's tier panel, each agent's tools with risk, category, whether they can be
  undone and their tier, changed through `PUT /api/agents/{agent}/tools` (countersign.server.agent_tools,
  whose rules hold) and its history from `tier_changes`;
- `/policies`: a tenant admin's Cedar policies (countersign.server.policies): the enforced and
  shadow sets, validate, apply, apply as shadow, and the calls the shadow set would decide otherwise;
- `/channels`: a tenant admin's chat channel (countersign.server.channels' admin API): its settings
  without secrets, a test post, where decisions are made (the risks a press in the chat decides),
  the sender map (link, unlink) and the changes;
- `/drafts`: a person's email drafts (read, edit through `PATCH /api/drafts/{id}`, and send: a link
  to the chat with an agent that has `send_draft`, the message ready, so that it goes through
  approval like every email) and notifications (list, resolve through countersign.server.notifications).

Each page is drawn by its script under /static from the JSON API: no inline script or handler.
Every template extends templates/page.html (the head, the header, the login form for who is signed
out, the scripts), the admins' pages through admin_page.html (the refusal for who is no admin).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web
from sqlalchemy import select

from countersign.core.authority import ADMIN
from countersign.db.schema import AgentToolPermission
from countersign.identity import tokens
from countersign.server.auth import Reviewer, SessionClaims
from countersign.server.door import REQUESTERS
from countersign.server.http import bearer_of
from countersign.server.inbox_routes import INBOX
from countersign.server.oidc import OidcProvider
from countersign.server.signin import SIGN_IN

HERE = Path(__file__).resolve().parent
SENDS_DRAFTS = "send_draft"  # the tool a draft is sent with (tools/drafts.py)
OIDC = web.AppKey("oidc", OidcProvider)

templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, enable_async=False
)


async def session_of(request: web.Request) -> SessionClaims | None:
    """The caller's live session (bearer token, else the cookie), or None."""
    token = bearer_of(request)
    if not token or tokens.looks_like_token(token):
        return None
    return await request.app[SIGN_IN].session_of(token)


async def header_of(request: web.Request) -> dict[str, Any]:
    """What every page's header needs: the signed-in person (None: the page shows the login form,
    with the OIDC provider's name when one is configured) and whether they are an admin of their
    tenant (roles from PostgreSQL): only admins get the tools page's link."""
    claims = await session_of(request)
    person: Reviewer | None = claims.reviewer if claims else None
    admin = person is not None and ADMIN in await request.app[INBOX].roles(person)
    oidc = request.app.get(OIDC)
    return {"person": person, "admin": admin, "oidc_name": oidc.config.name if oidc else None}


def render(name: str, **values: Any) -> web.Response:
    return web.Response(text=templates.get_template(name).render(**values), content_type="text/html")


def admin_page(template: str, here: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A page for the tenant's admins (the tools, the policies): for anyone else signed in, a
    refusal (403) instead of its panel; signed out, the login form."""

    async def page(request: web.Request) -> web.Response:
        header = await header_of(request)
        status = 403 if header["person"] is not None and not header["admin"] else 200
        response = render(template, here=here, **header)
        response.set_status(status)
        return response

    return page


async def drafts_page(request: web.Request) -> web.Response:
    """The drafts and notifications; a draft is sent by asking the first agent (by name) that has the
    sending tool, in the chat ("" when none has: the page then offers no way to send)."""
    async with request.app[REQUESTERS].sessions() as session:
        sender = await session.scalar(
            select(AgentToolPermission.agent)
            .where(AgentToolPermission.tool == SENDS_DRAFTS)
            .order_by(AgentToolPermission.agent)
            .limit(1)
        )
    return render("drafts.html", here="drafts", sender=sender or "", **await header_of(request))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/tools", admin_page("tools.html", "tools"))
    app.router.add_get("/policies", admin_page("policies.html", "policies"))
    app.router.add_get("/channels", admin_page("channels.html", "channels"))
    app.router.add_get("/drafts", drafts_page)
