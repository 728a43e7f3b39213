"""The pages beside the inbox, and deciding in the chat, in headless Chromium (Playwright driving
Debian's chromium) against the dev server with the worker in APPROVER_AUTH=signed mode:

- alice (sales) asks lead-qualifier to draft an email; draft_email is low risk and waits for a
  decision she may give, so she approves it in the chat page; the conversation list names the
  conversation by her first message;
- she goes to her drafts by the header's link (keyboard only), edits the draft, sends it through
  the chat ("Send it": send_draft, high risk, waits for another reviewer, and the step links to its
  card in the inbox), sees a refusal (409) spelled out when the draft was sent meanwhile, and
  resolves a notification;
- carol (admin) changes a tier on the tools page and sees it in the history; alice has no link
  to it and the page refuses her.

Every page is served with a strict Content-Security-Policy here (scripts and styles from /static
only), and the browser reports no violation.

Screenshots in test-artifacts/; WALKTHROUGH_RECORD=1 also writes the documentation's in docs/."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, Route, async_playwright
from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import session_factory
from countersign.db.schema import EmailDraft, Notification, TenantToolTier, TierChange
from countersign.runtime.config import PROJECT_ROOT
from tests.e2e.test_chat_browser import chat_log_in
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE
from tools.tiers import change_tenant_tier

pytestmark = pytest.mark.devserver

ASK = "Please draft a short follow-up email to Jane Doe about the revised quote"
DRAFTED = "The draft is saved: nothing was sent."
SUBJECT = "Your revised quote"
DRAFT = {
    "to": JANE,
    "lead": JANE,
    "subject": SUBJECT,
    "body": "Hi Jane,\n\nthe revised quote for 40 seats is attached. Shall we talk on Thursday?\n\nAlice",
}


def picture(page_name: str) -> Path | None:
    """Where the documentation's screenshot of a page goes, when they are being re-taken
    (WALKTHROUGH_RECORD=1)."""
    return PROJECT_ROOT / "docs" / page_name if os.environ.get("WALKTHROUGH_RECORD") == "1" else None


async def shoot(page: Page, name: str) -> None:
    await page.screenshot(path=ARTIFACTS / name, full_page=True)
    if (docs := picture(name)) is not None:
        await page.screenshot(path=docs, full_page=True)


# What the pages must run under (no inline script, style or handler: every file from /static), put
# on each page the browser loads; the browser reports every violation on the console.
# No horizontal overflow: the page is no wider than the window.
FITS = "() => document.documentElement.scrollWidth <= window.innerWidth"
STRICT_CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; object-src 'none'"


async def under_strict_csp(page: Page) -> list[str]:
    """Serve `page`'s documents with STRICT_CSP; the list fills with the violations reported."""
    violations: list[str] = []

    async def with_policy(route: Route) -> None:
        response = await route.fetch()
        await route.fulfill(
            response=response, headers={**response.headers, "content-security-policy": STRICT_CSP}
        )

    await page.route(
        lambda url: True,
        lambda route: with_policy(route) if route.request.resource_type == "document" else route.continue_(),
    )
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    return violations


async def go_by_link(page: Page, name: str) -> None:
    """Open a page through the header's link by keyboard: focus it, press Enter."""
    await page.get_by_role("navigation", name="Pages").get_by_role("link", name=name).focus()
    async with page.expect_navigation():
        await page.keyboard.press("Enter")


async def carol_on(browser: Browser, url: str, link: str) -> tuple[Page, list[str]]:
    """carol, acme's admin, on the admin page `link` opens (from the inbox's header), at desktop
    width under STRICT_CSP: her page and the list of violations it reports."""
    carol = await browser.new_page(viewport={"width": 1280, "height": 1100})
    violations = await under_strict_csp(carol)
    await log_in(carol, url, "carol")
    await go_by_link(carol, link)
    return carol, violations


