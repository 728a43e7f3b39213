"""What issue 34 found on the server's newer surfaces, each fixed at its class (docs/security.md):
a token acts only for active users (every request, every stream, mid-stream too); a status says
what Temporal knows of the run; an event id past 64 bits is a 400; every API route and stream
opening takes from the caller's buckets; a reply's wait is woken by the conversation's events
(no polling) and the update it sends is validated; every answer carries the pages' security
headers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aiohttp
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.client.sse import server_events
from countersign.db.access import set_active
from countersign.db.engine import session_factory
from tests.fixtures.inbox import SignedStack
from tests.test_front_door import HELLO, token_for


@contextlib.asynccontextmanager
async def deactivated(engine: AsyncEngine, tenant: str, user: str) -> AsyncIterator[None]:
    async with session_factory(engine).begin() as session:
        await set_active(session, tenant, user, False, datetime.now(UTC))
    try:
        yield
    finally:
        async with session_factory(engine).begin() as session:
            await set_active(session, tenant, user, True, datetime.now(UTC))


async def get(url: str, token: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, headers={"Authorization": f"Bearer {token}", **(headers or {})}) as response,
    ):
        if response.content_type == "text/event-stream":
            return response.status, ""
        return response.status, await response.text()


# --- 1. a token acts only for active users ----------------------------------------------------------


async def test_a_token_stops_acting_for_a_deactivated_user_at_once_and_mid_stream(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    async with token_for(db_engine, "globex", "bridge-34", "dave") as token:
        code, body = await stack.call(
            "POST",
            "/api/conversations",
            token,
            {"agent": "lead-qualifier", "message": "hello", "user_id": "dave"},
        )
        assert code == 201, body
        wf = body["workflow_id"]
        stack.agent.track(wf)
        code, reply = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=1", token)
        assert (code, reply["state"]) == (200, "replied"), reply
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{stack.url}/api/conversations/{wf}/events", headers=headers) as stream,
        ):
            assert stream.status == 200
            async with deactivated(db_engine, "globex", "dave"):
                for path in ("", "/transcript", "/audit", "/reply?turn=1&wait=0", "/events"):
                    code, _ = await stack.call("GET", f"/api/conversations/{wf}{path}", token)
                    assert code == 404, path
                code, _ = await stack.call("POST", f"/api/conversations/{wf}/messages", token, {"text": "hi"})
                assert code == 404
                start = {"agent": "lead-qualifier", "message": "hello", "user_id": "dave"}
                code, refused = await stack.call("POST", "/api/conversations", token, start)
                assert code == 403, refused
                code, listed = await stack.call("GET", "/api/conversations", token)
                assert (code, listed) == (200, [])
                # the open stream closes at its next wake-up (an event, or the keep-alive)
                async with db_engine.begin() as conn:
                    await conn.execute(text("SELECT pg_notify('conversation_events', :wf)"), {"wf": wf})
                async with asyncio.timeout(10):
                    kinds = [e.kind async for e in server_events(stream)]
                assert "ended" not in kinds  # closed for the reader, not because the conversation ended
            # active again: the token acts for dave again
            code, _ = await stack.call("GET", f"/api/conversations/{wf}", token)
            assert code == 200
