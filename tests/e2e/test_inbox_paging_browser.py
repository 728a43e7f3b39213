"""The inbox page in pages, in headless Chromium: with more calls waiting than a page shows, the
inbox shows the soonest to expire and says how many more wait; "Show more" brings the next cards
in, until none is left. A page of 4 here (the product's is 50), the calls recorded rows of a
tenant of the test's own (tests/server/test_inbox_paging.py); it still fits 390 px and 1280 px."""

from __future__ import annotations

import pytest
from playwright.async_api import Page, async_playwright

from countersign.server import app
from tests.e2e.test_chat_told_browser import fits_at_every_width
from tests.e2e.test_inbox_browser import CHROMIUM_ARGS
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import AuthInbox
from tests.server.test_inbox_paging import REVIEWER, Waiting
from tests.server.test_inbox_paging import waiting as waiting

PAGE = 4


async def shown(page: Page) -> list[str]:
    keys = await page.locator("#pending > li").evaluate_all("(cards) => cards.map((c) => c.dataset.key)")
    return [str(k) for k in keys]


@pytest.mark.parametrize("waiting", [14], indirect=True)  # bob may decide 10 of them
async def test_show_more_brings_the_next_cards_and_the_count_says_how_many_wait(
    auth_inbox: AuthInbox, waiting: Waiting, chromium: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app, "FIRST_PAGE", PAGE)
    order = [waiting.key(r) for r in waiting.decidable_by(REVIEWER)]
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        await page.goto(auth_inbox.url + "/")
        await page.get_by_label("Tenant").fill(waiting.tenant)
        await page.get_by_label("User").fill(REVIEWER)
        await page.get_by_label("Password").fill(f"{REVIEWER}-pw")
        await page.keyboard.press("Enter")
        await page.wait_for_function(f"() => document.querySelectorAll('#pending > li').length === {PAGE}")
        assert await shown(page) == order[:PAGE]
        assert await page.text_content("#more-count") == f"{len(order) - PAGE} more waiting."
        await fits_at_every_width(page, "inbox-paged")

        await page.get_by_role("button", name="Show more").click()
        await page.wait_for_function(
            f"() => document.querySelectorAll('#pending > li').length === {2 * PAGE}"
        )
        assert await shown(page) == order[: 2 * PAGE]
        assert await page.text_content("#more-count") == f"{len(order) - 2 * PAGE} more waiting."

        await page.get_by_role("button", name="Show more").click()
        await page.wait_for_function(
            f"() => document.querySelectorAll('#pending > li').length === {len(order)}"
        )
        assert await shown(page) == order
        assert await page.locator("#more").is_hidden()
        await browser.close()
