"""Countersign as an MCP server, issue 53's details (items 8 and 11), with the real `mcp` client
against the real server, a signed-mode worker, Temporal and PostgreSQL: the approval link comes
from the configured public address, never the request's Host header; asking again with the same
arguments in another key order is the same call; a person holds at most as many open MCP event
streams as conversation streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.server import mcp_face
from countersign.server.conversation_events import MAX_STREAMS_PER_PERSON
from tests.fixtures.approvals import lead_status
from tests.fixtures.inbox import SignedStack
from tests.server.test_front_door import token_for
from tests.server.test_mcp_face import QUALIFY, unopened, waiting_card


@pytest.fixture
async def alice_token(signed_agent: SignedStack, db_engine: AsyncEngine) -> AsyncIterator[str]:
    async with token_for(db_engine, "acme", "mcp-alice", "alice") as secret:
        yield secret


def spoofed_client(stack: SignedStack, token: str) -> Client:
    """The real client, its requests naming another host than the server's (declaring URL
    elicitation: the tests drive the rounds of `input_required` themselves)."""
    headers = {"Authorization": f"Bearer {token}", "Host": "attacker.example"}
    http = create_mcp_http_client(headers=headers)
    url = f"{stack.url}/mcp/lead-qualifier"
    return Client(streamable_http_client(url, http_client=http), elicitation_callback=unopened)


async def test_the_approval_link_is_the_configured_address_whatever_host_the_request_names(
    signed_agent: SignedStack, alice_token: str, jane_is_new: None
) -> None:
    public = signed_agent.agent.settings.inbox_url.rstrip("/")
    async with spoofed_client(signed_agent, alice_token) as mcp:
        first = await mcp.session.call_tool("update_lead_status", QUALIFY, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first
    (elicitation,) = (first.input_requests or {}).values()
    url = elicitation.params.url  # type: ignore[union-attr]
    assert "attacker.example" not in url and url.startswith(f"{public}/#conv-acme-key-mcp:"), url


async def test_asking_again_with_the_arguments_in_another_key_order_is_the_same_call(
    signed_agent: SignedStack,
    alice_token: str,
    db_engine: AsyncEngine,
    jane_is_new: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request state is spent on asking again; a reordered copy of the arguments must still be
    the call that waits (held, then a fresh state), and its result comes once bob approves."""
    monkeypatch.setattr(mcp_face, "HOLD_S", 1.0)
    stack = signed_agent
    bob = await stack.login("bob")
    reordered = dict(reversed(list(QUALIFY.items())))
    assert list(reordered) != list(QUALIFY)
    async with spoofed_client(stack, alice_token) as mcp:
        first = await mcp.session.call_tool("update_lead_status", QUALIFY, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.request_state, first
        (elicitation,) = (first.input_requests or {}).values()
        call_id = elicitation.params.url.rsplit("/", 1)[1]  # type: ignore[union-attr]
        again = await mcp.session.call_tool(
            "update_lead_status", reordered, request_state=first.request_state, allow_input_required=True
        )
        assert isinstance(again, types.InputRequiredResult) and again.request_state, again
        card = await waiting_card(stack, bob, call_id)
        code, body = await stack.call(
            "POST", f"/api/approvals/{card['workflow_id']}/{call_id}", bob, {"decision": "approve"}
        )
        assert code == 200, body
        result = await mcp.session.call_tool(
            "update_lead_status", reordered, request_state=again.request_state, allow_input_required=True
        )
    assert isinstance(result, types.CallToolResult) and not result.is_error, result
    assert (result.meta or {})["countersign"]["call_id"] == call_id
    assert await lead_status(db_engine, "acme") == "qualified"


async def test_a_person_holds_at_most_as_many_mcp_event_streams_as_conversation_streams(
    signed_agent: SignedStack, alice_token: str
) -> None:
    """Open MCP GET streams count against the person's bound: beyond it, 429 with Retry-After; one
    closed frees its place."""
    headers = {"Authorization": f"Bearer {alice_token}", "Accept": "text/event-stream"}
    url = f"{signed_agent.url}/mcp/lead-qualifier"
    async with contextlib.AsyncExitStack() as held, aiohttp.ClientSession() as http:
        opened: list[Any] = []
        for _ in range(MAX_STREAMS_PER_PERSON):
            response = await held.enter_async_context(http.get(url, headers=headers))
            assert response.status < 400, (response.status, await response.text())
            opened.append(response)
        async with http.get(url, headers=headers) as over:
            assert over.status == 429, (over.status, await over.text())
            assert over.headers.get("Retry-After")
        opened[0].close()
        await asyncio.sleep(1.5)  # the server notices within a second that its reader went away
        async with http.get(url, headers=headers) as freed:
            assert freed.status < 400, (freed.status, await freed.text())
