"""What issue 34 found on the server's newer surfaces, each fixed at its class (docs/explanation/security.md):
a token acts only for active users (every request, every stream, mid-stream too); a status says
what Temporal knows of the run; an event id past 64 bits is a 400; every API route and stream
opening takes from the caller's buckets; a reply's wait is woken by the conversation's events
(no polling) and the update it sends is validated; every answer carries the pages' security
headers; a refusal still being recorded when a run continues as new is recorded by the next."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from sqlalchemy import delete, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus

from activities import authority as authority_activities
from countersign.client.ended import as_temporal_knows
from countersign.client.sse import server_events
from countersign.core.contract import StartConversation, StatusView
from countersign.db.access import set_active
from countersign.db.attempts import record_once
from countersign.db.engine import session_factory
from countersign.db.schema import Conversation, RateLimitBucket
from countersign.server.app import running_server
from countersign.server.conversation_events import MAX_EVENT_ID
from countersign.server.headers import SECURITY_HEADERS
from countersign.server.requesters import ApiRate, Requesters
from tests.e2e.test_hostile_input import ask, eventually, records
from tests.fixtures.agent import AgentHarness
from tests.fixtures.inbox import SignedStack
from tests.server.test_conversation_events import start
from tests.server.test_front_door import HELLO, HI, token_for
from tests.workflows.test_floods import flood_until_continued
from tests.workflows.test_floods import small_history_budget as small_history_budget
from workflows.agent import AgentWorkflow


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


# --- 2. a status says what Temporal knows ----------------------------------------------------------


@pytest.mark.parametrize(
    ("run", "state", "error"),
    [
        (WorkflowExecutionStatus.RUNNING, "running", None),
        (WorkflowExecutionStatus.CONTINUED_AS_NEW, "running", None),
        (WorkflowExecutionStatus.COMPLETED, "ended", None),
        (WorkflowExecutionStatus.FAILED, "ended", "the run failed"),
        (WorkflowExecutionStatus.TERMINATED, "ended", "the run terminated"),
        (WorkflowExecutionStatus.TIMED_OUT, "ended", "the run timed out"),
        (WorkflowExecutionStatus.CANCELED, "ended", "the run canceled"),
    ],
)
def test_a_closed_run_is_ended_whatever_its_query_says(
    run: WorkflowExecutionStatus, state: str, error: str | None
) -> None:
    queried = StatusView(state="running", turn=1)
    seen = as_temporal_knows(queried, run)
    assert (seen.state, seen.last_error) == (state, error)
    said = StatusView(state="running", turn=1, last_error="model unreachable")
    assert as_temporal_knows(said, run).last_error == "model unreachable"


async def test_a_failed_run_reads_ended_through_the_server(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """A run the worker failed (here: started without the server's proof) still answers the
    `status` query with the state it stopped in; the server says it ended, and how."""
    stack, agent = signed_agent, signed_agent.agent
    wf = f"conv-acme-test34-{uuid.uuid4().hex[:8]}"
    async with session_factory(db_engine).begin() as session:
        session.add(
            Conversation(
                workflow_id=wf,
                tenant_id="acme",
                user_id="alice",
                agent="lead-qualifier",
                started_via="session",
                auth_mode="signed",
            )
        )
    try:
        raw = StartConversation(tenant_id="acme", user_id="alice", agent="lead-qualifier")
        handle = await agent.client.start_workflow(
            AgentWorkflow.run, raw, id=wf, task_queue=agent.settings.task_queue
        )
        agent.track(wf)
        for _ in range(100):
            if (await handle.describe()).status == WorkflowExecutionStatus.FAILED:
                break
            await asyncio.sleep(0.1)
        assert (await handle.query(AgentWorkflow.status)).state != "ended"  # what the query alone says
        alice = await stack.login("alice")
        code, status = await stack.call("GET", f"/api/conversations/{wf}", alice)
        assert (code, status["state"], status["last_error"]) == (200, "ended", "the run failed"), status
        code, reply = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=1&wait=5", alice)
        assert (code, reply["state"]) == (200, "ended"), reply
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(Conversation).where(Conversation.workflow_id == wf))


# --- 3. event ids are bounded at the edge -----------------------------------------------------------


async def test_an_event_id_past_64_bits_or_not_a_number_is_a_400(signed_agent: SignedStack) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    alice = await stack.login("alice")
    code, body = await stack.call("POST", "/api/conversations", alice, {"agent": "lead-qualifier"})
    assert code == 201, body
    wf = body["workflow_id"]
    stack.agent.track(wf)
    url = f"{stack.url}/api/conversations/{wf}/events"
    for bad in (str(MAX_EVENT_ID + 1), "99999999999999999999999", "-1", "1e3", "\uff11\uff12"):
        code, said = await get(url, alice, {"Last-Event-ID": bad})
        assert code == 400 and "event ids" in said, (bad, said)
        code, said = await get(f"{url}?after={bad}", alice)
        assert code == 400, (bad, said)
    assert (await get(url, alice, {"Last-Event-ID": str(MAX_EVENT_ID)}))[0] == 200
    assert (await get(f"{url}?after=0", alice))[0] == 200


# --- 4. every API route and stream opening takes from the caller's buckets ----------------------------


@contextlib.asynccontextmanager
async def full_api_buckets(engine: AsyncEngine, tenant: str) -> AsyncIterator[None]:
    """The tenant's API buckets start full and are left full: the tiny rate below (and other tests'
    floods) would otherwise carry an empty bucket from one test into the next."""

    async def refill() -> None:
        async with engine.begin() as conn:
            await conn.execute(
                delete(RateLimitBucket).where(
                    RateLimitBucket.tenant_id == tenant, RateLimitBucket.tool.startswith("api:")
                )
            )

    await refill()
    try:
        yield
    finally:
        await refill()


async def test_every_api_route_and_stream_opening_takes_from_the_callers_bucket(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    settings = stack.agent.settings.model_copy(update={"proof_private_key": stack.keys.private})
    async with (
        full_api_buckets(db_engine, "globex"),
        token_for(db_engine, "globex", "flood-34", "dave") as token,
        running_server(
            settings, "127.0.0.1", 0, client=stack.agent.client, rate=ApiRate(per_s=0.01, burst=3)
        ) as url,
    ):
        async with aiohttp.ClientSession() as http:
            async with http.post(
                url + "/api/login", json={"tenant_id": "globex", "user_id": "erin", "password": "erin-dev"}
            ) as response:
                erin = (await response.json())["token"]
        # the person's bucket: drafts, the inbox's routes, the approvals stream's opening
        for path in ("/api/drafts", "/api/me", "/api/approvals"):
            code, said = await get(url + path, erin)
            assert code == 200, (path, said)
        for path in ("/api/drafts", "/api/history", "/api/events", "/api/agents/lead-qualifier/tools"):
            code, said = await get(url + path, erin)
            assert code == 429 and "too many requests" in said, (path, said)
        # a token's: the list of its users' conversations, and a conversation's events stream
        async with aiohttp.ClientSession() as http:
            async with http.post(
                url + "/api/conversations",
                json={"agent": "lead-qualifier", "user_id": "dave"},
                headers={"Authorization": f"Bearer {token}"},
            ) as response:
                assert response.status == 201
                wf = (await response.json())["workflow_id"]
        stack.agent.track(wf)
        assert (await get(f"{url}/api/conversations/{wf}/events", token))[0] == 200
        assert (await get(url + "/api/conversations", token))[0] == 200
        assert (await get(f"{url}/api/conversations/{wf}/events", token))[0] == 429
        assert (await get(url + "/api/conversations", token))[0] == 429


# --- 5. a reply's wait: woken by events, its update validated ------------------------------------------


async def test_a_reply_waits_on_the_conversations_events_and_a_wait_for_no_turn_is_refused(
    signed_agent: SignedStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    alice = await stack.login("alice")
    wf = await start(stack, alice, "hello")
    code, reply = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=1&wait=10", alice)
    assert (code, reply["state"], reply["turn"]["reply"]) == (200, "replied", HI), reply

    asked: list[str] = []
    status = Requesters.status

    async def counted(self: Requesters, row: Conversation) -> StatusView:
        asked.append(row.workflow_id)
        return await status(self, row)

    monkeypatch.setattr(Requesters, "status", counted)
    # the next turn may be waited for: nothing happens in 3 s, and the status is asked at the
    # first look and when the wait runs out (polling asked it 4 times a second)
    code, reply = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=2&wait=3", alice)
    assert (code, reply["state"]) == (200, "running"), reply
    assert len(asked) == 2, asked
    # a turn nobody asked for is refused before the workflow accepts the wait
    code, refused = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=3&wait=2", alice)
    assert code == 409 and "turn 3 has not been asked for" in refused["error"], refused
    # the next message's turn wakes the wait (the `turn` event), and it answers with the reply
    waiting = asyncio.create_task(stack.call("GET", f"/api/conversations/{wf}/reply?turn=2&wait=20", alice))
    await asyncio.sleep(0.5)
    code, _ = await stack.call("POST", f"/api/conversations/{wf}/messages", alice, {"text": "hello"})
    assert code == 202
    code, reply = await waiting
    assert (code, reply["state"], reply["turn"]["turn"]) == (200, "replied", 2), reply


# --- 6. security headers -------------------------------------------------------------------------


async def test_every_answer_carries_the_security_headers(signed_agent: SignedStack) -> None:
    stack = signed_agent
    alice = await stack.login("alice")
    async with aiohttp.ClientSession() as http:
        for path in (
            "/",
            "/chat",
            "/static/inbox.js",
            "/static/chat.css",
            "/api/me",
            "/api/nothing",
            "/nothing",
        ):
            async with http.get(stack.url + path, headers={"Authorization": f"Bearer {alice}"}) as response:
                seen: dict[str, Any] = {name: response.headers.get(name) for name in SECURITY_HEADERS}
                assert seen == SECURITY_HEADERS, (path, seen)
    assert "frame-ancestors 'none'" in SECURITY_HEADERS["Content-Security-Policy"]
    assert "'unsafe-inline'" not in SECURITY_HEADERS["Content-Security-Policy"]


# --- 7. refusals still being recorded are carried into the next run ------------------------------------


async def test_a_refusal_still_being_recorded_when_the_run_continues_is_recorded_by_the_next(
    agent: AgentHarness,
    db_engine: AsyncEngine,
    small_history_budget: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refusal whose audit row the first run cannot write (the database refuses it there, so its
    local activity retries) is still in flight when a flood makes the run continue as new past its
    grace for handlers: the sealed state carries it, and the next run records it."""
    agent.script({"reply": {"content": "ok"}})
    handle = await agent.start("hello")
    assert await ask(agent, handle.id) == "[scripted model] ok"
    first_run = (await handle.describe()).run_id

    async def failing_in_the_first_run(
        session: AsyncSession, model: Any, column: Any, key: str, attempt: Any
    ) -> Any:
        if (await attempt())["actor"] == "mallory.slow" and activity.info().workflow_run_id == first_run:
            raise RuntimeError("this refusal cannot be recorded in the first run")
        return await record_once(session, model, column, key, attempt)

    monkeypatch.setattr(authority_activities, "record_once", failing_in_the_first_run)
    audited = await records(db_engine, handle.id)
    await handle.signal("submit_message", {"user_id": "mallory.slow", "text": "let me in"})
    sent = await flood_until_continued(agent, handle, [])

    async def slow_rows() -> int:
        query = text("SELECT count(*) FROM input_audit WHERE workflow_id = :w AND actor = 'mallory.slow'")
        async with db_engine.connect() as conn:
            return int((await conn.execute(query, {"w": handle.id})).scalar_one())

    for _ in range(100):
        if await slow_rows():
            break
        await asyncio.sleep(0.1)
    assert await slow_rows() == 1
    assert await eventually(db_engine, handle.id, audited + sent + 1) >= audited + sent + 1
    assert await ask(agent, handle.id) == "[scripted model] ok"
