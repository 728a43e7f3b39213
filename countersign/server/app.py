"""The one HTTP server, put together (aiohttp): its sides are the requesters' door (the
conversation API, countersign.server.door, and the /chat page) and the reviewers' inbox
(countersign.server.inbox_routes, and the page at /); this module adds what they share: sign-in
(password or OIDC), the middleware that finds the caller and answers refusals, and the pages.

Authentication: `POST /api/login` answers a bearer token and also sets it as an HttpOnly,
SameSite=Strict cookie, so the page (and its EventSource, which cannot send headers) is signed in
too. State-changing requests must be JSON (`Content-Type: application/json`), which a cross-site
form cannot send: with SameSite=Strict, that keeps other sites from deciding in a reviewer's name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from temporalio.client import Client
from temporalio.service import RPCError

from countersign.client.temporal_client import connect
from countersign.db.engine import create_engine, session_factory
from countersign.identity import tokens
from countersign.identity.checkpoints import keep_checkpoints
from countersign.identity.mode import recorded_mode
from countersign.identity.proofs import load_private_key
from countersign.runtime.config import Settings
from countersign.server import (
    admission,
    agent_tools,
    agui,
    channels,
    chat,
    door,
    drafts,
    headers,
    inbox_routes,
    mcp_face,
    notifications,
    openapi,
    pages,
    policies,
)
from countersign.server.auth import SESSION_TTL
from countersign.server.conversation_events import ConversationEvents
from countersign.server.door import CALLER, REQUESTERS
from countersign.server.http import (
    COOKIE,
    REVIEWER,
    SESSION,
    HttpRefusal,
    bearer_of,
    error,
    parse,
    refuse_cross_origin,
    refuse_odd_text,
)
from countersign.server.inbox import FIRST_PAGE, MAX_PAGE, Inbox
from countersign.server.inbox_routes import INBOX
from countersign.server.oidc import CALLBACK_PATH, FLOW_TTL, OidcConfig, OidcProvider, OidcRefused, open_flow
from countersign.server.pages import OIDC, header_of, render, session_of
from countersign.server.requesters import ApiRate, Caller, Requesters
from countersign.server.signin import SIGN_IN, LoginRequest, SignIn
from tools.registry import REGISTRY

HERE = Path(__file__).resolve().parent
FLOW_COOKIE = "countersign_oidc_flow"
MAX_BODY = 256 * 1024
TRUSTED_PROXIES = web.AppKey("trusted_proxies", frozenset[str])
SECURE_COOKIES = web.AppKey("secure_cookies", bool)
# The Temporal Web UI's address of a conversation, without its id ("" when not known): the page
# links each conversation id there.
WORKFLOW_URL = web.AppKey("workflow_url", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC_API = frozenset({"/api/login", openapi.PATH})  # API routes answered without a sign-in


def client_of(request: web.Request) -> str:
    """The caller's address, as the login rate limit counts it: the TCP peer, unless that is a
    trusted reverse proxy (COUNTERSIGN_INBOX_TRUSTED_PROXIES); then the nearest address in
    X-Forwarded-For that is not one. A client cannot dodge the limit by sending the header itself."""
    peer = request.remote or "unknown"
    trusted = request.app[TRUSTED_PROXIES]
    if peer not in trusted:
        return peer
    for hop in reversed(request.headers.get("X-Forwarded-For", "").split(",")):
        if hop.strip() and hop.strip() not in trusted:
            return hop.strip()
    return peer


@web.middleware
async def errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """API calls other than login need a session, or an API token for the conversation API;
    HttpRefusal becomes its JSON error."""
    try:
        if request.path != CALLBACK_PATH:  # the sign-in records what an identity provider sent, refused
            refuse_odd_text(request)
        refuse_cross_origin(request)
        if request.path.startswith("/api/") and request.path not in PUBLIC_API:
            bearer = bearer_of(request)
            if bearer is not None and tokens.looks_like_token(bearer):
                caller = await request.app[REQUESTERS].token_caller(bearer)
                if caller is None:
                    return error(401, "unknown or revoked API token")
                if not request.path.startswith("/api/conversations"):
                    return error(403, "an API token calls the conversation API only")
                request[CALLER] = caller
                return await handler(request)
            claims = await session_of(request)
            if claims is None:
                return error(401, "log in first (POST /api/login)")
            request[SESSION], request[REVIEWER] = claims, claims.reviewer
            request[CALLER] = Caller(tenant_id=claims.reviewer.tenant_id, person=claims.reviewer.user_id)
        return await handler(request)
    except HttpRefusal as err:
        return error(err.status, str(err), err.retry_after_s)
    except web.HTTPRequestEntityTooLarge:
        return error(413, f"request body larger than {MAX_BODY} bytes")
    except RPCError as err:  # Temporal unreachable or refusing: say so, in the API's shape
        return error(503, f"Temporal: {err.message}")


# --- the JSON API --------------------------------------------------------------------------------


async def login(request: web.Request) -> web.Response:
    credentials: LoginRequest = await parse(request, LoginRequest, invalid=400)
    token = await request.app[SIGN_IN].login(credentials, client_of(request))
    response = web.json_response({"token": token})
    set_session_cookie(request, response, token)
    return response


def set_session_cookie(request: web.Request, response: web.StreamResponse, token: str) -> None:
    """HttpOnly, SameSite=Strict; `Secure` under TLS (the request's, or a TLS proxy's:
    COUNTERSIGN_COOKIE_SECURE)."""
    response.set_cookie(
        COOKIE, token, httponly=True, samesite="Strict", max_age=int(SESSION_TTL.total_seconds()), path="/",
        secure=request.secure or request.app[SECURE_COOKIES],
    )  # fmt: skip


async def logout(request: web.Request) -> web.Response:
    """Revoke the caller's session server-side (the token stops working everywhere) and drop the cookie."""
    await request.app[SIGN_IN].logout(request[SESSION])
    response = web.json_response({"ok": True})
    response.del_cookie(COOKIE, path="/")
    return response


