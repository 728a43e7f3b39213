"""The inbox page in headless Chromium against the dev server (signed mode): a call whose effect
changed after bob approved it comes back to bob as a new card that says so, with what he approved
then, above what it would do now, and his voided decision stays in the history (issue 34).
Screenshot: test-artifacts/inbox-asked-again.png."""

from __future__ import annotations

import pytest
from playwright.async_api import async_playwright
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import session_factory
from countersign.db.schema import Lead
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.approvals import ECHO_RESULT, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE

pytestmark = pytest.mark.devserver


async def test_bob_is_asked_again_on_his_card_when_the_lead_changed_after_he_approved(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        await log_in(page, stack.url, "bob")
        handle = await stack.agent.start("qualify jane", user="alice", single_turn=True)
        card = page.locator(f'li[data-key="{handle.id}/c1"]')
        await card.wait_for(timeout=15_000)
        assert await card.locator(".asked-again").count() == 0
        async with session_factory(db_engine)() as session, session.begin():  # someone else, meanwhile
            await session.execute(
                update(Lead).where(Lead.tenant_id == "acme", Lead.email == JANE).values(status="disqualified")
            )
        await card.get_by_role("button", name="Approve", exact=True).click()

        again = page.locator(f'li[data-key="{handle.id}/c1"]:has(.asked-again)')
        await again.wait_for(timeout=30_000)
        said = await again.locator(".asked-again").text_content() or ""
        assert "changed after bob approved it" in said and "status new → qualified" in said, said
        assert "disqualified → qualified" in (await again.text_content() or "")
        await page.reload()  # the history as a reviewer opening the inbox now reads it
        again = page.locator(f'li[data-key="{handle.id}/c1"]:has(.asked-again)')
        await again.wait_for(timeout=15_000)
        # this conversation's row: other tests' conversations of acme may have voided decisions too
        history = page.locator("#history tbody tr", has_text=handle.id).filter(has_text="voided")
        await history.wait_for(timeout=15_000)
        assert "bob (proven)" in (await history.text_content() or "")
        await page.screenshot(path=ARTIFACTS / "inbox-asked-again.png", full_page=True)
        await again.get_by_role("button", name="Approve", exact=True).click()
        await again.wait_for(state="detached", timeout=15_000)
        await browser.close()
    await handle.result()
