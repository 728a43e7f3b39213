"""Issue 48 item 1 (and item 9's grants), end to end in signed mode through the real server, worker,
Temporal and PostgreSQL: a grant covers a later call only when that call's resolved effect has the
approved content, never because its arguments are the same; it still covers the same content; and it
never covers what its approver last edited (four-eyes), nor anything once its approver no longer
stands (deactivated).

The undo of the first send inside its delivery window is what `cancel_sent_draft` writes (the queued
email cancelled, the draft unsent again), written here directly: what matters is that draft N can be
sent again, by reference, after someone rewrote it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.access import set_active
from countersign.db.engine import session_factory
from countersign.db.schema import EmailDraft, EmailOutbox, Grant, GrantUse
from tests.e2e.test_asked_again import card
from tests.e2e.test_grants import decide, ran_unasked
from tests.fixtures.approvals import ATTACKER, PARTNER
from tests.fixtures.inbox import SignedStack

THREE_USES = {"minutes": 60, "uses": 3}


# every test: no grant of an earlier test is left to cover its call; its cancelled sends are deleted
pytestmark = pytest.mark.usefixtures("no_grants_left", "outbox_cleared")


def send_script(stack: SignedStack, draft: int) -> None:
    send = {"name": "send_draft", "arguments": {"draft": draft}}
    stack.agent.script(
        {"when": {"user_contains": "send"}, "reply": {"tool_calls": [send]}},
        {"when": {"after_tool": "send_draft"}, "reply": {"content": "done"}},
    )


async def granted_send(stack: SignedStack, engine: AsyncEngine, approver: str, draft: int) -> tuple[str, int]:
    """alice's `send_draft {"draft": N}`, approved by `approver` with a grant (60 min, 3 uses), sent,
    then undone inside its delivery window; the approver's session and the grant's id."""
    send_script(stack, draft)
    token = await stack.login(approver)
    handle = await stack.agent.start("send the partner draft", single_turn=True)
    item = await card(stack, token, handle.id)
    assert PARTNER in item["effect"]["summary"], item["effect"]
    status, body = await decide(stack, token, item, THREE_USES)
    assert status == 200 and body["state"] == "approved", body
    await asyncio.wait_for(handle.result(), 90)  # a loaded machine (CI runs three files at once)
    async with session_factory(engine)() as session, session.begin():
        grant = await session.scalar(select(Grant.id).where(Grant.workflow_id == handle.id))
        sent = await session.scalar(select(EmailDraft.sent_outbox_id).where(EmailDraft.id == draft))
        assert grant is not None and sent is not None
        await session.execute(update(EmailOutbox).where(EmailOutbox.id == sent).values(status="cancelled"))
        await session.execute(update(EmailDraft).where(EmailDraft.id == draft).values(sent_outbox_id=None))
    return token, grant


async def asked_to_send(stack: SignedStack, token: str) -> dict[str, Any]:
    """alice's send started again (one turn): the card it waits on, as `token`'s person sees it."""
    handle = await stack.agent.start("send the partner draft", single_turn=True)
    return await card(stack, token, handle.id)


async def edit(stack: SignedStack, who: str, draft: int, changes: dict[str, Any]) -> None:
    status, body = await stack.call("PATCH", f"/api/drafts/{draft}", await stack.login(who), changes)
    assert status == 200, body


async def uses(engine: AsyncEngine, grant_id: int) -> int:
    async with session_factory(engine)() as session:
        return len(list(await session.scalars(select(GrantUse).where(GrantUse.grant_id == grant_id))))


async def draft_now(engine: AsyncEngine, draft_id: int) -> EmailDraft:
    async with session_factory(engine)() as session:
        draft = await session.get(EmailDraft, draft_id)
    assert draft is not None
    return draft


@pytest_asyncio.fixture
async def outbox_cleared(db_engine: AsyncEngine) -> AsyncIterator[None]:
    """The cancelled first sends of these tests are deleted after them (the draft fixture deletes the
    last)."""
    yield
    async with session_factory(db_engine)() as session, session.begin():
        await session.execute(
            delete(EmailOutbox).where(EmailOutbox.tenant_id == "acme", EmailOutbox.status == "cancelled")
        )


async def test_a_grant_does_not_cover_a_draft_rewritten_to_another_recipient(
    signed_agent: SignedStack,
    db_engine: AsyncEngine,
    partner_draft: int,
) -> None:
    """The issue's reproduction: the same arguments, another effect. Asked, showing the attacker."""
    stack = signed_agent
    bob, grant_id = await granted_send(stack, db_engine, "bob", partner_draft)
    await edit(stack, "alice", partner_draft, {"to": ATTACKER, "body": "exfil: the full lead list"})

    asked = await asked_to_send(stack, bob)  # on main: ran unasked, as approved by bob, to the attacker
    assert ATTACKER in asked["effect"]["summary"] and asked["args"] == f'{{"draft": {partner_draft}}}'
    assert await uses(db_engine, grant_id) == 0
    assert (await draft_now(db_engine, partner_draft)).sent_outbox_id is None  # nothing went out


async def test_a_grant_still_covers_a_later_call_with_the_approved_content(
    signed_agent: SignedStack,
    db_engine: AsyncEngine,
    partner_draft: int,
) -> None:
    stack = signed_agent
    _, grant_id = await granted_send(stack, db_engine, "bob", partner_draft)
    row = await ran_unasked(stack, db_engine, "send the partner draft")
    assert (row.outcome, row.approved_by, row.grant_id) == ("executed", "bob", grant_id)
    assert await uses(db_engine, grant_id) == 1
    draft = await draft_now(db_engine, partner_draft)
    assert draft.sent_outbox_id is not None
    async with session_factory(db_engine)() as session:
        outbox = await session.get(EmailOutbox, draft.sent_outbox_id)
        assert outbox is not None and outbox.to_address == PARTNER


async def test_a_grant_never_covers_what_its_approver_last_edited(
    signed_agent: SignedStack,
    db_engine: AsyncEngine,
    partner_draft: int,
) -> None:
    """carol (an admin: she may approve, and edit any draft) grants the send, then edits the draft and
    puts it back as it was: the content is the approved one, but she is its last editor, so it is
    asked (four-eyes, as a decision applies it)."""
    stack = signed_agent
    _, grant_id = await granted_send(stack, db_engine, "carol", partner_draft)
    await edit(stack, "carol", partner_draft, {"subject": "Our offer, revised"})
    await edit(stack, "carol", partner_draft, {"subject": "Our offer"})

    asked = await asked_to_send(stack, await stack.login("bob"))  # on main: ran unasked, by carol's grant
    assert PARTNER in asked["effect"]["summary"]
    assert await uses(db_engine, grant_id) == 0


async def test_a_deactivated_approvers_grant_no_longer_approves_calls(
    signed_agent: SignedStack,
    db_engine: AsyncEngine,
    partner_draft: int,
) -> None:
    """Item 9: read when the grant would be spent, not when it was minted; nobody revoked it."""
    stack = signed_agent
    _, grant_id = await granted_send(stack, db_engine, "bob", partner_draft)
    async with session_factory(db_engine)() as session, session.begin():
        await set_active(session, "acme", "bob", False, datetime.now(UTC))
    try:
        asked = await asked_to_send(stack, await stack.login("carol"))  # on main: ran unasked, by bob's grant
        assert PARTNER in asked["effect"]["summary"]
        assert await uses(db_engine, grant_id) == 0
    finally:
        async with session_factory(db_engine)() as session, session.begin():
            await set_active(session, "acme", "bob", True, datetime.now(UTC))