async def me(request: web.Request) -> web.Response:
    reviewer = request[REVIEWER]
    roles = await request.app[INBOX].roles(reviewer)
    async with request.app[REQUESTERS].sessions() as session:  # which mode runs: the deployment's
        mode = await recorded_mode(session) or "names"
    return web.json_response({**reviewer.model_dump(), "roles": roles, "auth_mode": mode})


# --- the page ------------------------------------------------------------------------------------


async def page(request: web.Request) -> web.Response:
    header = await header_of(request)
    shadow = None
    if header["admin"]:  # the shadow policy set's differences, for admins to see before enforcing it
        shadow = await policies.shadow_summary(request.app[REQUESTERS].sessions, header["person"].tenant_id)
    return render(
        "inbox.html",
        here="inbox",
        workflow_url=request.app[WORKFLOW_URL],
        shadow=shadow,
        page=FIRST_PAGE,
        max_page=MAX_PAGE,
        **header,
    )


async def favicon(request: web.Request) -> web.StreamResponse:
    """Browsers ask for /favicon.ico on their own: the page's icon, not a 404 in every log."""
    raise web.HTTPMovedPermanently("/static/favicon.svg")


async def chat_page(request: web.Request) -> web.Response:
    """The requesters' page (static/chat.js draws conversations from their events stream); it
    offers Undo on the steps of tools that can be undone (a compensation declared), only."""
    undoable = " ".join(sorted(name for name, tool in REGISTRY.items() if tool.compensation is not None))
    return render("chat.html", here="chat", undoable=undoable, **await header_of(request))


# --- login through the OIDC provider (countersign.server.oidc) ------------------------------------


def oidc_page(message: str, status: int, signed_in: bool = False) -> web.Response:
    response = render("oidc.html", message=message, signed_in=signed_in)
    response.set_status(status)
    return response


async def oidc_login(request: web.Request) -> web.StreamResponse:
    """Start the authorization-code flow: the flow cookie, then the provider's login page."""
    provider = request.app[OIDC]
    redirect_uri = provider.config.redirect_url or f"{request.url.origin()}{CALLBACK_PATH}"
    try:
        url, flow = await provider.start(redirect_uri)
    except (OidcRefused, aiohttp.ClientError, TimeoutError, KeyError) as err:
        return oidc_page(f"The identity provider cannot be reached: {err}", 502)
    response = web.Response(status=302, headers={"Location": url})
    response.set_cookie(
        FLOW_COOKIE, request.app[SIGN_IN].seal_flow(flow),
        httponly=True, samesite="Lax", max_age=int(FLOW_TTL.total_seconds()), path=CALLBACK_PATH,
        secure=request.secure or request.app[SECURE_COOKIES],
    )  # fmt: skip
    return response


