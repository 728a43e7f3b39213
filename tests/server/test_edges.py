"""Issue 53, items 9 and 10: the server's edge against the server, signed mode, PostgreSQL.

9. A state-changing request that rides on the page's session cookie from another origin (a page of
   the same site on another subdomain or port: SameSite=Strict lets its cookie through) is refused
   with 403 and changes nothing: ending a conversation, logging out, revoking a grant. The pages'
   own requests (same origin) and bearer clients go on.
10. Odd input answers 400 (the conversation API's 422), never 500: a NUL or a lone surrogate in a
   path parameter, a query parameter or a body's key, and a webhook secret or signature that is
   not ASCII (refused and recorded like any wrong secret)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import WebhookRefusal
from countersign.server.channels import TELEGRAM_SECRET_HEADER
from countersign.server.http import COOKIE
from tests.fixtures.chat import TOKEN, Receiver
from tests.fixtures.inbox import SignedStack
from tests.server.test_channels import SECRET, refusals, set_up
from tests.server.test_conversation_events import start
from tests.server.test_front_door import HELLO


async def raw(
    stack: SignedStack,
    method: str,
    path: str,
    *,
    token: str | None = None,
    cookie: str | None = None,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    cookies = {COOKIE: cookie} if cookie is not None else None
    async with (
        aiohttp.ClientSession(cookies=cookies) as http,
        http.request(method, stack.url + path, data=body, headers=sent) as response,
    ):
        return response.status, await response.text()


async def status_of(stack: SignedStack, token: str, workflow_id: str) -> dict[str, Any]:
    code, status = await stack.call("GET", f"/api/conversations/{workflow_id}", token)
    assert code == 200, status
    return dict(status)


OTHER_ORIGINS = [
    {"Origin": "http://evil.localhost:9999"},  # a page of another origin (any browser)
    {"Sec-Fetch-Site": "same-site", "Origin": "http://other.127.0.0.1.nip.io"},  # same site, other origin
    {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "null"},  # a sandboxed frame, a file
]


@pytest.mark.parametrize("headers", OTHER_ORIGINS)
async def test_a_cookie_request_from_another_origin_changes_nothing(
    signed_agent: SignedStack, headers: dict[str, str]
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    alice = await stack.login("alice")
    workflow_id = await start(stack, alice, "hello")

    for path in (f"/api/conversations/{workflow_id}/end", "/api/logout"):
        for form in ({}, {"Content-Type": "application/x-www-form-urlencoded"}):
            code, said = await raw(stack, "POST", path, cookie=alice, body=b"", headers={**headers, **form})
            assert code == 403 and "may not act with this page's session" in said, (path, code, said)
    assert (await status_of(stack, alice, workflow_id))["state"] != "ended"
    assert (await stack.call("GET", "/api/me", alice))[0] == 200  # still logged in

    # the page's own requests go on, and so does a bearer client whatever it says of itself
    same = {"Origin": stack.url, "Sec-Fetch-Site": "same-origin"}
    code, said = await raw(stack, "POST", f"/api/conversations/{workflow_id}/end", cookie=alice, headers=same)
    assert code == 202, said
    code, said = await raw(stack, "POST", "/api/logout", token=alice, cookie=alice, headers=headers)
    assert code == 200, said


async def test_odd_text_in_an_address_or_a_key_is_a_400(signed_agent: SignedStack) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    alice, carol = await stack.login("alice"), await stack.login("carol")
    code, started = await stack.call(
        "POST", "/api/conversations", alice, {"agent": "lead-qualifier", "message": "hello"}
    )
    workflow_id = started["workflow_id"]
    stack.agent.track(workflow_id)
    odd = [  # each answered 500 on main; the conversation API answers 422 for what is invalid, and
        # a body's odd key is refused like a key named twice, 400
        ("GET", "/api/conversations/%00", alice, None, 422),
        ("GET", "/api/conversations/a%00b/transcript", alice, None, 422),
        ("POST", f"/api/conversations/{workflow_id}/answers/%00", alice, b'{"text": "x"}', 422),
        (
            "POST",
            f"/api/conversations/{workflow_id}/answer",
            alice,
            b'{"call_id": "\\u0000", "text": "x"}',
            400,
        ),
        ("POST", f"/api/conversations/{workflow_id}/rollback", alice, b'{"sc\\u0000ope": "turn"}', 400),
        ("POST", "/api/approvals/%00/%00", carol, b'{"decision": "approve"}', 400),
        ("GET", "/api/agents/%00/tools", carol, None, 400),
        ("POST", "/channels/telegram/%00", None, b"{}", 400),
        ("GET", "/api/approvals?cursor=%00", carol, None, 400),
        ("GET", "/api/history?cursor=a%0Ab", carol, None, 400),
    ]
    for method, path, token, body, invalid in odd:
        code, said = await raw(stack, method, path, token=token, body=body)
        assert code == invalid, (method, path, code, said)
        assert "may not contain control characters" in said and "Traceback" not in said, said
    assert (await status_of(stack, alice, workflow_id))["state"] in ("idle", "running")


async def test_a_webhook_secret_that_is_not_ascii_is_a_recorded_401(
    signed_agent: SignedStack, chat_receiver: Receiver, db_engine: AsyncEngine, chat_cleanup: None
) -> None:
    stack = signed_agent
    channel = {"kind": "telegram", "name": "Sales group", "endpoint": chat_receiver.base_url,
               "bot_token": TOKEN, "chat_id": "-100200", "webhook_secret": SECRET}  # fmt: skip
    await set_up(stack, channel)
    before = await refusals(db_engine, "telegram")
    update = json.dumps({"update_id": 1, "message": {"message_id": 1, "from": {"id": 7}, "chat": {"id": 1}}})
    for secret in ("été", "\u00ff" * 40, SECRET + "é"):
        code, said = await raw(
            stack,
            "POST",
            "/channels/telegram/acme",
            body=update.encode(),
            headers={TELEGRAM_SECRET_HEADER: secret},
        )
        assert code == 401, said
    # recorded: counted in its window (chained once a window per source, issue 53 item 5)
    assert before + 1 <= await refusals(db_engine, "telegram") <= before + 2
    async with db_engine.connect() as conn:
        counted = await conn.scalar(
            select(func.sum(WebhookRefusal.count)).where(WebhookRefusal.tenant_id == "acme")
        )
    assert counted == 3
    assert chat_receiver.posts == []