@pytest_asyncio.fixture
async def alices_drafts_and_notes(db_engine: AsyncEngine) -> AsyncIterator[int]:
    """acme's admin has made lead-qualifier's draft_email (low risk) wait for a decision; alice has
    an open notification (its id). Afterwards her test drafts, the tier and the notification are gone."""
    async with session_factory(db_engine).begin() as session:
        await change_tenant_tier(
            session, tenant_id="acme", agent="lead-qualifier", tool="draft_email", tier="needs_approval",
            changed_by="carol", via="cli",
        )  # fmt: skip
    async with db_engine.begin() as conn:
        inserted = insert(Notification).values(
            tenant_id="acme", user_id="alice", kind="meeting_proposal",
            message="Jane Doe proposes Thursday 10:00 for the quote review",
        )  # fmt: skip
        note: int = (await conn.execute(inserted.returning(Notification.id))).scalar_one()
    yield note
    async with db_engine.begin() as conn:
        await conn.execute(delete(Notification).where(Notification.id == note))
        drafting = (TenantToolTier.agent == "lead-qualifier") & (TenantToolTier.tool == "draft_email")
        await conn.execute(delete(TenantToolTier).where(TenantToolTier.tenant_id == "acme", drafting))
        await conn.execute(
            delete(EmailDraft).where(EmailDraft.tenant_id == "acme", EmailDraft.to_address == JANE)
        )


