"""What the requester is told, and pages that fit the window (issue 41), in headless Chromium
(Playwright driving Debian's chromium) against the dev server, APPROVER_AUTH=signed:

- alice asks lead-qualifier to look Jane up and qualify her; the search step shows its result
  (what the agent read) and offers no Undo (a read); bob approves the status change with an edit
  (`contacted`, not `qualified`) and a reason, and alice's step says that bob changed it, from what
  to what, and why, without a reload; the change offers Undo;
- undoing the whole conversation and ending it ask first: dismissed, nothing happens; accepted,
  the undo runs (its step says how it ended and why) and the conversation ends, after which
  nothing offers Undo;
- at 1280 and at 390 px, the chat page and the inbox (with a card waiting) scroll no wider than the
  window.

Screenshots in test-artifacts/ (chat-told-*.png, inbox-390.png)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import Dialog, Page, async_playwright

from tests.e2e.test_chat_browser import ask, chat_log_in
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE

pytestmark = pytest.mark.devserver

WIDTHS = (1280, 390)
REASON = "she has only been contacted so far"
LOOKED_UP_AND_QUALIFIED: list[dict[str, Any]] = [
    {
        "when": {"user_contains": "qualify"},
        "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Doe"}}]},
    },
    {
        "when": {"after_tool": "search_leads"},
        "reply": {
            "content": "Found her; a reviewer has to agree to the change.",
            "tool_calls": [
                {
                    "name": "update_lead_status",
                    "arguments": {"lead": JANE, "new_status": "qualified", "reason": "budget confirmed"},
                }
            ],
        },
    },
    {"when": {"after_tool": "update_lead_status"}, "reply": {"content": "Done."}},
]


# The document's scroll width, the window's width (no horizontal scroll when the first is not
# larger), and what reaches past the window, to say what to fix: elements, or their text.
WIDEST = """() => [document.documentElement.scrollWidth, window.innerWidth,
  [...document.querySelectorAll("body *")]
    .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5
      || (e.getBoundingClientRect().left + e.scrollWidth > window.innerWidth + 0.5
          && getComputedStyle(e).overflowX === "visible"))
    .map((e) => `${e.tagName.toLowerCase()}${e.id ? "#" + e.id : ""}.${e.className}`)]"""


async def fits_at_every_width(page: Page, shot: str) -> None:
    for width in WIDTHS:
        await page.set_viewport_size({"width": width, "height": 900})
        await page.wait_for_timeout(100)  # one layout after the resize
        scroll, window, past = await page.evaluate(WIDEST)
        await page.screenshot(path=ARTIFACTS / f"{shot}-{width}.png", full_page=True)
        assert scroll <= window, f"{shot} at {width} px: {scroll} px wide; past the window: {past}"


async def answering(page: Page, accept: bool) -> list[str]:
    """Answer the page's next confirmation (accept or dismiss it); the list fills with its text."""
    asked: list[str] = []

    async def answer(dialog: Dialog) -> None:
        asked.append(dialog.message)
        await (dialog.accept() if accept else dialog.dismiss())

    page.once("dialog", answer)
    return asked


