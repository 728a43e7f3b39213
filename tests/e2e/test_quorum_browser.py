"""A policy's quorum on the inbox card in headless Chromium against the dev server (APPROVER_AUTH=
signed): alice's call needs two distinct approvers; carol's card says how far it is ("0 of 2",
then "1 of 2 approved (bob)" once bob approved), and her approval on the page is the second, which
runs the call. Screenshot in test-artifacts/."""

from __future__ import annotations

import pytest
from playwright.async_api import async_playwright
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.test_asked_again import card
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.approvals import ECHO_RESULT, lead_status, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import ApplyPolicies

pytestmark = pytest.mark.devserver
TWO = '@id("two-for-status") @approvals("2") permit(principal, action == Countersign::Action::"update_lead_status", resource);'  # noqa: E501


async def test_the_card_shows_the_quorum_and_the_second_approval_runs_the_call(
    signed_dev_agent: SignedStack,
    db_engine: AsyncEngine,
    chromium: str,
    jane_is_new: None,
    policies: ApplyPolicies,
) -> None:
    stack = signed_dev_agent
    await policies(TWO)
    stack.agent.script(qualify(), ECHO_RESULT)
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 1100})
        await log_in(page, stack.url, "carol")
        handle = await stack.agent.start("qualify jane", user="alice", single_turn=True)
        bob = await stack.login("bob")
        item = await card(stack, bob, handle.id)
        listed = page.locator(f'li[data-key="{handle.id}/{item["call_id"]}"]')
        await listed.wait_for(timeout=15_000)
        quorum = listed.locator(".quorum")
        await quorum.wait_for(timeout=15_000)
        assert "Needs 2 distinct approvers (policy two-for-status)" in (await quorum.text_content() or "")
        assert (await quorum.text_content() or "").endswith("0 of 2 approved")

        path = f"/api/approvals/{handle.id}/{item['call_id']}"
        status, body = await stack.call("POST", path, bob, {"decision": "approve"})
        assert status == 200 and body["state"] == "pending", body
        assert body["outcome"] == "1 of 2 approved (bob); 1 more approval needed", body  # never "by None"
        # a quorum's card offers no grant that would fail: it says why there is none
        assert await listed.get_by_role("button", name="Approve and grant the same again").count() == 0
        assert "No grant: this call needs 2 distinct approvers" in (await listed.text_content() or "")
        # live, without a reload: the open stream tells the page
        await listed.locator(".quorum", has_text="1 of 2 approved (bob)").wait_for(timeout=15_000)
        assert await lead_status(db_engine, "acme") == "new", "one approval of two runs nothing"
        await page.screenshot(path=ARTIFACTS / "inbox-quorum.png", full_page=True)

        await listed.get_by_role("button", name="Approve", exact=True).click()
        await listed.wait_for(state="detached", timeout=15_000)
        await handle.result()
        assert await lead_status(db_engine, "acme") == "qualified"
        await browser.close()