async def test_alice_approves_her_draft_in_the_chat_then_edits_it_and_resolves_a_notification(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, alices_drafts_and_notes: int
) -> None:
    stack = signed_dev_agent
    stack.agent.script(
        {
            "when": {"user_contains": "draft"},
            "reply": {"tool_calls": [{"name": "draft_email", "arguments": DRAFT}]},
        },
        {"when": {"after_tool": "draft_email"}, "reply": {"content": DRAFTED}},
    )
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        alice = await browser.new_page(viewport={"width": 1280, "height": 900})
        violations = await under_strict_csp(alice)
        await chat_log_in(alice, stack.url, "alice")
        await alice.get_by_label("Agent").select_option("lead-qualifier")
        await alice.get_by_label("Message").fill(ASK)
        await alice.keyboard.press("Enter")
        current = alice.locator("#conversations button[aria-current='true']")
        await current.wait_for(timeout=15_000)
        stack.agent.track(str(await current.get_attribute("data-id")))

        step = alice.locator('#log li.step[data-call="c1"]')
        decide = step.get_by_role("form", name="Decide draft_email c1")
        await decide.wait_for(timeout=30_000)  # low risk: alice (sales) may decide it herself
        assert await step.locator("a.to-inbox").count() == 0
        await alice.reload()  # the list names the conversation by its first message, from the server
        await alice.locator("#conversations button", has_text=ASK).click()
        await decide.wait_for(timeout=15_000)
        await shoot(alice, "chat-decide.png")
        await decide.get_by_label("Reason").fill("")
        await decide.get_by_role("button", name="Reject").click()  # a rejection needs a reason
        assert "give a reason" in (await decide.get_by_role("alert").text_content() or "")
        await decide.get_by_role("button", name="Approve").focus()
        await alice.keyboard.press("Enter")
        await step.locator(".outcome:has-text('approved by alice')").wait_for(timeout=15_000)
        await alice.locator("#log li.assistant", has_text=DRAFTED).wait_for(timeout=30_000)
        assert await step.get_by_role("form").count() == 0

        await go_by_link(alice, "Drafts and notifications")
        assert alice.url.endswith("/drafts")
        note = alice.locator(f'#notifications li[data-id="{alices_drafts_and_notes}"]')
        await note.wait_for()
        card = alice.locator("#drafts li.draft", has_text=SUBJECT)
        await card.wait_for()
        await card.locator("summary").focus()
        await alice.keyboard.press("Enter")  # opens it: read in full, ready to edit
        await card.get_by_label("Subject").wait_for()
        assert await card.get_by_label("Body").input_value() == DRAFT["body"]
        await card.get_by_label("Subject").fill("Your revised quote for 40 seats")
        await card.get_by_role("button", name="Save draft").click()
        await card.locator("h3", has_text="for 40 seats").wait_for()
        draft_id = int(str(await card.get_attribute("data-id")))
        async with db_engine.connect() as conn:
            saved = (await conn.execute(select(EmailDraft).where(EmailDraft.id == draft_id))).one()
        assert saved.subject == "Your revised quote for 40 seats" and saved.created_by == "alice"
        await shoot(alice, "drafts.png")

        # "Send it": the chat, with lead-qualifier and the request ready; send_draft waits for bob
        stack.agent.script(
            {"when": {"user_contains": "send draft"},
             "reply": {"tool_calls": [{"name": "send_draft", "arguments": {"draft": draft_id}}]}},
        )  # fmt: skip
        await card.get_by_role("link", name="Send it").focus()
        async with alice.expect_navigation():
            await alice.keyboard.press("Enter")
        await alice.wait_for_selector("#agent option[value='lead-qualifier']", state="attached")
        await alice.locator("#status", has_text="Ready to send").wait_for()
        assert await alice.get_by_label("Agent").input_value() == "lead-qualifier"
        assert (await alice.get_by_label("Message").input_value()).startswith(
            f"Please send draft {draft_id} "
        )
        await alice.keyboard.press("Enter")  # the message box has the focus
        await current.wait_for(timeout=15_000)
        stack.agent.track(str(await current.get_attribute("data-id")))
        sending = alice.locator('#log li.step[data-call="c1"]')
        await sending.locator(".outcome:has-text('Waiting for a reviewer')").wait_for(timeout=30_000)
        assert "alice" not in (await sending.locator(".outcome").text_content() or "")  # four eyes
        to_inbox = sending.get_by_role("link", name="Its card in the inbox")
        assert (await to_inbox.get_attribute("href") or "").endswith("/c1")
        assert await sending.locator("form.decide").count() == 0
        # the list tells conversations apart: first words, then state now, when and agent (issue 50)
        first = alice.locator("#conversations button", has_text=ASK).locator(".listed-state")
        said = await first.text_content() or ""
        assert said.startswith("open · ") and said.endswith(" · lead-qualifier"), said
        assert str(datetime.now(UTC).year) in said, said
        assert (
            await alice.locator("#conversations button", has_text=f"Please send draft {draft_id}").count()
            == 1
        )
        # on a phone the message box comes before the list, and a new conversation's is in sight as
        # the page opens, however many conversations are listed (issue 50)
        await alice.get_by_role("button", name="New conversation").click()
        for width in (390, 1280):
            await alice.set_viewport_size({"width": width, "height": 844})
            await alice.evaluate("() => window.scrollTo(0, 0)")
            await alice.screenshot(path=ARTIFACTS / f"chat-list-{width}.png", full_page=True)
            assert await alice.evaluate(FITS), f"/chat is wider than the window at {width} px"
            box = await alice.get_by_label("Message").bounding_box()
            listed = await alice.locator("#conversations").bounding_box()
            assert box is not None and listed is not None
            if width == 390:  # one column: the message box above the list
                assert box["y"] + box["height"] <= listed["y"], (box, listed)
            assert box["y"] + box["height"] <= 844, f"the message box is out of sight at {width} px: {box}"
        await alice.set_viewport_size({"width": 1280, "height": 900})

        await go_by_link(alice, "Drafts and notifications")
        await card.locator("summary").click()
        await card.get_by_label("Body").wait_for()
        async with db_engine.begin() as conn:  # sent meanwhile (as send_draft would): edits refused
            await conn.execute(update(EmailDraft).where(EmailDraft.id == draft_id).values(sent_outbox_id=1))
        await card.get_by_label("Body").fill("Hi Jane, one more thing.")
        await card.get_by_role("button", name="Save draft").click()
        refusal = card.locator(".refusal")
        await refusal.locator("text=Cannot be edited now").wait_for()
        assert "already sent" in (await refusal.text_content() or "")
        await card.locator(
            "text=Sent (email 1): it can no longer be edited."
        ).wait_for()  # shown as it is now
        assert await card.get_by_role("button", name="Save draft").count() == 0
        await shoot(alice, "drafts-refused.png")

        await note.get_by_role("button", name="Resolve").focus()
        await alice.keyboard.press("Enter")
        await note.wait_for(state="detached")
        await alice.get_by_label("Show").first.select_option("resolved")
        await alice.locator(
            f'#notifications li[data-id="{alices_drafts_and_notes}"]', has_text="resolved by alice"
        ).wait_for()
        async with db_engine.connect() as conn:
            resolved = (
                await conn.execute(select(Notification).where(Notification.id == alices_drafts_and_notes))
            ).one()
        assert resolved.status == "resolved" and resolved.resolved_by == "alice"
        assert violations == []
        await browser.close()


@pytest_asyncio.fixture
async def acme_tiers_restored(db_engine: AsyncEngine) -> AsyncIterator[None]:
    yield
    async with db_engine.begin() as conn:
        where = (TenantToolTier.tenant_id == "acme") & (TenantToolTier.agent == "lead-qualifier")
        await conn.execute(delete(TenantToolTier).where(where))