async def test_alice_reads_each_result_and_what_bob_changed_and_why_on_a_page_that_fits(
    signed_dev_agent: SignedStack, chromium: str, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(*LOOKED_UP_AND_QUALIFIED)
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        alice = await browser.new_page(viewport={"width": 1280, "height": 900})
        await chat_log_in(alice, stack.url, "alice")
        # the agent list names agents (their descriptions under it): no option widens the page
        options = await alice.locator("#agent option").all_text_contents()
        assert "lead-qualifier" in options and all(":" not in o for o in options)
        assert await alice.locator("#agent-about").text_content()
        await fits_at_every_width(alice, "chat-told-new")
        await alice.set_viewport_size({"width": 1280, "height": 900})
        # a long word (a link) in the message: the title and the message wrap it, the page stays as wide
        link = "https://crm.example.com/leads/" + "jane-doe-" * 30
        workflow_id = await ask(alice, f"please look Jane up and qualify her: {link}")
        stack.agent.track(workflow_id)

        search = alice.locator('#log li.step[data-call="c1"]')
        change = alice.locator('#log li.step[data-call="c2"]')
        await change.locator(".outcome:has-text('Waiting for a reviewer')").wait_for(timeout=30_000)
        # a step shows what the tool returned: the leads found, by name
        found = await search.locator(".result-summary").text_content() or ""
        assert found.startswith("ok: ") and "Jane Doe" in found, found
        await search.locator(".result summary").click()
        assert JANE in (await search.locator(".result pre").text_content() or "")
        assert await search.locator("button.undo-call").count() == 0, "a read has nothing to undo"

        bob = await browser.new_page(viewport={"width": 390, "height": 900})
        await log_in(bob, stack.url, "bob")
        card = bob.locator(f'li[data-key="{workflow_id}/c2"]')
        await card.wait_for(timeout=15_000)
        await fits_at_every_width(bob, "inbox-told")  # the inbox with a card waiting, phone and desktop
        token = await stack.login("bob")
        edited = {"lead": JANE, "new_status": "contacted", "reason": "budget confirmed"}
        status, body = await stack.call(
            "POST",
            f"/api/approvals/{workflow_id}/c2",
            token,
            {"decision": "approve", "args": edited, "reason": REASON},
        )
        assert status == 200, body

        await alice.locator("#log li.assistant", has_text="Done.").wait_for(timeout=30_000)
        await bob.reload()
        await bob.locator("#history tbody tr", has_text=REASON).wait_for(timeout=15_000)
        await fits_at_every_width(bob, "inbox-told-decided")  # its history: ids, edited JSON, reasons
        review = await change.locator(".review").text_content() or ""
        changed = 'bob changed new_status from "qualified" to "contacted" before approving'
        assert review == f"{changed} (reason: {REASON})"
        # the effect it waited with is the one asked for, no longer the one that runs
        assert await change.locator(".effect.superseded").count() == 1
        told = await change.locator(".result-summary").text_content() or ""
        assert "contacted" in told and REASON in told, told
        assert "approved by bob" in (await change.locator(".outcome").text_content() or "")
        assert await change.locator("button.undo-call").count() == 1
        await fits_at_every_width(alice, "chat-told-done")
        await alice.set_viewport_size({"width": 1280, "height": 900})

        # undoing it all asks first: dismissed, nothing is asked of the server
        asked = await answering(alice, accept=False)
        await alice.get_by_role("button", name="Undo the whole conversation").click()
        assert asked and "Undo everything" in asked[0]
        await alice.wait_for_timeout(500)
        assert not (await alice.locator("#status").text_content() or "").startswith("Undo requested")
        asked = await answering(alice, accept=True)
        await alice.get_by_role("button", name="Undo the whole conversation").click()
        undone = change.locator(".actions .note")
        await undone.wait_for(timeout=30_000)
        reversed_ = "Undo of c2 (update_lead_status): done (its change was reversed)"
        assert await undone.text_content() == reversed_

        asked = await answering(alice, accept=False)
        await alice.get_by_role("button", name="End the conversation").click()
        assert asked and "End this conversation" in asked[0]
        await alice.wait_for_timeout(500)
        assert await alice.locator("#log li.note", has_text="has ended").count() == 0
        asked = await answering(alice, accept=True)
        await alice.get_by_role("button", name="End the conversation").click()
        # at once, not at the stream's next keep-alive (15 s) nor only after a reload (issue 50)
        await alice.locator("#log li.note", has_text="has ended").wait_for(timeout=5_000)
        assert await alice.locator("#log li.note", has_text="has ended").count() == 1
        assert await alice.locator("#undo-bar").is_hidden()
        # opened again from the list (its events from the first): ended, so nothing offers Undo
        await alice.reload()
        await alice.locator(f'#conversations button[data-id="{workflow_id}"]').click()
        await alice.locator("#log li.note", has_text="has ended").wait_for(timeout=30_000)
        assert await alice.locator("#undo-bar").is_hidden()
        assert await alice.locator("button.undo-call").count() == 0
        await alice.screenshot(path=ARTIFACTS / "chat-told-ended.png", full_page=True)
        await browser.close()
