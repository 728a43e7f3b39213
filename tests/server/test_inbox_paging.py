"""The reviewers' inbox in pages (issue 36, "waiting at scale"): `GET /api/approvals?limit=N` lists
the first N calls the reviewer may decide, soonest to expire first, and its `Link` walks the rest
with no gap and no duplicate; `GET /api/events?limit=N` streams that page and the count of the
rest; and only the page's conversations are asked of Temporal, however many wait.

The requests are recorded rows of a tenant of the test's own (real PostgreSQL, the inbox over HTTP);
whether their conversations run is Temporal's answer (`Inbox._runs`), stood in for and counted here.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from countersign.core.approvals import approver_refusal
from countersign.core.calls import Risk
from countersign.db.people import hash_password
from countersign.db.schema import ApprovalRequest, LoginAttempt, RateLimitBucket, Tenant, User, UserRole
from countersign.server.inbox import MAX_PAGE, Cursor, Decidable, Inbox
from tests.fixtures.inbox import AuthInbox

REVIEWER, SALES = "bob", "alice"  # bob: reviewer (low, medium, high; four-eyes on high); alice: sales (low)


ROLES = ["sales", "reviewer", "admin", "auditor"]


@given(roles=st.lists(st.sampled_from(ROLES), unique=True), own=st.booleans())
def test_the_filter_the_database_applies_is_the_approvers_rule(roles: list[str], own: bool) -> None:
    """Decidable (the SQL filter) lets through exactly the (risk, requester) pairs approver_refusal
    allows: the rule stays in one place."""
    decidable = Decidable.of("bob", roles)
    for risk in get_args(Risk):
        requester = "bob" if own else "alice"
        may = approver_refusal("approve", risk, requester, "bob", roles) is None
        passes = risk in decidable.risks or (
            risk in decidable.others_risks and requester != decidable.user_id
        )
        assert passes == may, (risk, requester, roles)


def test_reviewers_with_the_same_roles_and_no_four_eyes_risk_share_a_filter() -> None:
    assert Decidable.of("alice", ["sales"]) == Decidable.of("dave", ["sales"])
    assert Decidable.of("bob", ["reviewer"]) != Decidable.of("erin", ["reviewer"])  # high: not their own


STORED = st.text(st.characters(exclude_characters="\x00"), min_size=1)  # what PostgreSQL can hold


@given(at=st.datetimes(timezones=st.just(UTC)), workflow_id=STORED, call_id=STORED)
def test_a_cursor_comes_back_from_its_token_whatever_the_ids_hold(
    at: datetime, workflow_id: str, call_id: str
) -> None:
    cursor = Cursor(expires_at=at, workflow_id=workflow_id, call_id=call_id)
    assert Cursor.parse(cursor.token()) == cursor


@pytest.mark.parametrize(
    "token",
    [
        "",
        "x",
        "bm90IGEgY3Vyc29y",
        "WzEsMiwzXQ",
        "WyJ4IiwiYSIsImIiXQ",
        "A" * 3000,
        "WyIyMDI2LTEyLTAxVDAwOjAwOjAwKzAwOjAwIiwgIlx1MDAwMCIsICJ4Il0",
    ],  # the last: a NUL id
)
def test_a_token_the_server_did_not_give_is_a_value_error(token: str) -> None:
    with pytest.raises(ValueError):
        Cursor.parse(token)


@dataclass(frozen=True)
class Waiting:
    """A tenant of the test's own with recorded pending requests, and Temporal's stand-in."""

    tenant: str
    tokens: dict[str, str]  # user -> session token
    rows: list[ApprovalRequest]
    described: list[str]  # workflow ids asked of "Temporal", in order
    closed: set[str]  # workflow ids whose conversations ended without closing their requests

    def key(self, row: ApprovalRequest) -> str:
        return f"{row.workflow_id}/{row.call_id}"

    def decidable_by(self, user: str) -> list[ApprovalRequest]:
        """The rows `user` may approve, in the inbox's order (conversations closed or not)."""
        allowed: dict[str, set[Risk]] = {REVIEWER: {"low", "medium", "high"}, SALES: {"low"}}
        mine = [
            r
            for r in self.rows
            if r.risk in allowed[user] and not (r.risk == "high" and r.requested_by == user)
        ]
        return sorted(mine, key=lambda r: (r.expires_at, r.workflow_id, r.call_id))


