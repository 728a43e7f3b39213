"""The chat page in headless Chromium (Playwright driving Debian's chromium) against the dev server,
with the worker in APPROVER_AUTH=signed mode: alice logs in at /chat, asks for something a reviewer
must approve, watches the reply arrive in parts, sees the call wait for bob (and its countdown);
bob approves in the inbox; alice's page shows "approved by bob" and the reply, without a reload.
And: the agent asks alice a question, she answers in the page. Screenshots in test-artifacts/
(docs/chat.png is the tutorial's)."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright

from countersign.cli.ux import relative
from countersign.runtime.config import PROJECT_ROOT
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE

pytestmark = pytest.mark.devserver

ASKED = "Let me mark Jane Doe as qualified for you; a reviewer has to agree first."
DONE = "Jane Doe is now qualified."
REVIEWED: list[dict[str, Any]] = [
    {
        "when": {"user_contains": "qualify"},
        "reply": {
            "content": ASKED,
            "tool_calls": [
                {
                    "name": "update_lead_status",
                    "arguments": {"lead": JANE, "new_status": "qualified", "reason": "budget confirmed"},
                }
            ],
        },
    },
    {"when": {"after_tool": "update_lead_status"}, "reply": {"content": DONE}},
]
# Every change of the page's reply text, recorded by the page itself as it happens.
WATCH_REPLIES = """() => {
  window.replyTexts = [];
  window.notReloaded = true;
  new MutationObserver(() => {
    const reply = document.querySelector('#log li.assistant');
    if (reply) window.replyTexts.push(reply.textContent);
  }).observe(document.querySelector('#log'), {subtree: true, childList: true, characterData: true});
}"""


async def chat_log_in(page: Page, url: str, user: str) -> None:
    """Through the chat page's login form, keyboard only (Enter submits); seeded password."""
    await page.goto(url + "/chat")
    await page.get_by_label("Tenant").fill("acme")
    await page.get_by_label("User").fill(user)
    await page.get_by_label("Password").fill(f"{user}-dev")
    await page.keyboard.press("Enter")
    await page.wait_for_selector("#whoami")
    await page.wait_for_selector("#agent option[value='lead-qualifier']", state="attached")


async def ask(page: Page, text: str) -> str:
    """Start a conversation with lead-qualifier from the page; its workflow id."""
    await page.get_by_label("Agent").select_option("lead-qualifier")
    await page.get_by_label("Message").fill(text)
    await page.keyboard.press("Enter")
    current = page.locator("#conversations button[aria-current='true']")
    await current.wait_for(timeout=15_000)
    return str(await current.get_attribute("data-id"))


