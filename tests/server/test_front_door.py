"""The front door on the real parts (time-skipping Temporal, PostgreSQL, the scripted model, the
server over HTTP, a signed-mode worker): the conversation API for a logged-in person and for an API
token; whose conversation it is comes from PostgreSQL; floods are refused before Temporal."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError, CancelledError

from countersign.client.handles import wait_reply
from countersign.core.contract import ConversationResult, StartConversation, SubmitMessage
from countersign.db.engine import session_factory
from countersign.db.schema import (
    ApiToken,
    Compensation,
    Conversation,
    InputAudit,
    ProofCheck,
    RequesterAction,
)
from countersign.identity import tokens
from countersign.server.app import running_server
from countersign.server.requesters import ApiRate
from tests.fixtures.approvals import ECHO_RESULT, lead_status, pending, qualify
from tests.fixtures.inbox import SignedStack
from tests.workflows.test_replay import replayer
from workflows.agent import AgentWorkflow

ASK = {
    "when": {"user_contains": "ask"},
    "reply": {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which lead?"}}]},
}
THANKS = {"when": {"after_tool": "ask_human"}, "reply": {"content": "thanks"}}
HELLO = {"when": {"user_contains": "hello"}, "reply": {"content": "hi there"}}
HI = "[scripted model] hi there"


async def until(check: Any, what: str) -> Any:
    for _ in range(200):
        if value := await check():
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"never: {what}")


@contextlib.asynccontextmanager
async def token_for(engine: AsyncEngine, tenant: str, name: str, *act_as: str) -> AsyncIterator[str]:
    async with session_factory(engine).begin() as session:
        secret = await tokens.create(session, tenant, name, list(act_as))
    try:
        yield secret
    finally:
        async with engine.begin() as conn:
            await conn.execute(delete(ApiToken).where(ApiToken.name == name))


async def test_the_reply_of_a_conversation_that_ended_before_it_was_asked_comes_from_the_store(
    signed_agent: SignedStack,
) -> None:
    """A single-turn conversation can end before the CLI asks for its reply (the walk-through's
    `start --single-turn --wait` in signed mode): the reply is the stored one, not "ended"."""
    stack, agent = signed_agent, signed_agent.agent
    agent.script(HELLO)
    alice = await stack.login("alice")
    code, body = await stack.call(
        "POST",
        "/api/conversations",
        alice,
        {"agent": "lead-qualifier", "message": "hello", "single_turn": True},
    )
    assert code == 201, body
    wf = body["workflow_id"]
    agent.track(wf)
    handle = agent.client.get_workflow_handle(wf, result_type=ConversationResult)
    assert (await handle.result()).ended_by == "single_turn"
    code, reply = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=1&wait=5", alice)
    assert (code, reply["state"]) == (200, "replied"), reply
    assert (reply["turn"]["reply"], reply["turn"]["turn"]) == (HI, 1), reply
    code, reply = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=2&wait=5", alice)
    assert (code, reply["state"]) == (200, "ended"), reply
    for bad in ("turn=99999999999999999999", "turn=-1", "wait=nan", "wait=inf", "message_id=a%00b"):
        code, refused = await stack.call("GET", f"/api/conversations/{wf}/reply?{bad}", alice)
        assert code == 422 and "invalid request" in refused["error"], (bad, refused)


async def test_a_person_starts_answers_sends_reads_and_ends_through_the_server(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack, agent = signed_agent, signed_agent.agent
    agent.script(ASK, THANKS, HELLO)
    alice = await stack.login("alice")
    code, body = await stack.call(
        "POST", "/api/conversations", alice, {"agent": "lead-qualifier", "message": "ask me"}
    )
    assert code == 201, body
    wf = body["workflow_id"]
    handle = agent.client.get_workflow_handle(wf, result_type=ConversationResult)
    agent.track(wf)

    async def asked() -> Any:
        code, status = await stack.call("GET", f"/api/conversations/{wf}", alice)
        assert code == 200, status
        return status if status["pending_questions"] else None

    status = await until(asked, "the question waits")
    assert (status["state"], status["user_id"], status["tenant_id"]) == ("awaiting_answer", "alice", "acme")
    code, body = await stack.call("POST", f"/api/conversations/{wf}/answers/c1", alice, {"text": "Jane"})
    assert code == 202, body

    async def idle() -> Any:
        return (await handle.query(AgentWorkflow.status)).state == "idle"

    await until(idle, "the turn ends")
    code, body = await stack.call("POST", f"/api/conversations/{wf}/messages", alice, {"text": "hello"})
    assert code == 202 and body["message_id"], body
    code, reply = await stack.call(
        "GET", f"/api/conversations/{wf}/reply?message_id={body['message_id']}", alice
    )
    assert (code, reply["state"], reply["turn"]["reply"]) == (200, "replied", HI), reply
    code, messages = await stack.call("GET", f"/api/conversations/{wf}/transcript", alice)
    assert code == 200
    assert [m["content"] for m in messages if m["role"] == "user"] == ["ask me", "hello"]
    code, body = await stack.call("POST", f"/api/conversations/{wf}/end", alice)
    assert code == 202, body
    assert (await handle.result()).ended_by == "end by alice"
    code, body = await stack.call("POST", f"/api/conversations/{wf}/messages", alice, {"text": "hello"})
    assert code == 409, body

    async with db_engine.connect() as conn:
        row = (await conn.execute(select(Conversation).where(Conversation.workflow_id == wf))).one()
        actions = list(
            await conn.execute(
                select(
                    RequesterAction.action,
                    RequesterAction.status,
                    RequesterAction.user_id,
                    RequesterAction.via,
                )
                .where(RequesterAction.workflow_id == wf)
                .order_by(RequesterAction.id)
            )
        )
    assert (row.tenant_id, row.user_id, row.agent, row.started_via) == (
        "acme",
        "alice",
        "lead-qualifier",
        "session",
    )
    assert ("start", 201, "alice", "session") in actions and ("message", 409, "alice", "session") in actions


async def test_another_tenants_or_another_users_conversation_answers_404(
    signed_agent: SignedStack,
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    alice, bob, carol, dave = [
        await stack.login(u, t)
        for u, t in (("alice", "acme"), ("bob", "acme"), ("carol", "acme"), ("dave", "globex"))
    ]
    code, body = await stack.call(
        "POST", "/api/conversations", alice, {"agent": "lead-qualifier", "message": "hello"}
    )
    assert code == 201, body
    wf = body["workflow_id"]
    stack.agent.track(wf)
    for who in (dave, bob):
        for method, path, payload in (
            ("GET", "", None),
            ("GET", "/transcript", None),
            ("POST", "/messages", {"text": "hi"}),
            ("POST", "/answers/c1", {"text": "x"}),
            ("POST", "/rollback", {"scope": "turn"}),
            ("POST", "/end", None),
        ):
            code, body = await stack.call(method, f"/api/conversations/{wf}{path}", who, payload)
            assert code == 404, (path, body)
    # a tenant admin reads and may end its users' conversations; writing in them stays the user's
    code, status = await stack.call("GET", f"/api/conversations/{wf}", carol)
    assert code == 200 and status["user_id"] == "alice"
    code, _ = await stack.call("POST", f"/api/conversations/{wf}/messages", carol, {"text": "hi"})
    assert code == 404
    code, _ = await stack.call("GET", "/api/conversations/conv-acme-nothing", alice)
    assert code == 404
    # nobody logged in; a body that is not the contract's; starting as someone else
    assert (await stack.call("GET", f"/api/conversations/{wf}", None))[0] == 401
    assert (await stack.call("POST", "/api/conversations", alice, {"agent": "lead-qualifier", "x": 1}))[
        0
    ] == 422
    assert (await stack.call("POST", "/api/conversations", alice, {"agent": "no-such-agent"}))[0] == 422
    code, body = await stack.call(
        "POST", "/api/conversations", alice, {"agent": "lead-qualifier", "user_id": "bob"}
    )
    assert code == 403, body


async def test_an_api_token_acts_only_for_its_users_in_its_tenant_and_stops_when_revoked(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    async with (
        token_for(db_engine, "acme", "bridge", "alice") as acme_token,
        token_for(db_engine, "globex", "other", "dave") as globex_token,
    ):
        code, body = await stack.call(
            "POST",
            "/api/conversations",
            acme_token,
            {"agent": "lead-qualifier", "message": "hello", "user_id": "alice"},
        )
        assert code == 201, body
        wf = body["workflow_id"]
        stack.agent.track(wf)
        code, body = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=1", acme_token)
        assert (code, body["state"], body["turn"]["reply"]) == (200, "replied", HI), body
        code, body = await stack.call(
            "POST", f"/api/conversations/{wf}/messages", acme_token, {"text": "hello"}
        )
        assert code == 202, body
        # not one of its users; no user named; another tenant's token; the reviewers' API
        for payload in (
            {"agent": "lead-qualifier", "user_id": "bob"},
            {"agent": "lead-qualifier", "user_id": "dave"},
        ):
            assert (await stack.call("POST", "/api/conversations", acme_token, payload))[0] == 403
        assert (await stack.call("POST", "/api/conversations", acme_token, {"agent": "lead-qualifier"}))[
            0
        ] == 422
        assert (await stack.call("GET", f"/api/conversations/{wf}", globex_token))[0] == 404
        assert (await stack.call("POST", f"/api/conversations/{wf}/end", globex_token))[0] == 404
        assert (await stack.call("GET", "/api/approvals", acme_token))[0] == 403
        # alice's own session reaches the conversation the token started for her
        alice = await stack.login("alice")
        assert (await stack.call("GET", f"/api/conversations/{wf}", alice))[0] == 200
        async with session_factory(db_engine).begin() as session:
            await tokens.revoke(session, "bridge", "acme", datetime.now(UTC))
        assert (await stack.call("GET", f"/api/conversations/{wf}", acme_token))[0] == 401
        async with db_engine.connect() as conn:
            uses = list(
                await conn.execute(
                    select(RequesterAction.action, RequesterAction.status, RequesterAction.user_id)
                    .join(ApiToken, ApiToken.id == RequesterAction.token_id)
                    .where(ApiToken.name == "bridge")
                    .order_by(RequesterAction.id)
                )
            )
        assert uses[0] == ("start", 201, "alice") and ("start", 403, "bob") in uses, uses


async def test_a_flood_is_refused_at_the_server_before_temporal_sees_it(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    settings = stack.agent.settings.model_copy(update={"proof_private_key": stack.keys.private})
    async with (
        token_for(db_engine, "globex", "flood", "dave") as token,
        running_server(
            settings, "127.0.0.1", 0, client=stack.agent.client, rate=ApiRate(per_s=0.01, burst=3)
        ) as url,
        aiohttp.ClientSession() as http,
    ):
        answers = []
        for _ in range(6):
            async with http.post(
                url + "/api/conversations",
                json={"agent": "no-such-agent", "user_id": "dave"},
                headers={"Authorization": f"Bearer {token}"},
            ) as response:
                answers.append((response.status, response.headers.get("Retry-After")))
    assert [s for s, _ in answers] == [422, 422, 422, 429, 429, 429], answers
    assert all(int(r or 0) >= 1 for s, r in answers if s == 429)
    async with db_engine.connect() as conn:
        refused = await conn.scalar(
            select(RequesterAction.id)
            .where(RequesterAction.status == 429, RequesterAction.user_id == "dave")
            .limit(1)
        )
    assert refused is not None


async def test_a_keyed_conversation_is_its_first_users(signed_agent: SignedStack) -> None:
    stack = signed_agent
    stack.agent.script(HELLO)
    alice, carol = await stack.login("alice"), await stack.login("carol")
    body = {"agent": "lead-qualifier", "message": "hello", "key": "support-42"}
    code, first = await stack.call("POST", "/api/conversations", alice, body)
    assert code == 201 and first["message_id"], first
    stack.agent.track(first["workflow_id"])
    code, again = await stack.call("POST", "/api/conversations", alice, body)
    assert code == 201 and again["workflow_id"] == first["workflow_id"]
    code, reply = await stack.call(
        "GET", f"/api/conversations/{first['workflow_id']}/reply?message_id={again['message_id']}", alice
    )
    assert reply["state"] == "replied", reply
    assert (await stack.call("POST", "/api/conversations", carol, body))[0] == 409
    assert (await stack.call("POST", "/api/conversations", alice, {**body, "key": "bad key!"}))[0] == 422


async def proof_checks(engine: AsyncEngine, workflow_id: str) -> list[Any]:
    async with engine.connect() as conn:
        query = select(ProofCheck).where(ProofCheck.workflow_id == workflow_id).order_by(ProofCheck.id)
        return list(await conn.execute(query))


async def test_a_raw_temporal_start_or_message_is_refused_and_recorded_in_signed_mode(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """Anyone who reaches Temporal is no one: a start or a message without the server's proof is
    refused on the record (answers, rollbacks and ends: tests/server/test_inbox_forgery.py)."""
    stack, agent = signed_agent, signed_agent.agent
    agent.script(HELLO)
    raw = StartConversation(tenant_id="acme", user_id="alice", agent="lead-qualifier", message="hello")
    handle = await agent.client.start_workflow(
        AgentWorkflow.run, raw, id=f"test-raw-{uuid.uuid4()}", task_queue=agent.settings.task_queue
    )
    agent.track(handle.id)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert isinstance(failed.value.cause, ApplicationError)
    assert failed.value.cause.type == "UnprovenStart" and "no proof" in failed.value.cause.message
    [check] = await proof_checks(db_engine, handle.id)
    assert (check.action, check.accepted, check.actor) == ("start", False, "alice")
    async with db_engine.connect() as conn:
        audited = list(await conn.execute(select(InputAudit).where(InputAudit.workflow_id == handle.id)))
    assert [(a.action, a.accepted) for a in audited] == [("start", False)]

    # a message from Temporal directly, to a conversation the server started: refused, recorded
    alice = await stack.login("alice")
    code, started = await stack.call("POST", "/api/conversations", alice, {"agent": "lead-qualifier"})
    assert code == 201, started
    wf = started["workflow_id"]
    agent.track(wf)
    conversation = agent.client.get_workflow_handle(wf)
    await conversation.signal(
        AgentWorkflow.submit_message, SubmitMessage(user_id="alice", text="hello", message_id="m1")
    )
    with pytest.raises(WorkflowUpdateFailedError):
        await wait_reply(agent.client, wf, "m1")

    async def refused_message() -> Any:
        return [c for c in await proof_checks(db_engine, wf) if c.action == "message"]

    [check] = await until(refused_message, "the message's check is recorded")
    assert (check.accepted, "no proof" in check.reason) == (False, True)
    assert (await conversation.query(AgentWorkflow.status)).turn == 0
    # the same through the server counts, and the start was proven
    code, sent = await stack.call("POST", f"/api/conversations/{wf}/messages", alice, {"text": "hello"})
    assert code == 202, sent
    code, reply = await stack.call(
        "GET", f"/api/conversations/{wf}/reply?message_id={sent['message_id']}", alice
    )
    assert (reply["state"], reply["turn"]["reply"]) == ("replied", HI), reply
    accepted = [(c.action, c.subject) for c in await proof_checks(db_engine, wf) if c.accepted]
    assert accepted == [("start", "alice"), ("message", "alice")]


async def test_a_cancel_stops_the_conversation_and_leaves_approved_effects_in_place(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack, agent = signed_agent, signed_agent.agent
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane")
    await pending(handle)
    bob = await stack.login("bob")
    code, body = await stack.call("POST", f"/api/approvals/{handle.id}/c1", bob, {"decision": "approve"})
    assert code == 200, body

    async def idle() -> Any:
        return (await handle.query(AgentWorkflow.status)).state == "idle"

    await until(idle, "the approved call ran and the turn ended")
    assert await lead_status(db_engine, "acme") == "qualified"
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert isinstance(failed.value.cause, CancelledError)
    assert await lead_status(db_engine, "acme") == "qualified"  # bob's approved change stays
    async with db_engine.connect() as conn:
        undone = list(await conn.execute(select(Compensation).where(Compensation.workflow_id == handle.id)))
    assert undone == []
    await replayer().replay_workflow(await handle.fetch_history())


async def test_under_tls_the_session_cookie_is_secure_and_me_says_which_mode_runs(
    signed_agent: SignedStack,
) -> None:
    stack = signed_agent
    settings = stack.agent.settings.model_copy(
        update={"proof_private_key": stack.keys.private, "cookie_secure": True}
    )
    login = {"tenant_id": "acme", "user_id": "alice", "password": "alice-dev"}
    async with (
        running_server(settings, "127.0.0.1", 0, client=stack.agent.client) as url,
        aiohttp.ClientSession() as http,
        http.post(url + "/api/login", json=login) as response,
    ):
        cookie = response.headers["Set-Cookie"]
        token = (await response.json())["token"]
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Secure" not in (await stack_cookie(stack))
    code, me = await stack.call("GET", "/api/me", token)
    assert code == 200 and me["auth_mode"] in ("signed", "names")  # the deployment's, from PostgreSQL


async def stack_cookie(stack: SignedStack) -> str:
    login = {"tenant_id": "acme", "user_id": "alice", "password": "alice-dev"}
    async with aiohttp.ClientSession() as http, http.post(stack.url + "/api/login", json=login) as response:
        return response.headers["Set-Cookie"]


async def test_a_body_naming_a_key_twice_is_refused_and_starts_nothing(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """The door parses its bodies as strictly as the inbox does: a key twice is a 400 with why,
    never resolved to the last value (issue 26, class 3)."""
    stack = signed_agent
    alice = await stack.login("alice")
    body = b'{"agent": "lead-qualifier", "message": "hello", "message": "ask me"}'
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            stack.url + "/api/conversations",
            data=body,
            headers={"Authorization": f"Bearer {alice}", "Content-Type": "application/json"},
        ) as response,
    ):
        assert response.status == 400, await response.text()
        assert "more than once" in (await response.json())["error"]
    async with db_engine.connect() as conn:
        refused = (
            await conn.execute(
                select(RequesterAction.status, RequesterAction.reason, RequesterAction.workflow_id)
                .where(RequesterAction.action == "start", RequesterAction.status == 400)
                .order_by(RequesterAction.id.desc())
                .limit(1)
            )
        ).one()
    assert "more than once" in (refused.reason or "") and refused.workflow_id is None, refused


async def test_a_reviewer_reads_the_conversation_of_a_call_they_review_and_acts_in_none(
    signed_agent: SignedStack, jane_is_new: None
) -> None:
    """Issue 50 item 6: bob, who may decide a call of alice's conversation and then decides it,
    opens its status and transcript (and its audit); he writes nothing in it, and erin, a reviewer
    of another tenant, still learns nothing."""
    stack, agent = signed_agent, signed_agent.agent
    agent.script(qualify(), ECHO_RESULT)
    alice, bob, erin = (
        await stack.login("alice"),
        await stack.login("bob"),
        await stack.login("erin", "globex"),
    )
    code, body = await stack.call(
        "POST", "/api/conversations", alice, {"agent": "lead-qualifier", "message": "qualify jane"}
    )
    assert code == 201, body
    wf = body["workflow_id"]
    handle = agent.client.get_workflow_handle(wf, result_type=ConversationResult)
    agent.track(wf)
    await pending(handle)
    code, status = await stack.call("GET", f"/api/conversations/{wf}", bob)  # the card he may decide
    assert code == 200 and status["pending_approvals"][0]["call_id"] == "c1", status
    code, body = await stack.call("POST", f"/api/approvals/{wf}/c1", bob, {"decision": "approve"})
    assert code == 200, body

    async def idle() -> Any:
        code, status = await stack.call("GET", f"/api/conversations/{wf}", bob)
        assert code == 200, status
        return status["state"] == "idle"

    await until(idle, "the approved call ran and the turn ended")
    code, messages = await stack.call("GET", f"/api/conversations/{wf}/transcript", bob)
    assert code == 200 and [m["content"] for m in messages if m["role"] == "user"] == ["qualify jane"]
    code, rows = await stack.call("GET", f"/api/conversations/{wf}/audit", bob)
    assert code == 200 and [r["approved_by"] for r in rows] == ["bob"], rows
    for method, path, payload in (
        ("POST", "/messages", {"text": "hi"}),
        ("POST", "/rollback", {"scope": "turn"}),
        ("POST", "/end", None),
    ):
        code, body = await stack.call(method, f"/api/conversations/{wf}{path}", bob, payload)
        assert code == 404, (path, body)
    for path in ("", "/transcript"):
        assert (await stack.call("GET", f"/api/conversations/{wf}{path}", erin))[0] == 404