async def test_carol_changes_a_tier_on_the_tools_page_and_alice_cannot_reach_it(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, acme_tiers_restored: None
) -> None:
    stack = signed_dev_agent
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        carol, violations = await carol_on(browser, stack.url, "Tools")
        await carol.get_by_label("Agent", exact=True).select_option("lead-qualifier")
        row = carol.locator('#tools tr[data-tool="search_leads"]')
        await row.wait_for()
        cells = [(await c.text_content() or "").strip() for c in await row.locator("td").all()]
        assert cells[:3] == ["low", "read", "no"], cells  # risk, category, can be undone
        high = carol.get_by_label("Tier of update_lead_status")
        assert await high.locator("option[value='always_allow']").is_disabled()  # never for high risk
        undoable = carol.locator('#tools tr[data-tool="update_lead_status"] td').nth(2)
        assert (await undoable.text_content() or "").strip() == "yes"

        await carol.get_by_label("Tier of search_leads").focus()
        await carol.get_by_label("Tier of search_leads").select_option("needs_approval")
        assert "1 change(s) not saved" in (await carol.text_content("#unsaved") or "")
        await carol.get_by_role("button", name="Save tiers").focus()
        await carol.keyboard.press("Enter")
        await carol.locator("#status", has_text="Saved 1 change(s)").wait_for()
        # other tests of the same database change search_leads too: find this change by its new tier
        change = (
            carol.locator("#changes tbody tr", has_text="search_leads")
            .filter(has_text="needs approval")
            .first
        )
        await change.wait_for()
        cells = [(await c.text_content() or "").strip() for c in await change.locator("td").all()]
        assert cells[2:] == ["always allow", "needs approval", "carol (inbox)", "changed"], cells
        async with db_engine.connect() as conn:
            tier = await conn.scalar(
                select(TenantToolTier.tier).where(
                    TenantToolTier.tenant_id == "acme", TenantToolTier.agent == "lead-qualifier",
                    TenantToolTier.tool == "search_leads",
                )
            )  # fmt: skip
            recorded = await conn.scalar(
                select(TierChange.changed_by)
                .where(TierChange.tool == "search_leads")
                .order_by(TierChange.id.desc())
            )
        assert tier == "needs_approval" and recorded == "carol"
        await shoot(carol, "tools.png")
        # on a phone too: nothing wider than the window, and each tier's select readable (issue 50)
        for width in (390, 1280):
            await carol.set_viewport_size({"width": width, "height": 900})
            await carol.screenshot(path=ARTIFACTS / f"tools-{width}.png", full_page=True)
            assert await carol.evaluate(FITS), f"/tools is wider than the window at {width} px"
            tier_box = await carol.get_by_label("Tier of search_leads").bounding_box()
            assert tier_box is not None and tier_box["width"] >= 150, (width, tier_box)

        alice = await browser.new_page(viewport={"width": 1280, "height": 700})
        await log_in(alice, stack.url, "alice")
        assert (
            await alice.get_by_role("navigation", name="Pages").get_by_role("link", name="Tools").count() == 0
        )
        response = await alice.goto(stack.url + "/tools")
        assert response is not None and response.status == 403
        assert "Only an admin of acme" in (await alice.text_content("#refused") or "")
        assert violations == []
        await browser.close()


async def test_an_earlier_agents_tools_arriving_last_do_not_replace_the_chosen_agents(
    signed_dev_agent: SignedStack, chromium: str
) -> None:
    """The page loads the first agent's tools as it opens; carol picks lead-qualifier before they
    arrive. The older answer, arriving last, must not fill the table (she would then save one
    agent's tiers while reading another's). Each other agent's lists are held back 2 s here."""
    stack = signed_dev_agent
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        carol = await browser.new_page(viewport={"width": 1280, "height": 1100})
        await log_in(carol, stack.url, "carol")

        async def later(route: Route) -> None:
            await asyncio.sleep(2)
            await route.continue_()

        await carol.route(
            lambda url: "/api/agents/" in url and "/api/agents/lead-qualifier/" not in url,
            later,
        )
        await go_by_link(carol, "Tools")
        await carol.get_by_label("Agent", exact=True).select_option("lead-qualifier")
        await carol.locator('#tools tr[data-tool="search_leads"]').wait_for()
        await asyncio.sleep(3)  # the first agent's answers have arrived by now
        assert await carol.locator('#tools tr[data-tool="search_leads"]').count() == 1
        assert await carol.locator('#tools tr[data-tool="update_lead_status"]').count() == 1
        await browser.close()
