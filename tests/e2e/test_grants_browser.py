"""Grants on the inbox page in headless Chromium (Playwright driving Debian's chromium) against the
dev server, the worker in APPROVER_AUTH=signed mode: bob approves alice's call with a grant, sees it
listed, alice's identical call runs without anyone asked; bob revokes it on the page and her next
identical call waits for him again. Screenshots in test-artifacts/."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import async_playwright
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import session_factory
from countersign.db.schema import Grant
from tests.e2e.test_grants import SCRIPT, ran_and_jane_is_new_again, ran_unasked
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import SignedStack

pytestmark = pytest.mark.devserver


async def test_bob_grants_the_same_again_and_revokes_it_on_the_page(
    signed_dev_agent: SignedStack,
    db_engine: AsyncEngine,
    chromium: str,
    jane_is_new: None,
    no_grants_left: None,
) -> None:
    stack = signed_dev_agent
    stack.agent.script(*SCRIPT)
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 1200})
        page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
        await log_in(page, stack.url, "bob")
        await page.wait_for_function("() => document.querySelector('#live').textContent.startsWith('live')")

        handle = await stack.agent.start("qualify jane", single_turn=True)
        card = page.locator(f'li[data-key="{handle.id}/c1"]')
        await card.wait_for(timeout=15_000)
        await card.get_by_label("Grant minutes").fill("30")
        await card.get_by_label("Grant uses").fill("2")
        await card.get_by_role("button", name="Approve and grant the same again").click()
        await card.wait_for(state="detached", timeout=15_000)
        async with session_factory(db_engine)() as session:
            grant_id = await session.scalar(select(Grant.id).where(Grant.workflow_id == handle.id))
        row = page.locator(f'#grants tbody tr[data-grant="{grant_id}"]')  # the session's others listed too
        await row.wait_for(timeout=15_000)
        assert "2 of 2" in (await row.text_content() or "")
        assert await row.locator(".state").text_content() == "live"
        await page.screenshot(path=ARTIFACTS / "inbox-grant.png", full_page=True)

        await ran_and_jane_is_new_again(stack, db_engine, handle.id)  # the approved change is possible again
        used = await ran_unasked(stack, db_engine, "qualify jane again")  # nobody asked
        assert used.approved_by == "bob" and used.grant_id == grant_id

        await page.reload()
        await row.wait_for(timeout=15_000)
        assert "1 of 2" in (await row.text_content() or "")
        await row.get_by_role("button", name="Revoke").click()
        await row.locator(".state", has_text="revoked by bob").wait_for(timeout=15_000)
        assert await row.get_by_role("button", name="Revoke").count() == 0
        await page.screenshot(path=ARTIFACTS / "inbox-grant-revoked.png", full_page=True)

        await ran_and_jane_is_new_again(stack, db_engine, used.workflow_id)  # revoked, not the content
        again = await stack.agent.start("qualify jane", single_turn=True)
        await page.locator(f'li[data-key="{again.id}/c1"]').wait_for(timeout=15_000)  # asked again
        await browser.close()
