"""Issue 34 in headless Chromium against the dev server, in APPROVER_AUTH=signed mode: the inbox card
of every built-in tool that waits for a decision shows first what the call will do, as the tool
resolved it (whose record, each field's before and after, the email as it will be sent), and the
model's arguments after it. One conversation of carol (an admin, so write_record is hers to ask)
asks for all of them at once; bob reads each card, and rejects them. One screenshot per card, and
the page, in test-artifacts/effects/."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import async_playwright
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.calls import CallerContext
from countersign.core.contract import Limits
from countersign.db import schema
from countersign.db.engine import session_factory
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import SignedStack
from tests.tools.test_effects import NOW, SAMPLES
from tools import REGISTRY
from tools.arguments import parse_arguments
from tools.registry import Needs, ToolContext

pytestmark = pytest.mark.devserver

AGENT = "effects-everything"
KEY = "effects-browser"  # the idempotency keys of the rows set up for the calls


async def setup_rows(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    """What the calls name, committed: a draft, a chat channel, a task, and a meeting proposal alice
    addressed to carol (through schedule_meeting itself). Extra arguments by tool."""
    async with session_factory(engine)() as session, session.begin():
        draft = schema.EmailDraft(
            tenant_id="acme",
            idempotency_key=KEY,
            created_by="carol",
            to_address="partner@example.org",
            subject="Our proposal",
            body="Dear partner,\nhere is our proposal.\nCarol",
        )
        session.add(draft)
        await session.execute(
            insert(schema.ChatChannel)
            .values(tenant_id="acme", kind="slack", endpoint="https://hooks.invalid/x", name="#sales")
            .on_conflict_do_nothing()
        )
        await session.flush()
        task = await session.scalar(select(schema.Task.id).where(schema.Task.title == "Review pricing page"))
        alice = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="scheduler")
        ctx = ToolContext(caller=alice, session=session, workflow_id=KEY, call_id="c1", now=NOW)
        schedule = REGISTRY["schedule_meeting"]
        proposal = await schedule.run(
            ctx, parse_arguments(schedule, {"with": "carol", "duration_minutes": 30})
        )
        assert not isinstance(proposal, Needs)
        return {
            "update_draft": {"draft": draft.id},
            "send_draft": {"draft": draft.id},
            "write_record": {"id": task},
            "accept_meeting": {"session": proposal.model_dump()["session"]},
            "resolve_notification": {"notification": "to meet Carol Chen"},
        }


@pytest_asyncio.fixture
async def everything_agent(db_engine: AsyncEngine) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """An agent with every tool that is not a read, each waiting for a decision, and the rows above."""
    changers = [name for name, t in REGISTRY.items() if t.category != "read"]
    async with db_engine.begin() as conn:
        await conn.execute(insert(schema.AgentProfile).values(name=AGENT, system_prompt="You do everything."))
        await conn.execute(
            insert(schema.AgentToolPermission),
            [{"agent": AGENT, "tool": name, "tier": "needs_approval"} for name in changers],
        )
    extra = await setup_rows(db_engine)
    try:
        yield extra
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(schema.AgentProfile).where(schema.AgentProfile.name == AGENT))
            await conn.execute(delete(schema.EmailDraft).where(schema.EmailDraft.idempotency_key == KEY))
            await conn.execute(delete(schema.ChatChannel).where(schema.ChatChannel.name == "#sales"))
            sessions = select(schema.MeetingSession.notification_id).where(
                schema.MeetingSession.idempotency_key.startswith(KEY)
            )
            await conn.execute(delete(schema.Notification).where(schema.Notification.id.in_(sessions)))
            await conn.execute(
                delete(schema.MeetingSession).where(schema.MeetingSession.idempotency_key.startswith(KEY))
            )
            await conn.execute(
                delete(schema.EmailOutbox).where(schema.EmailOutbox.idempotency_key.startswith(KEY))
            )


# What each card's effect must say (the samples' summaries, resolved against carol's data here)
EXPECTED = {sample.tool: sample.summary for sample in SAMPLES} | {
    "update_draft": "to_address partner@example.org → other@example.org",
    "resolve_notification": "status open → resolved",
    "accept_meeting": "Books “Meeting: Alice Anders / Carol Chen”",
    "confirm_meeting": "Books “Meeting: Carol Chen / Sam Lee”",
    "write_record": "tasks",
}


async def test_every_gated_tools_card_shows_its_resolved_effect_first(
    signed_dev_agent: SignedStack,
    db_engine: AsyncEngine,
    chromium: str,
    jane_is_new: None,
    everything_agent: dict[str, dict[str, Any]],
) -> None:
    stack = signed_dev_agent
    calls: list[dict[str, Any]] = [
        {"name": sample.tool, "arguments": sample.raw | everything_agent.get(sample.tool, {})}
        for sample in SAMPLES
    ]
    stack.agent.script(
        {"when": {"user_contains": "everything"}, "reply": {"tool_calls": calls}},
        {"when": {"after_tool": calls[-1]["name"]}, "reply": {"content": "all asked"}},  # the last result
    )
    shots = ARTIFACTS / "effects"
    shots.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        await log_in(page, stack.url, "bob")
        handle = await stack.agent.start(
            "do everything", user="carol", agent=AGENT, single_turn=True, limits=Limits(max_tool_calls=30)
        )
        for n, call in enumerate(calls, start=1):
            card = page.locator(f'li[data-key="{handle.id}/c{n}"]')
            await card.wait_for(timeout=30_000)
            summary = await card.locator(".effect-summary").text_content() or ""
            assert EXPECTED[call["name"]] in summary, (call["name"], summary)
            assert "would fail" not in summary and "not resolved" not in summary, (call["name"], summary)
            first = await card.evaluate(
                """(c) => Boolean(c.querySelector('.effect').compareDocumentPosition(
                    c.querySelector('.raw-args')) & Node.DOCUMENT_POSITION_FOLLOWING)"""
            )
            assert first, f"{call['name']}: the effect is not shown before the arguments"
            await card.screenshot(path=shots / f"{call['name']}.png")
        draft_call = [c["name"] for c in calls].index("send_draft") + 1
        send_draft = page.locator(f'li[data-key="{handle.id}/c{draft_call}"]')
        shown = await send_draft.locator(".effect-lines").text_content() or ""
        assert "sends email to partner@example.org" in shown and "      here is our proposal." in shown
        await page.screenshot(path=shots / "inbox.png", full_page=True)
        await browser.close()
    bob = await stack.login("bob")
    for n in range(1, len(calls) + 1):
        code, body = await stack.call(
            "POST", f"/api/approvals/{handle.id}/c{n}", bob, {"decision": "reject", "reason": "seen, not now"}
        )
        assert code == 200, body
    assert (await handle.result()).last_reply == "[scripted model] all asked"
