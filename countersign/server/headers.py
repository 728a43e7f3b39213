"""The headers every answer of the server carries, pages, static files, API and streams alike.

- `Content-Security-Policy`: the pages load their scripts, styles and icon from this server only
  (`static/`, no inline script or style, no `eval`), talk to it only (`fetch`, `EventSource`), may
  not be framed by any page (`frame-ancestors 'none'`: no clickjacking of an Approve button) and
  submit forms nowhere else. A script injected into a page despite the escaping would not run.
- `X-Frame-Options: DENY`: the same refusal of framing, for browsers older than CSP level 2.
- `X-Content-Type-Options: nosniff`: a JSON answer or a static file is never run as a script or
  style because its content looks like one.
- `Referrer-Policy: same-origin`: a link out of the inbox (the Temporal Web UI) does not carry the
  conversation's address.
"""

from __future__ import annotations

from aiohttp import web

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


async def secured(_request: web.Request, response: web.StreamResponse) -> None:
    """An `on_response_prepare` signal: errors, redirects and streams get the headers too."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
