"""The policies page in headless Chromium against the dev server (APPROVER_AUTH=signed), under the
strict Content-Security-Policy: carol (acme's admin) validates a set with a typo and is told why,
applies a valid one as the shadow set, sees the calls it would decide otherwise, then enforces it;
every attempt is listed. alice has no link to the page and it refuses her."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from playwright.async_api import async_playwright
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ShadowDifference, TenantPolicy
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_pages_browser import carol_on, go_by_link
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import SignedStack

pytestmark = pytest.mark.devserver

STATUS = 'permit(principal, action == Countersign::Action::"update_lead_status", resource);'
TYPO = f'@id("two") @approval("2") {STATUS}'
SET = f'@id("two-for-status") @approvals("2") {STATUS}'
MARKER = "policies-page-test"


@pytest_asyncio.fixture
async def acme_without_policies(db_engine: AsyncEngine) -> AsyncIterator[None]:
    yield
    async with db_engine.begin() as conn:
        await conn.execute(delete(TenantPolicy).where(TenantPolicy.tenant_id == "acme"))
        await conn.execute(delete(ShadowDifference).where(ShadowDifference.workflow_id == MARKER))


async def test_carol_validates_shadows_and_enforces_a_set_and_alice_cannot_reach_it(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, acme_without_policies: None
) -> None:
    stack = signed_dev_agent
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        carol, violations = await carol_on(browser, stack.url, "Policies")
        await carol.locator("#enforced-version", has_text="Enforced: none").wait_for()

        await carol.get_by_label("Policy set").fill(TYPO)
        await carol.get_by_role("button", name="Validate").click()
        await carol.locator("#refusal", has_text="unknown annotation @approval").wait_for()

        await carol.get_by_label("Policy set").fill(SET)
        await carol.get_by_role("button", name="Validate").click()
        await carol.locator("#status", has_text="Valid").wait_for()
        await carol.get_by_role("button", name="Apply as shadow").click()
        await carol.locator("#status", has_text="Applied as the shadow set").wait_for()
        await carol.locator("#shadow-version", has_text="applied by carol").wait_for()
        async with db_engine.connect() as conn:
            shadow = await conn.scalar(
                select(TenantPolicy.text).where(
                    TenantPolicy.tenant_id == "acme", TenantPolicy.mode == "shadow"
                )
            )
        assert shadow == SET

        # what the gate records for a call the shadow set decides otherwise (test_policy_gate.py)
        async with db_engine.begin() as conn:
            await conn.execute(
                insert(ShadowDifference).values(
                    tenant_id="acme", shadow_version=1, workflow_id=MARKER, call_id="c1",
                    tool="update_lead_status", requested_by="alice", enforced={"outcome": "no_match"},
                    shadow={"outcome": "permit_approvals", "policy": "two-for-status", "approvals": 2},
                )
            )  # fmt: skip
        await carol.reload()
        row = carol.locator("#differences tbody tr", has_text="update_lead_status").first
        await row.wait_for()
        cells = [(await c.text_content() or "").strip() for c in await row.locator("td").all()]
        assert cells[1:] == ["update_lead_status", "alice", "tiers", "2 approvers by two-for-status"], cells

        assert await carol.get_by_label("Policy set").input_value() == SET  # the shadow set, to enforce
        await go_by_link(carol, "Inbox")  # the inbox tells admins before they enforce it
        told = await carol.text_content("#shadow-differences") or ""
        # other tests of the same database may have left differences of a version 1 too
        assert re.search(r"shadow policy set \(version 1\) would have\s+decided [1-9]\d* call", told), told
        await go_by_link(carol, "Policies")
        await carol.locator("#differences tbody tr").first.wait_for()  # drawn after the editor is filled
        assert await carol.get_by_label("Policy set").input_value() == SET
        await carol.get_by_role("button", name="Apply", exact=True).click()
        await carol.locator("#status", has_text="Applied as the enforced set").wait_for()
        # the list is redrawn after the status: wait for this apply's row, then it must be the newest
        await carol.locator("#policy-changes tbody tr", has_text="carol (inbox)").first.wait_for()
        applied = carol.locator("#policy-changes tbody tr").first
        cells = [(await c.text_content() or "").strip() for c in await applied.locator("td").all()]
        assert cells[2:] == ["carol (inbox)", "applied"], cells
        await carol.locator("#enforced-version", has_text="applied by carol").wait_for()
        await carol.screenshot(path=ARTIFACTS / "policies.png", full_page=True)

        alice = await browser.new_page(viewport={"width": 1280, "height": 700})
        await log_in(alice, stack.url, "alice")
        pages = alice.get_by_role("navigation", name="Pages")
        assert await pages.get_by_role("link", name="Policies").count() == 0
        response = await alice.goto(stack.url + "/policies")
        assert response is not None and response.status == 403
        assert "Only an admin of acme" in (await alice.text_content("#refused") or "")
        assert violations == []
        await browser.close()