async def oidc_callback(request: web.Request) -> web.Response:
    """Finish the flow: check state, exchange the code, verify the ID token, find the user in
    PostgreSQL, open a session. Every refusal is shown and recorded in `login_attempts`."""
    provider, sign_in, client = request.app[OIDC], request.app[SIGN_IN], client_of(request)
    query = {k: v for k, v in request.query.items() if len(v) <= 4096}
    claims: dict[str, Any] = {}
    try:
        flow = open_flow(sign_in.public_key, request.cookies.get(FLOW_COOKIE))
        claims = await provider.finish(query, flow)
        token = await sign_in.login_oidc(provider.config, claims, client)
    except OidcRefused as err:
        if not claims:  # refused before any identity was verified (login_oidc records its own)
            await sign_in.refused_login(claims, provider.config, client, str(err))
        response = oidc_page(f"Sign-in refused: {err}", 403)
    except (aiohttp.ClientError, TimeoutError) as err:
        await sign_in.refused_login(claims, provider.config, client, f"provider unreachable: {err}")
        response = oidc_page(f"The identity provider cannot be reached: {err}", 502)
    else:
        # a page, not a redirect: the session cookie is SameSite=Strict, and a browser does not
        # send it on a redirect chain that began at the provider's (cross-site) page
        response = oidc_page("Signed in.", 200, signed_in=True)
        set_session_cookie(request, response, token)
    response.del_cookie(FLOW_COOKIE, path=CALLBACK_PATH)
    return response


def create_app(
    sign_in: SignIn,
    inbox: Inbox,
    requesters: Requesters,
    readers: ConversationEvents,
    oidc: OidcConfig | None = None,
    trusted_proxies: frozenset[str] = frozenset(),
    secure_cookies: bool = False,
    workflow_url: str = "",
) -> web.Application:
    app = web.Application(middlewares=[errors_and_auth, admission.per_caller], client_max_size=MAX_BODY)
    app.on_response_prepare.append(headers.secured)
    app[TRUSTED_PROXIES] = trusted_proxies
    app[SECURE_COOKIES] = secure_cookies
    app[WORKFLOW_URL] = workflow_url
    app[SIGN_IN] = sign_in
    if oidc is not None:
        app[OIDC] = OidcProvider(oidc)
        app.router.add_get("/auth/oidc/login", oidc_login)
        app.router.add_get(CALLBACK_PATH, oidc_callback)
    app.router.add_get("/", page)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_static("/static/", HERE / "static")
    app.router.add_post("/api/login", login)
    app.router.add_post("/api/logout", logout)
    app.router.add_get("/api/me", me)
    inbox_routes.add_routes(app, inbox)
    door.add_routes(app, requesters, readers)
    agui.add_routes(app)
    mcp_face.add_routes(app, requesters, inbox)
    agent_tools.add_routes(app, requesters.sessions)
    policies.add_routes(app, requesters.sessions)
    channels.add_routes(app)
    drafts.add_routes(app)
    notifications.add_routes(app)
    pages.add_routes(app)
    app.router.add_get("/chat", chat_page)
    chat.add_routes(app)
    openapi.add_routes(app)
    return app


@contextlib.asynccontextmanager
async def running_server(
    settings: Settings,
    host: str,
    port: int,
    client: Client | None = None,
    oidc: OidcConfig | None = None,
    trusted_proxies: frozenset[str] = frozenset(),
    rate: ApiRate | None = None,
) -> AsyncIterator[str]:
    """The server of `settings` (Temporal, or `client`; PostgreSQL; the proof signing key) served on
    host:port (0: a free port), with login through `oidc` when given, taking client addresses from
    X-Forwarded-For when the peer is one of `trusted_proxies`, limiting each person's and token's
    conversation requests to `rate` (default: the environment's); yields its base URL."""
    if not settings.database_url:
        raise RuntimeError("inbox: no DATABASE_URL: run `python starter.py dev up` or set DATABASE_URL")
    client = client or await connect(settings)
    engine = create_engine(settings.database_url)
    sessions, key = session_factory(engine), load_private_key(settings.proof_private_key)
    readers = ConversationEvents(sessions, settings.database_url)
    runner = web.AppRunner(
        create_app(
            SignIn(sessions, key),
            Inbox(client, sessions, key, settings.checkpoint_dir),
            Requesters(client, sessions, key, settings, readers, rate),
            readers,
            oidc,
            trusted_proxies,
            settings.cookie_secure,
            settings.workflow_url(""),
        ),
        shutdown_timeout=1.0,
    )
    await runner.setup()
    checkpoints = (
        asyncio.create_task(
            keep_checkpoints(sessions, key, settings.checkpoint_dir, settings.checkpoint_interval_s)
        )
        if settings.checkpoint_interval_s > 0
        else None
    )
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        yield f"http://{host}:{bound}"
    finally:
        if checkpoints is not None:
            checkpoints.cancel()
        await runner.cleanup()
        await engine.dispose()
