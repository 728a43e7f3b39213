"""What both sides of the server share over HTTP: the one refusal type a handler raises
(`HttpRefusal`, answered as `{"error": …}` by the app's middleware), the JSON error response, the
strict reading of a request body, who is signed in (the session the middleware found, from the
bearer token or the page's cookie), and the headers of an events stream."""

from __future__ import annotations

from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from countersign.core.bounds import DuplicateKey, loads_strict
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


def refuse_keys_twice(raw: bytes) -> None:
    """HttpRefusal 400 when the body's JSON names a key twice in one object: refused, never resolved
    one way here and another elsewhere. Anything else wrong with it is for the body's model to say."""
    try:
        loads_strict(raw)
    except DuplicateKey as err:
        raise HttpRefusal(400, f"invalid request: {err}") from None
    except (ValueError, RecursionError):
        pass  # not JSON (or nested past the parser): the model's validation says why


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
