"""Rating a reply on the chat page, in headless Chromium against the dev server and a signed-mode
worker: alice asks, the agent replies, she says it did not help and why, changes her mind, and after
a reload the page still shows the rating she holds; the server holds it (one rating, replaced)."""

from __future__ import annotations

import pytest
from playwright.async_api import async_playwright
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ReplyRating
from tests.e2e.test_chat_browser import ask, chat_log_in
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import SignedStack
from tests.server.test_ratings import FIND, FOUND

pytestmark = pytest.mark.devserver


async def test_alice_rates_a_reply_on_the_chat_page_and_rating_again_replaces_it(
    signed_dev_agent: SignedStack, chromium: str, db_engine: AsyncEngine
) -> None:
    stack = signed_dev_agent
    stack.agent.script(FIND, FOUND)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        alice = await browser.new_page(viewport={"width": 1280, "height": 900})
        await chat_log_in(alice, stack.url, "alice")
        workflow_id = await ask(alice, "find jane for me")
        stack.agent.track(workflow_id)
        await alice.locator("#log li.assistant", has_text="Jane Doe is a new lead").wait_for(timeout=30_000)
        bar = alice.get_by_label("Rate the reply of turn 1")
        await bar.get_by_label("Comment on the reply of turn 1").fill("I meant the globex Jane")
        await bar.get_by_role("button", name="Not helpful").click()
        await bar.locator(".rated", has_text="Rated not helpful: I meant the globex Jane").wait_for()
        assert await bar.get_by_role("button", name="Not helpful").get_attribute("aria-pressed") == "true"
        await alice.screenshot(path=ARTIFACTS / "chat-rated.png", full_page=True)
        await bar.get_by_label("Comment on the reply of turn 1").fill("")
        await bar.get_by_role("button", name="Helpful", exact=True).click()
        await bar.locator(".rated", has_text="Rated helpful").wait_for()

        await alice.reload()
        await alice.locator(f"#conversations button[data-id='{workflow_id}']").click()
        again = alice.get_by_label("Rate the reply of turn 1")
        await again.locator(".rated", has_text="Rated helpful").wait_for(timeout=30_000)
        assert (
            await again.get_by_role("button", name="Helpful", exact=True).get_attribute("aria-pressed")
            == "true"
        )
        assert await again.get_by_role("button", name="Not helpful").get_attribute("aria-pressed") == "false"
        await browser.close()
    async with db_engine.connect() as conn:
        held = list(await conn.execute(select(ReplyRating).where(ReplyRating.workflow_id == workflow_id)))
    assert [(r.turn, r.rating, r.comment, r.user_id, r.rated_via) for r in held] == [
        (1, "helpful", None, "alice", "session")
    ], held
