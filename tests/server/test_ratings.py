"""People rate replies (issue 53, the Perin design's "user satisfaction, measured through
feedback"), on the real parts (time-skipping Temporal, PostgreSQL, the scripted model, the server
over HTTP, a signed-mode worker): the conversation's user rates a turn's reply through the API, a
token acting for them and a chat app's linked user too; nobody else does, admins included; a second
rating replaces the first; every rating is chained in the audit, so exported with it; `stats` sums
them per agent and per tool the turn called."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.evidence import fixed_change
from countersign.db.chain import export_bundle
from countersign.db.engine import session_factory
from countersign.db.schema import RequesterAction
from countersign.identity.proofs import load_private_key
from countersign.observability.stats import collect
from countersign.server.conversation_events import ConversationEvents
from countersign.server.http import HttpRefusal
from countersign.server.requesters import RatingBody, Requesters
from tests.fixtures.inbox import SignedStack
from tests.server.test_front_door import token_for

FIND = {
    "when": {"user_contains": "find jane"},
    "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "jane"}}]},
}
FOUND = {"when": {"after_tool": "search_leads"}, "reply": {"content": "Jane Doe is a new lead"}}


async def replied(stack: SignedStack, token: str, workflow_id: str, turn: int) -> dict[str, Any]:
    code, reply = await stack.call(
        "GET", f"/api/conversations/{workflow_id}/reply?turn={turn}&wait=30", token
    )
    assert code == 200 and reply["state"] == "replied", reply
    return dict(reply["turn"])


async def conversation_with_a_reply(stack: SignedStack, alice: str) -> str:
    stack.agent.script(FIND, FOUND)
    code, body = await stack.call(
        "POST", "/api/conversations", alice, {"agent": "lead-qualifier", "message": "find jane"}
    )
    assert code == 201, body
    workflow_id = str(body["workflow_id"])
    stack.agent.track(workflow_id)
    assert "Jane Doe is a new lead" in (await replied(stack, alice, workflow_id, 1))["reply"]
    return workflow_id


async def test_the_conversations_user_rates_a_reply_and_rating_again_replaces_it(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    alice = await stack.login("alice")
    wf = await conversation_with_a_reply(stack, alice)
    code, first = await stack.call("PUT", f"/api/conversations/{wf}/ratings/1", alice, {"rating": "helpful"})
    assert code == 200, first
    assert (first["turn"], first["rating"], first["rated_by"], first["replaced"]) == (
        1,
        "helpful",
        "alice",
        False,
    )
    again = {"rating": "not_helpful", "comment": "it was the other Jane"}
    code, second = await stack.call("PUT", f"/api/conversations/{wf}/ratings/1", alice, again)
    assert code == 200 and second["replaced"] is True and second["seq"] == first["seq"], second
    code, held = await stack.call("GET", f"/api/conversations/{wf}/ratings", alice)
    assert code == 200 and [(r["turn"], r["rating"], r["comment"]) for r in held] == [
        (1, "not_helpful", "it was the other Jane")
    ], held
    async with session_factory(db_engine)() as session:
        records, _ = await export_bundle(
            session, load_private_key(stack.keys.private), "acme", datetime.now(UTC)
        )
    rated = [json.loads(line) for line in records.decode().splitlines() if '"reply_ratings"' in line]
    facts = [r["record"]["fact"] for r in rated]
    mine = [f for f in facts if f["workflow_id"] == wf]
    assert [(f["rating"], f["comment"], f["tools"]) for f in mine] == [
        ("helpful", None, ["search_leads"]),
        ("not_helpful", "it was the other Jane", ["search_leads"]),
    ], mine
    # the replaced rating is a change the chain allows (`audit verify` compares the fixed columns
    # with the first record; the whole of acme's chain is not checked here: other tests delete rows
    # of the seeded tenants)
    assert fixed_change("reply_ratings", mine[0], mine[1]) is None


async def test_nobody_but_the_conversations_user_rates_it_and_odd_requests_are_refused(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    alice = await stack.login("alice")
    wf = await conversation_with_a_reply(stack, alice)
    helpful = {"rating": "helpful"}
    for who in [await stack.login("bob"), await stack.login("carol"), await stack.login("dave", "globex")]:
        code, body = await stack.call("PUT", f"/api/conversations/{wf}/ratings/1", who, helpful)
        assert code == 404, body  # carol is an admin: she reads alice's conversations, not rates them
        assert (await stack.call("GET", f"/api/conversations/{wf}/ratings", who))[0] == 404
    assert (await stack.call("PUT", f"/api/conversations/{wf}/ratings/1", None, helpful))[0] == 401
    for turn, body, status in (
        ("2", helpful, 404),  # no reply to turn 2: there is no turn 2
        ("0", helpful, 422),
        ("x", helpful, 422),
        ("99999999999", helpful, 422),
        ("1", {"rating": "great"}, 422),
        ("1", {"rating": "helpful", "score": 5}, 422),
    ):
        code, answer = await stack.call("PUT", f"/api/conversations/{wf}/ratings/{turn}", alice, body)
        assert code == status, (turn, body, answer)
        assert "error" in answer, answer
    async with db_engine.connect() as conn:
        refused = list(
            await conn.execute(
                select(RequesterAction.user_id, RequesterAction.status).where(
                    RequesterAction.workflow_id == wf, RequesterAction.action == "rate"
                )
            )
        )
    assert ("bob", 404) in refused and ("alice", 422) in refused, refused
    code, held = await stack.call("GET", f"/api/conversations/{wf}/ratings", alice)
    assert code == 200 and held == [], held
    long = {"rating": "helpful", "comment": "x" * 100_000}  # a comment is a reason: bounded, cut visibly
    code, rated = await stack.call("PUT", f"/api/conversations/{wf}/ratings/1", alice, long)
    assert code == 200 and len(rated["comment"]) <= 2_000, len(rated.get("comment") or "")


async def test_a_token_acting_for_the_user_rates_and_stats_sum_the_ratings_per_agent_and_tool(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    alice = await stack.login("alice")
    wf = await conversation_with_a_reply(stack, alice)
    since = datetime.now(UTC) - timedelta(seconds=1)
    async with session_factory(db_engine)() as session:
        before = await collect(session, since, "acme")
    async with token_for(db_engine, "acme", "rating-client", "alice") as token:
        code, body = await stack.call(
            "PUT", f"/api/conversations/{wf}/ratings/1", token, {"rating": "not_helpful"}
        )
    assert code == 200 and body["rated_by"] == "alice", body
    async with session_factory(db_engine)() as session:
        after = await collect(session, since, "acme")

    def sums(stats: Any) -> tuple[int, int, int, int]:
        agent = next((a for a in stats.agents if a.agent == "lead-qualifier"), None)
        tool = next((t for t in stats.tools if t.tool == "search_leads"), None)
        return (
            agent.rated_helpful if agent else 0,
            agent.rated_not_helpful if agent else 0,
            tool.rated_helpful if tool else 0,
            tool.rated_not_helpful if tool else 0,
        )

    was, now = sums(before), sums(after)
    assert (now[0] - was[0], now[1] - was[1], now[2] - was[2], now[3] - was[3]) == (0, 1, 0, 1), (was, now)


async def test_a_chat_apps_linked_user_rates_a_reply_through_the_servers_function(
    signed_agent: SignedStack, db_engine: AsyncEngine, database_url: str
) -> None:
    """What a chat app's reaction or button calls (`Requesters.rate_from_chat`): the linked user
    rates their own conversation's reply; another linked user is refused, both recorded `via` chat."""
    stack = signed_agent
    alice = await stack.login("alice")
    wf = await conversation_with_a_reply(stack, alice)
    sessions = session_factory(db_engine)
    requesters = Requesters(
        stack.agent.client,
        sessions,
        load_private_key(stack.keys.private),
        stack.agent.settings,
        ConversationEvents(sessions, database_url),
    )
    rated = await requesters.rate_from_chat("acme", "alice", wf, 1, RatingBody(rating="helpful"))
    assert (rated["rating"], rated["rated_by"]) == ("helpful", "alice"), rated
    with pytest.raises(HttpRefusal) as refused:
        await requesters.rate_from_chat("acme", "bob", wf, 1, RatingBody(rating="not_helpful"))
    assert refused.value.status == 404
    _code, held = await stack.call("GET", f"/api/conversations/{wf}/ratings", alice)
    assert [(r["rating"], r["rated_by"]) for r in held] == [("helpful", "alice")], held
    async with db_engine.connect() as conn:
        chat = list(
            await conn.execute(
                select(RequesterAction.user_id, RequesterAction.status).where(
                    RequesterAction.workflow_id == wf, RequesterAction.via == "chat"
                )
            )
        )
    assert sorted(chat) == [("alice", 200), ("bob", 404)], chat
