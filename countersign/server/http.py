"""What both sides of the server share over HTTP: the one refusal type a handler raises
(`HttpRefusal`, answered as `{"error": …}` by the app's middleware), the JSON error response, the
strict reading of a request body, who is signed in (the session the middleware found, from the
bearer token or the page's cookie), and the headers of an events stream."""

from __future__ import annotations

from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from countersign.core.bounds import DuplicateKey, has_control, loads_strict
from countersign.server.auth import Reviewer, SessionClaims

M = TypeVar("M", bound=BaseModel)

COOKIE = "countersign_session"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
REVIEWER = web.RequestKey("reviewer", Reviewer)
SESSION = web.RequestKey("session", SessionClaims)


class HttpRefusal(Exception):
    """A refusal for the client: HTTP status and a one-line reason (429: with Retry-After)."""

    def __init__(self, status: int, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


def error(status: int, message: str, retry_after_s: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return web.json_response({"error": message}, status=status, headers=headers)


ODD_TEXT = "may not contain control characters (NUL, newlines, ...) or lone surrogates"


def refuse_odd_text(request: web.Request) -> None:
    """The edge rule for text from a request's address: HttpRefusal 400 when a path parameter (a
    conversation id, a call id, an agent, a tenant, a sender) or a query parameter holds a control
    character or a lone surrogate. Such text is no name of anything here, and PostgreSQL cannot
    store a NUL: refused before any handler reads it, on every route, with the route's status for
    an invalid request (the conversation API's 422, shared/CONTRACT.md; 400 elsewhere)."""
    status = 422 if request.path.startswith("/api/conversations") else 400
    for name, value in request.match_info.items():
        if has_control(value):
            raise HttpRefusal(status, f"invalid request: {name} {ODD_TEXT}")
    for name, value in request.query.items():
        if has_control(name) or has_control(value):
            raise HttpRefusal(status, f"invalid request: query parameter {name!r} {ODD_TEXT}")


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def refuse_cross_origin(request: web.Request) -> None:
    """HttpRefusal 403 for a state-changing request that rides on the page's session cookie but
    comes from another origin. SameSite=Strict keeps other *sites* from sending the cookie; a page of
    the same site on another origin (another subdomain, another port) still could, and a route
    without a body (`…/end`, `/api/logout`, a grant's revoke) would take its form. A browser names
    where a request comes from (`Sec-Fetch-Site`, `Origin`); a request that says it is same-origin,
    or names none (not a browser), goes on. A bearer token is no ambient credential: a page of
    another origin cannot send the header without the server's consent (CORS, which this server
    never gives)."""
    if request.method in SAFE_METHODS or COOKIE not in request.cookies or "Authorization" in request.headers:
        return
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        raise HttpRefusal(403, f"refused: a {site} request may not act with this page's session")
    origin = request.headers.get("Origin")
    if origin is not None and origin.split("://", 1)[-1] != request.host:
        raise HttpRefusal(403, "refused: a request from another origin may not act with this page's session")


def _odd_keys(value: Any) -> bool:
    """Whether an object in the decoded JSON `value` has a key that holds a control character or a
    lone surrogate. Iterative (the parser bounds the depth it reaches)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if any(has_control(key) for key in node):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def refuse_keys_twice(raw: bytes) -> None:
    """HttpRefusal 400 when the body's JSON names a key twice in one object (refused, never resolved
    one way here and another elsewhere), or names a key no model has with a NUL or a lone surrogate
    (which the refusal would echo). Anything else wrong with it is for the body's model to say."""
    try:
        value = loads_strict(raw)
    except DuplicateKey as err:
        raise HttpRefusal(400, f"invalid request: {err}") from None
    except (ValueError, RecursionError):
        return  # not JSON (or nested past the parser): the model's validation says why
    if _odd_keys(value):
        raise HttpRefusal(400, f"invalid request: a key of the body {ODD_TEXT}")


async def parse(request: web.Request, model: type[M], invalid: int = 422) -> M:
    """The body as `model`: 415 unless JSON (a cross-site form cannot send it), 400 for a key named
    twice, `invalid` (the conversation API's 422; the inbox's older routes answer 400) when invalid."""
    if request.content_type != "application/json":
        raise HttpRefusal(415, "send JSON (Content-Type: application/json)")
    raw = await request.read() or b"{}"
    refuse_keys_twice(raw)
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        raise invalid_request(err, invalid) from None


def invalid_request(err: ValidationError, status: int = 422) -> HttpRefusal:
    """The first thing wrong with a request, where it is."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    return HttpRefusal(status, f"invalid request: {where}: {first['msg']}")


def bearer_of(request: web.Request) -> str | None:
    """The bearer token (an API token or a session token), else the page's session cookie."""
    header = request.headers.get("Authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(COOKIE)
    return token if token and len(token) <= 4096 else None
