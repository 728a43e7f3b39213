"""The channels page in headless Chromium, under the strict CSP the other pages are tested with:
carol (acme's admin) opens it from the header's link, sees the Slack app's settings without any
secret, links a reviewer and unlinks them, keeps high-risk calls to the inbox, and sends a test post
that reaches the chat API served in the test; the page fits 1280 and 390 px. alice has no link to it,
and it refuses her.

Screenshots in test-artifacts/ (channels-1280.png, channels-390.png); WALKTHROUGH_RECORD=1 also
writes the how-to's, docs/channels.png."""

from __future__ import annotations

import json

import pytest
from playwright.async_api import async_playwright
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ChatChannel, ChatSender
from tests.e2e.test_chat_told_browser import fits_at_every_width
from tests.e2e.test_inbox_browser import CHROMIUM_ARGS, log_in
from tests.e2e.test_pages_browser import carol_on, picture
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.chat import SLACK_API, SLACK_TOKEN, Receiver
from tests.fixtures.inbox import SignedStack

pytestmark = pytest.mark.devserver

SECRET = "slack-signing-secret-for-the-page"


async def test_carol_links_a_reviewer_keeps_high_risk_to_the_inbox_and_sends_a_test_post(
    signed_dev_agent: SignedStack,
    db_engine: AsyncEngine,
    chromium: str,
    chat_receiver: Receiver,
    chat_cleanup: None,
) -> None:
    stack = signed_dev_agent
    channel = {"kind": "slack", "name": "#sales", "endpoint": f"{chat_receiver.base_url}{SLACK_API}",
               "bot_token": SLACK_TOKEN, "chat_id": "CREVIEW", "webhook_secret": SECRET}  # fmt: skip
    assert (await stack.call("PUT", "/api/admin/channel", await stack.login("carol"), channel))[0] == 200
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        carol, violations = await carol_on(browser, stack.url, "Channels")
        await carol.locator("#channel-kind", has_text="slack").wait_for()
        assert (await carol.text_content("#channel-token") or "").startswith("set (not shown)")
        shown = await carol.content()
        assert SLACK_TOKEN not in shown and SECRET not in shown and chat_receiver.base_url not in shown
        assert await carol.get_by_label("The chat decides").input_value() == "high"

        await carol.get_by_label("Chat user id").fill("UDAVE")
        await carol.get_by_label("User", exact=True).fill("bob")
        await carol.get_by_role("button", name="Link").click()
        await carol.locator('#senders tr[data-sender="UDAVE"]', has_text="bob").wait_for()
        assert await linked(db_engine) == [("UDAVE", "bob")]
        await carol.get_by_role("button", name="Remove UDAVE").click()
        await carol.locator("#status", has_text="Unlinked UDAVE").wait_for()
        await carol.locator('#senders tr[data-sender="UDAVE"]').wait_for(state="detached")
        assert await linked(db_engine) == []

        await carol.get_by_label("The chat decides").select_option("medium")
        await carol.get_by_role("button", name="Save", exact=True).click()
        await carol.locator("#status", has_text="Saved where decisions are made").wait_for()
        async with db_engine.connect() as conn:
            kept = await conn.scalar(select(ChatChannel.decides_up_to).where(ChatChannel.tenant_id == "acme"))
        assert kept == "medium"

        await carol.get_by_role("button", name="Send a test post").click()
        await carol.locator("#status", has_text="Posted a test message to #sales").wait_for()
        (post,) = [p for p in chat_receiver.posts if p["path"] == f"{SLACK_API}/chat.postMessage"]
        assert post["json"]["channel"] == "CREVIEW" and "sent by carol" in post["json"]["text"], post
        changes = await carol.locator("#changes tbody").text_content() or ""
        for change in ("sender UDAVE writes as bob", "sender UDAVE (bob) unlinked", "up to medium risk"):
            assert change in changes, changes
        await fits_at_every_width(carol, "channels")
        if (docs := picture("channels.png")) is not None:  # the how-to's picture, at desktop width
            await carol.set_viewport_size({"width": 1280, "height": 900})
            await carol.screenshot(path=docs, full_page=True)
        assert violations == [], json.dumps(violations)

        alice = await browser.new_page(viewport={"width": 390, "height": 700})
        await log_in(alice, stack.url, "alice")
        pages = alice.get_by_role("navigation", name="Pages")
        assert await pages.get_by_role("link", name="Channels").count() == 0
        response = await alice.goto(stack.url + "/channels")
        assert response is not None and response.status == 403
        await browser.close()


async def linked(engine: AsyncEngine) -> list[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(ChatSender.sender, ChatSender.user_id).where(ChatSender.tenant_id == "acme")
        )
        return [(r.sender, r.user_id) for r in rows.all()]