def request_row(tenant: str, i: int, risk: Risk, requested_by: str, expires_at: datetime) -> ApprovalRequest:
    return ApprovalRequest(
        conversation_id="",  # no conversations row: the instance its workflow id names is ""
        call_id=f"c{i}",
        workflow_id=f"{tenant}-wf-{i:03d}",
        tenant_id=tenant,
        agent="lead-qualifier",
        tool="update_lead_status",
        risk=risk,
        args=json.dumps({"lead": f"lead{i}@example.com", "new_status": "qualified"}),
        args_sha256="-",
        nonce=f"n{i}",
        requested_by=requested_by,
        requested_at=expires_at - timedelta(hours=1),
        expires_at=expires_at,
    )


async def add_requests(engine: AsyncEngine, rows: list[ApprovalRequest]) -> None:
    async with async_sessionmaker(engine, expire_on_commit=False).begin() as session:
        session.add_all(rows)


@pytest_asyncio.fixture
async def waiting(
    auth_inbox: AuthInbox,
    db_engine: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Waiting]:
    """Users bob and alice in a new tenant, `request.param` rows (a mix of risks and requesters,
    expiring in pairs: ties broken by the key), and Temporal's describe counted."""
    tenant = f"paging-{uuid.uuid4().hex[:8]}"
    described: list[str] = []
    closed: set[str] = set()

    async def runs(inbox: Inbox, workflow_id: str) -> bool:
        described.append(workflow_id)
        return workflow_id not in closed

    monkeypatch.setattr(Inbox, "_runs", runs)
    kinds: list[tuple[Risk, str]] = [
        ("high", REVIEWER),
        ("high", SALES),
        ("medium", REVIEWER),
        ("low", SALES),
    ]
    count = request.param
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=30)
    rows = [request_row(tenant, i, *kinds[i % 4], soon + timedelta(seconds=i // 2)) for i in range(count)]
    rows.reverse()  # recorded in another order than the inbox's
    async with async_sessionmaker(db_engine).begin() as session:
        session.add(Tenant(id=tenant, name=tenant))
        await session.flush()
        for user, role in ((REVIEWER, "reviewer"), (SALES, "sales")):
            session.add(User(tenant_id=tenant, id=user, display_name=user, email=f"{user}@{tenant}.example",
                             password_hash=hash_password(f"{user}-pw")))  # fmt: skip
            await session.flush()
            session.add(UserRole(tenant_id=tenant, user_id=user, role=role))
    await add_requests(db_engine, rows)
    tokens = {}
    for user in (REVIEWER, SALES):
        status, body, _ = await auth_inbox.login(user, f"{user}-pw", tenant=tenant)
        assert status == 200, body
        tokens[user] = body["token"]
    try:
        yield Waiting(tenant=tenant, tokens=tokens, rows=rows, described=described, closed=closed)
    finally:
        async with db_engine.begin() as conn:
            for table in (
                ApprovalRequest,
                LoginAttempt,
                RateLimitBucket,
                User,
            ):  # roles, sessions go with users
                await conn.execute(delete(table).where(table.tenant_id == tenant))
            await conn.execute(delete(Tenant).where(Tenant.id == tenant))


async def listed(inbox: AuthInbox, token: str, path: str) -> tuple[list[str], dict[str, str]]:
    status, body, headers = await inbox.call("GET", path, token)
    assert status == 200, body
    return [f"{i['workflow_id']}/{i['call_id']}" for i in body], headers


def next_link(headers: dict[str, str]) -> str | None:
    link = headers.get("Link")
    if link is None:
        return None
    target, rel = link.split(";")
    assert rel.strip() == 'rel="next"' and target.startswith("</api/approvals?"), link
    return target.strip("<>")


@pytest.mark.parametrize("waiting", [26], indirect=True)
async def test_pages_walk_every_call_the_reviewer_may_decide_once_in_order(
    auth_inbox: AuthInbox, waiting: Waiting
) -> None:
    bob, alice = waiting.tokens[REVIEWER], waiting.tokens[SALES]
    order = waiting.decidable_by(REVIEWER)
    waiting.closed.update({order[3].workflow_id, order[4].workflow_id})  # ended, requests left open
    everything, headers = await listed(auth_inbox, bob, "/api/approvals")  # without limit: as before
    expected = [waiting.key(r) for r in order if r.workflow_id not in waiting.closed]
    assert everything == expected and "Link" not in headers and "More-Waiting" not in headers
    assert not any(
        waiting.key(r) in everything for r in waiting.rows if r.risk == "high" and r.requested_by == REVIEWER
    )

    pages: list[list[str]] = []
    more: list[int] = []
    path: str | None = "/api/approvals?limit=5"
    while path is not None:
        page, headers = await listed(auth_inbox, bob, path)
        pages.append(page)
        more.append(int(headers["More-Waiting"]))
        path = next_link(headers)
    assert [k for page in pages for k in page] == expected  # no gap, no duplicate, in order
    assert [len(p) for p in pages] == [5] * (len(expected) // 5) + (
        [len(expected) % 5] if len(expected) % 5 else []
    )
    assert more == [max(0, len(expected) - 5 * (n + 1)) for n in range(len(pages))]

    low = [waiting.key(r) for r in waiting.decidable_by(SALES)]  # alice: low risk only, hers included
    assert (await listed(auth_inbox, alice, f"/api/approvals?limit={MAX_PAGE}"))[0] == low


@pytest.mark.parametrize("waiting", [4], indirect=True)
async def test_a_bad_limit_or_cursor_is_a_400_that_says_why(auth_inbox: AuthInbox, waiting: Waiting) -> None:
    bob = waiting.tokens[REVIEWER]
    for query in (
        "limit=0",
        f"limit={MAX_PAGE + 1}",
        "limit=x",
        "limit=-1",
        "limit=5.0",
        "limit=",
        "limit=99999999999",
    ):
        status, body, _ = await auth_inbox.call("GET", f"/api/approvals?{query}", bob)
        assert status == 400 and f"from 1 to {MAX_PAGE}" in body["error"], (query, body)
        status, body, _ = await auth_inbox.call("GET", f"/api/events?{query}", bob)
        assert status == 400 and f"from 1 to {MAX_PAGE}" in body["error"], (query, body)
    for query in ("limit=2&after=bm90IGEgY3Vyc29y", "limit=2&after=%25%25", "limit=2&after=WzEsMiwzXQ"):
        status, body, _ = await auth_inbox.call("GET", f"/api/approvals?{query}", bob)
        assert status == 400 and "not a cursor" in body["error"], (query, body)
    _, headers = await listed(auth_inbox, bob, "/api/approvals?limit=1")
    cursor = next_link(headers)
    assert cursor is not None
    status, body, _ = await auth_inbox.call("GET", cursor.replace("limit=1&", ""), bob)
    assert status == 400 and "after comes with limit" in body["error"], body


async def approvals_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            yield json.loads(line[6:])


@pytest.mark.parametrize("waiting", [60], indirect=True)
async def test_only_the_page_is_asked_of_temporal_and_the_stream_sends_it_with_the_count(
    auth_inbox: AuthInbox, db_engine: AsyncEngine, waiting: Waiting
) -> None:
    """The scale property: 60 calls wait, a page shows 8, and the listing and the events stream's
    poll describe only the page's conversations (main described all 60 at every listing)."""
    bob = waiting.tokens[REVIEWER]
    order = waiting.decidable_by(REVIEWER)
    page, headers = await listed(auth_inbox, bob, "/api/approvals?limit=8")
    assert page == [waiting.key(r) for r in order[:8]] and int(headers["More-Waiting"]) == len(order) - 8
    assert sorted(waiting.described) == sorted(r.workflow_id for r in order[:8])

    sooner = request_row(waiting.tenant, 999, "low", SALES, order[0].expires_at - timedelta(seconds=5))
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            auth_inbox.url + "/api/events?limit=8", headers={"Authorization": f"Bearer {bob}"}
        ) as stream,
    ):
        events = approvals_events(stream)
        first = await asyncio.wait_for(anext(events), 10)
        assert [f"{i['workflow_id']}/{i['call_id']}" for i in first["items"]] == page
        assert first["more"] == len(order) - 8
        await add_requests(db_engine, [sooner])  # a call comes, at the head: the poll sees it
        second = await asyncio.wait_for(anext(events), 10)
    assert [f"{i['workflow_id']}/{i['call_id']}" for i in second["items"]] == [waiting.key(sooner), *page[:7]]
    assert second["more"] == len(order) - 7
    page_conversations = {r.workflow_id for r in [sooner, *order[:8]]}
    assert set(waiting.described) <= page_conversations, set(waiting.described) - page_conversations