async def test_alice_watches_her_request_stream_wait_for_bob_and_finish(
    signed_dev_agent: SignedStack, chromium: str, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(*REVIEWED)
    stack.agent.model.chunk_delay_s = 0.1  # the reply arrives a couple of words at a time
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        alice = await browser.new_page(viewport={"width": 1280, "height": 900})
        await chat_log_in(alice, stack.url, "alice")
        await alice.evaluate(WATCH_REPLIES)
        workflow_id = await ask(alice, "please qualify jane")
        stack.agent.track(workflow_id)

        step = alice.locator('#log li.step[data-call="c1"]')
        await step.locator(".outcome:has-text('Waiting for a reviewer')").wait_for(timeout=30_000)
        outcome = await step.locator(".outcome").text_content() or ""
        assert "bob" in outcome and re.search(r"expires in \d+ h( \d+ min)?$", outcome), outcome
        # one countdown format: the pages' (dom.js, the inbox's too) is the CLI's, to the second
        offsets = [0, 12, 59, 61, 600, 3599, 3600, 3660, 86399, 90061, -240, -7200]
        base = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
        shown = await alice.evaluate(
            "([now, offsets]) => offsets.map((o) =>"
            " relativeTime(new Date(now + o * 1000).toISOString(), now))",
            [base.timestamp() * 1000, offsets],
        )
        assert shown == [relative((base + timedelta(seconds=o)).isoformat(), base) for o in offsets]
        # issue 34: the step shows what bob decides on, resolved, above the model's arguments
        effect = await step.locator(".effect-summary").text_content() or ""
        assert effect == "Jane Doe, Doe Consulting (jane.doe@example.com): status new → qualified"
        # high risk: alice (sales) may not decide it, so the step links to its card in the inbox
        assert await step.locator("a.to-inbox").get_attribute("href") == f"/#{workflow_id}/c1"
        assert await step.locator("form.decide").count() == 0
        seen = await alice.evaluate("window.replyTexts")
        parts = [t for t in dict.fromkeys(seen) if t]
        full = f"[scripted model] {ASKED}"
        assert len(parts) >= 3 and parts[-1] == full, parts
        assert all(full.startswith(t) for t in parts), "each part extends the text, never mixes"
        await alice.screenshot(path=ARTIFACTS / "chat-waiting.png", full_page=True)

        bob = await browser.new_page(viewport={"width": 1280, "height": 900})
        await log_in(bob, stack.url, "bob")
        card = bob.locator(f'li[data-key="{workflow_id}/c1"]')
        await card.wait_for(timeout=15_000)
        await card.get_by_role("button", name="Approve", exact=True).click()
        await card.wait_for(state="detached", timeout=15_000)

        await step.locator(".outcome:has-text('approved by bob')").wait_for(timeout=15_000)
        reply = alice.locator("#log li.assistant", has_text=DONE)
        await reply.wait_for(timeout=30_000)
        assert await reply.text_content() == f"[scripted model] {DONE}"
        assert await alice.evaluate("window.notReloaded") is True
        assert "done" in (await step.locator(".outcome").text_content() or "")
        await alice.wait_for_selector("#state:has-text('Turn 1 done')")
        await alice.screenshot(path=ARTIFACTS / "chat-approved.png", full_page=True)
        if os.environ.get("WALKTHROUGH_RECORD") == "1":  # the tutorial's picture, re-taken on request only
            await alice.screenshot(path=PROJECT_ROOT / "docs" / "chat.png", full_page=True)
        await browser.close()


async def test_alice_answers_the_agents_question_in_the_page(
    signed_dev_agent: SignedStack, chromium: str
) -> None:
    stack = signed_dev_agent
    stack.agent.script(
        {
            "when": {"user_contains": "follow up"},
            "reply": {
                "tool_calls": [{"name": "ask_human", "arguments": {"question": "Which Jane do you mean?"}}]
            },
        },
        {
            "when": {"after_tool": "ask_human", "result_contains": "acme"},
            "reply": {"content": "Thanks: Jane at acme."},
        },
    )
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        alice = await browser.new_page(viewport={"width": 1280, "height": 900})
        await chat_log_in(alice, stack.url, "alice")
        await alice.evaluate(WATCH_REPLIES)
        stack.agent.track(await ask(alice, "please follow up with jane"))
        answer = alice.get_by_label("Which Jane do you mean?")
        await answer.wait_for(timeout=30_000)
        assert await answer.evaluate("node => node === document.activeElement"), (
            "the question takes the focus"
        )
        await alice.screenshot(path=ARTIFACTS / "chat-question.png", full_page=True)
        await answer.fill("Jane Doe, the acme lead")
        await alice.keyboard.press("Enter")
        await alice.locator("#log li.assistant", has_text="Thanks: Jane at acme.").wait_for(timeout=30_000)
        await alice.locator("#log .note", has_text="You answered: Jane Doe, the acme lead").wait_for()
        assert "done" in (await alice.locator('#log li.step[data-call="c1"] .outcome').text_content() or "")
        assert await alice.evaluate("window.notReloaded") is True
        await alice.screenshot(path=ARTIFACTS / "chat-answered.png", full_page=True)
        await browser.close()
