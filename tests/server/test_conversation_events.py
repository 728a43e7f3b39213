"""`GET /api/conversations/{workflow_id}/events` on the server: a conversation as it happens, for
those who may read it, resumable with Last-Event-ID, bounded per person."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from countersign.client.sse import ServerEvent, server_events
from countersign.server.conversation_events import MAX_STREAMS_PER_PERSON
from tests.fixtures.inbox import SignedStack
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow

REVIEWED: list[dict[str, Any]] = [
    {
        "when": {"user_contains": "qualify"},
        "reply": {
            "content": "Let me mark Jane as qualified for you now.",
            "tool_calls": [
                {
                    "name": "update_lead_status",
                    "arguments": {
                        "lead": "jane.doe@example.com",
                        "new_status": "qualified",
                        "reason": "asked",
                    },
                }
            ],
        },
    },
    {"when": {"after_tool": "update_lead_status"}, "reply": {"content": "Jane Doe is now qualified."}},
]


@asynccontextmanager
async def events(
    stack: SignedStack, workflow_id: str, token: str, last_id: int | None = None
) -> AsyncIterator[aiohttp.ClientResponse]:
    headers = {"Authorization": f"Bearer {token}"}
    if last_id is not None:
        headers["Last-Event-ID"] = str(last_id)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{stack.url}/api/conversations/{workflow_id}/events", headers=headers) as response,
    ):
        yield response


async def start(stack: SignedStack, token: str, message: str) -> str:
    """A conversation of the token's person, started through the conversation API."""
    status, body = await stack.call(
        "POST", "/api/conversations", token, {"agent": "lead-qualifier", "message": message}
    )
    assert status == 201, body
    stack.agent.track(body["workflow_id"])
    return str(body["workflow_id"])


async def read_until(response: aiohttp.ClientResponse, kind: str) -> list[ServerEvent]:
    seen = []
    async for event in server_events(response):
        seen.append(event)
        if event.kind == kind:
            return seen
    raise AssertionError(f"the stream closed before {kind}: {seen}")


async def decided_by_bob(
    stack: SignedStack, decision: dict[str, str], until: str
) -> tuple[str, list[ServerEvent], list[ServerEvent]]:
    """Alice asks for the reviewed call and follows her conversation's events; once the call waits,
    bob decides it (`decision`, the inbox's body). The workflow id, the events until the call
    waits, and those after until `until`."""
    stack.agent.script(*REVIEWED)
    alice, bob = await stack.login("alice"), await stack.login("bob")
    workflow_id = await start(stack, alice, "please qualify jane")
    async with events(stack, workflow_id, alice) as response:
        assert response.status == 200 and response.headers["Content-Type"] == "text/event-stream"
        waiting = await asyncio.wait_for(read_until(response, "approval"), 30)
        status, _ = await stack.call("POST", f"/api/approvals/{workflow_id}/c1", bob, decision)
        assert status == 200
        return workflow_id, waiting, await asyncio.wait_for(read_until(response, until), 30)


async def test_alice_follows_her_conversation_through_an_approval(signed_agent: SignedStack) -> None:
    stack = signed_agent
    approve = {"decision": "approve", "reason": "her budget is confirmed"}
    workflow_id, waiting, rest = await decided_by_bob(stack, approve, "turn")
    assert [e.kind for e in waiting].count("delta") >= 1
    assert next(e.data for e in waiting if e.kind == "tool_call")["tool"] == "update_lead_status"
    pending = waiting[-1].data
    assert pending["state"] == "pending" and "bob" in pending["may_decide"] and pending["expires_at"]
    decided = next(e.data for e in rest if e.kind == "approval")
    assert (decided["state"], decided["decided_by"]) == ("approved", "bob")
    # the requester is told who decided and why (issue 41)
    assert decided["reason"] == "her budget is confirmed"
    assert decided["note"] == "bob approved it (reason: her budget is confirmed)"
    assert decided["edited"] is False
    (result,) = [e.data for e in rest if e.kind == "tool_result"]
    assert result["ok"] is True
    # and what the call returned: its line, and the result as the model read it
    assert result["summary"].startswith("ok: Jane Doe (jane.doe@example.com"), result["summary"]
    assert json.loads(result["result"])["data"]["new_status"] == "qualified"
    assert rest[-1].data["reply"] == "[scripted model] Jane Doe is now qualified."
    every = waiting + rest
    ids = [e.id for e in every]
    assert None not in ids and ids == sorted(i or 0 for i in ids)
    # resumed after the approval request: exactly what followed it, nothing twice
    async with events(stack, workflow_id, await stack.login("alice"), last_id=waiting[-1].id) as response:
        again = await asyncio.wait_for(read_until(response, "turn"), 30)
    assert [e.id for e in again] == [e.id for e in rest]


async def test_a_rejection_tells_the_requester_why(signed_agent: SignedStack) -> None:
    reject = {"decision": "reject", "reason": "she has not answered yet"}
    _, _, rest = await decided_by_bob(signed_agent, reject, "tool_result")
    decided = next(e.data for e in rest if e.kind == "approval")
    assert decided["note"] == "bob rejected it (reason: she has not answered yet)"
    assert rest[-1].data["ok"] is False
    assert rest[-1].data["summary"] == (
        "error REJECTED: bob rejected update_lead_status: she has not answered yet"
    )


async def test_only_those_who_may_read_it_see_a_conversation(signed_agent: SignedStack) -> None:
    stack = signed_agent
    stack.agent.script({"reply": {"content": "hello"}})
    workflow_id = await start(stack, await stack.login("alice"), "hi")
    await execute_update(stack.agent.client.get_workflow_handle(workflow_id), AgentWorkflow.wait_turn, 1)
    for user, tenant in (("bob", "acme"), ("dave", "globex")):
        token = await stack.login(user, tenant)
        async with events(stack, workflow_id, token) as response:
            assert response.status == 404, user
    async with events(stack, workflow_id, await stack.login("carol")) as response:  # an admin of acme
        assert response.status == 200
        assert (await asyncio.wait_for(read_until(response, "turn"), 10))[-1].data["turn"] == 1
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{stack.url}/api/conversations/{workflow_id}/events") as r,
    ):
        assert r.status == 401


async def test_open_streams_are_bounded_per_person(signed_agent: SignedStack) -> None:
    stack = signed_agent
    stack.agent.script({"reply": {"content": "hello"}})
    alice = await stack.login("alice")
    workflow_id = await start(stack, alice, "hi")
    url, headers = f"{stack.url}/api/conversations/{workflow_id}/events", {"Authorization": f"Bearer {alice}"}
    async with aiohttp.ClientSession() as http:
        opened = [await http.get(url, headers=headers) for _ in range(MAX_STREAMS_PER_PERSON)]
        assert [r.status for r in opened] == [200] * MAX_STREAMS_PER_PERSON
        async with http.get(url, headers=headers) as refused:
            assert refused.status == 429 and refused.headers["Retry-After"]
        opened.pop().close()
        await asyncio.sleep(1.5)  # the server notices a reader gone within a second
        async with http.get(url, headers=headers) as accepted:
            assert accepted.status == 200
        for response in opened:
            response.close()
