"""The pages beside the inbox and the chat, and the JSON they read, on the real server and
PostgreSQL: the header's links (the tools page for a tenant's admins only), a person's
notifications listed and resolved over HTTP (theirs and the tenant-wide ones, nobody else's), and
the history of tier changes the tools page shows (refused attempts too, admins only)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import Notification, TenantToolTier
from tests.fixtures.inbox import AuthInbox
from tests.server.test_agent_tools_api import token

TOOLS = "/api/agents/lead-qualifier/tools"
MARK = "pages-api-test"


@pytest_asyncio.fixture
async def notes(db_engine: AsyncEngine) -> AsyncIterator[dict[str, int]]:
    """One notification each for alice, bob, all of acme and all of globex; removed afterwards."""
    rows = {
        "alice": ("acme", "alice"),
        "bob": ("acme", "bob"),
        "acme": ("acme", None),
        "globex": ("globex", None),
    }
    ids: dict[str, int] = {}
    async with db_engine.begin() as conn:
        for name, (tenant, user) in rows.items():
            inserted = insert(Notification).values(
                tenant_id=tenant, user_id=user, kind=MARK, message=f"for {name}"
            )
            ids[name] = (await conn.execute(inserted.returning(Notification.id))).scalar_one()
    yield ids
    async with db_engine.begin() as conn:
        await conn.execute(delete(Notification).where(Notification.kind == MARK))


async def test_a_person_lists_and_resolves_their_notifications_and_nobody_elses(
    auth_inbox: AuthInbox, db_engine: AsyncEngine, notes: dict[str, int]
) -> None:
    alice = await token(auth_inbox, "alice")
    status, listed, _ = await auth_inbox.call("GET", "/api/notifications", alice)
    assert status == 200, listed
    mine = {n["message"] for n in listed["notifications"] if n["kind"] == MARK}
    assert mine == {"for alice", "for acme"}  # hers and the tenant-wide one: not bob's, not globex's

    path = f"/api/notifications/{notes['alice']}/resolve"
    status, resolved, _ = await auth_inbox.call("POST", path, alice, {})
    assert status == 200 and resolved["changed"] is True and resolved["resolved_by"] == "alice", resolved
    assert (await auth_inbox.call("POST", path, alice, {}))[1]["changed"] is False  # already resolved
    async with db_engine.connect() as conn:
        row = (await conn.execute(select(Notification).where(Notification.id == notes["alice"]))).one()
    assert row.status == "resolved" and row.resolved_by == "alice"

    status, still_open, _ = await auth_inbox.call("GET", "/api/notifications?status=open", alice)
    assert {n["message"] for n in still_open["notifications"] if n["kind"] == MARK} == {"for acme"}
    status, done, _ = await auth_inbox.call("GET", "/api/notifications?status=resolved", alice)
    assert {n["message"] for n in done["notifications"] if n["kind"] == MARK} == {"for alice"}

    for other in ("bob", "globex"):  # someone else's looks like none at all
        status, body, _ = await auth_inbox.call(
            "POST", f"/api/notifications/{notes[other]}/resolve", alice, {}
        )
        assert status == 404, body
    assert (await auth_inbox.call("GET", "/api/notifications?status=mine", alice))[0] == 400
    assert (await auth_inbox.call("GET", "/api/notifications?limit=0", alice))[0] == 400
    assert (await auth_inbox.call("POST", "/api/notifications/x/resolve", alice, {}))[0] == 404
    assert (await auth_inbox.call("POST", path, alice, {"user": "bob"}))[0] == 400  # no one else's name
    assert (await auth_inbox.call("GET", "/api/notifications"))[0] == 401
    async with db_engine.connect() as conn:
        bobs = (await conn.execute(select(Notification).where(Notification.id == notes["bob"]))).one()
    assert bobs.status == "open"


@pytest_asyncio.fixture
async def acme_tiers_restored(db_engine: AsyncEngine) -> AsyncIterator[None]:
    yield
    async with db_engine.begin() as conn:
        where = (TenantToolTier.tenant_id == "acme") & (TenantToolTier.agent == "lead-qualifier")
        await conn.execute(delete(TenantToolTier).where(where))


async def test_the_tools_page_reads_every_tier_change_refused_ones_too(
    auth_inbox: AuthInbox, acme_tiers_restored: None
) -> None:
    carol, bob = await token(auth_inbox, "carol"), await token(auth_inbox, "bob")
    tiers = (await auth_inbox.call("GET", TOOLS, carol))[1]["tools"]

    def with_tier(tool: str, tier: str) -> dict[str, list[dict[str, str]]]:
        return {"tools": [{**t, "permissionStatus": tier} if t["toolName"] == tool else t for t in tiers]}

    status, body, _ = await auth_inbox.call("PUT", TOOLS, carol, with_tier("search_leads", "blocked"))
    assert status == 200, body
    status, refused, _ = await auth_inbox.call(
        "PUT", TOOLS, carol, with_tier("update_lead_status", "always_allow")
    )
    assert status == 403, refused

    status, history, _ = await auth_inbox.call("GET", TOOLS + "/changes", carol)
    assert status == 200, history
    latest, before = history["changes"][0], history["changes"][1]  # newest first
    assert (latest["toolName"], latest["newTier"], latest["accepted"]) == (
        "update_lead_status",
        "always_allow",
        False,
    )
    assert latest["reason"] and latest["reason"] in refused["error"] and latest["changedBy"] == "carol"
    assert (before["toolName"], before["oldTier"], before["newTier"], before["accepted"]) == (
        "search_leads", "always_allow", "blocked", True,
    )  # fmt: skip
    assert (await auth_inbox.call("GET", TOOLS + "/changes", bob))[0] == 403  # a reviewer, not an admin
    assert (await auth_inbox.call("GET", "/api/agents/nobody/tools/changes", carol))[0] == 404


async def test_the_header_links_the_tools_page_for_admins_only(auth_inbox: AuthInbox) -> None:
    carol, alice = await token(auth_inbox, "carol"), await token(auth_inbox, "alice")
    for path in ("/", "/chat", "/drafts", "/tools"):
        status, page, _ = await auth_inbox.call("GET", path, carol)
        assert status == 200 and 'href="/tools"' in page and 'href="/drafts"' in page, path
        assert page.count('aria-current="page"') == 1, path
    for path in ("/", "/chat", "/drafts"):
        status, page, _ = await auth_inbox.call("GET", path, alice)
        assert status == 200 and 'href="/tools"' not in page and 'href="/drafts"' in page, path
    status, page, _ = await auth_inbox.call("GET", "/tools", alice)
    assert status == 403 and "Only an admin of acme" in page and 'id="tiers"' not in page
    status, page, _ = await auth_inbox.call("GET", "/drafts")  # signed out: the login form
    assert status == 200 and 'id="login"' in page and 'id="drafts"' not in page
    assert "<script>" not in page and " on" + "click=" not in page  # scripts from /static only
