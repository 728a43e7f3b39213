"""A policy's quorum in headless Chromium against the dev server (APPROVER_AUTH=signed): alice's
call, asked from her chat page, needs two distinct approvers; carol's card says how far it is ("0 of
2", then "1 of 2 approved (bob: his reason)" once bob approved), and her approval on the page is the
second, which runs the call. Everything a person sees of the quorum says the same, every approver's
reason with it (issue 50): alice's step, the reviewers' notice, `approvals list`, and the audit row
of the call, which keeps both approvers' reasons. Screenshots in test-artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import async_playwright
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ToolExecution
from tests.cli.test_grants_cli import runner
from tests.e2e.test_asked_again import card
from tests.e2e.test_chat_browser import REVIEWED, ask, chat_log_in
from tests.e2e.test_folds_browser import notice_text
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.approvals import lead_status
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import ApplyPolicies

pytestmark = pytest.mark.devserver
BOBS = "checked the account"
CAROLS = "budget seen in the CRM"
TWO = '@id("two-for-status") @approvals("2") permit(principal, action == Countersign::Action::"update_lead_status", resource);'  # noqa: E501


async def test_the_card_shows_the_quorum_and_the_second_approval_runs_the_call(
    signed_dev_agent: SignedStack,
    db_engine: AsyncEngine,
    chromium: str,
    jane_is_new: None,
    policies: ApplyPolicies,
    tmp_path: Path,
) -> None:
    stack = signed_dev_agent
    await policies(TWO)
    stack.agent.script(*REVIEWED)
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        alice = await browser.new_page(viewport={"width": 1280, "height": 900})
        await chat_log_in(alice, stack.url, "alice")
        workflow_id = await ask(alice, "please qualify jane")
        stack.agent.track(workflow_id)
        step = alice.locator('#log li.step[data-call="c1"]')
        await step.locator(".outcome:has-text('0 of 2 approved; 2 more approvals needed')").wait_for(
            timeout=30_000
        )
        page = await browser.new_page(viewport={"width": 1280, "height": 1100})
        await log_in(page, stack.url, "carol")
        bob = await stack.login("bob")
        item = await card(stack, bob, workflow_id)
        listed = page.locator(f'li[data-key="{workflow_id}/{item["call_id"]}"]')
        await listed.wait_for(timeout=15_000)
        quorum = listed.locator(".quorum")
        await quorum.wait_for(timeout=15_000)
        assert "Needs 2 distinct approvers (policy two-for-status)" in (await quorum.text_content() or "")
        assert (await quorum.text_content() or "").endswith("0 of 2 approved")
        needs = "Needs 2 distinct approvers (policy two-for-status), never the requester: "
        assert f"{needs}0 of 2 approved; 2 more approvals needed" in await notice_text(db_engine, workflow_id)

        path = f"/api/approvals/{workflow_id}/{item['call_id']}"
        status, body = await stack.call("POST", path, bob, {"decision": "approve", "reason": BOBS})
        assert status == 200 and body["state"] == "pending", body
        # never "by None"; the decide answer (the inbox's notice, the CLI's approve) says his reason too
        assert body["outcome"] == f"1 of 2 approved (bob: {BOBS}); 1 more approval needed", body
        # a quorum's card offers no grant that would fail: it says why there is none
        assert await listed.get_by_role("button", name="Approve and grant the same again").count() == 0
        assert "No grant: this call needs 2 distinct approvers" in (await listed.text_content() or "")
        # live, without a reload: the open stream tells the page, with bob's reason
        so_far = f"1 of 2 approved (bob: {BOBS})"
        await listed.locator(".quorum", has_text=so_far).wait_for(timeout=15_000)
        # alice's step says the same, and how many more are needed
        await step.locator(".outcome", has_text=f"{so_far}; 1 more approval needed").wait_for(timeout=15_000)
        assert await step.locator(".outcome .countdown").count() == 1  # still the same deadline
        cli = runner(stack.agent.cli_env(tmp_path))
        listed_cli = await cli("approvals", "list", "--tenant", "acme")
        assert f"{needs}{so_far}; 1 more approval needed" in listed_cli, listed_cli
        # `conversations list` tells conversations apart by their first words too (issue 50)
        (line,) = [
            x
            for x in (await cli("conversations", "list", "--tenant", "acme")).splitlines()
            if workflow_id in x
        ]
        assert line.startswith(
            f"{workflow_id}  awaiting_approval  lead-qualifier  started "
        ) and line.endswith('  "please qualify jane"'), line
        assert await lead_status(db_engine, "acme") == "new", "one approval of two runs nothing"
        await page.screenshot(path=ARTIFACTS / "inbox-quorum.png", full_page=True)
        await alice.screenshot(path=ARTIFACTS / "chat-quorum.png", full_page=True)

        await listed.get_by_label("Your reason for this decision").fill(CAROLS)
        await listed.get_by_role("button", name="Approve", exact=True).click()
        await listed.wait_for(state="detached", timeout=15_000)
        await step.locator(".outcome:has-text('approved by bob, carol; done')").wait_for(timeout=30_000)
        review = await step.locator(".review").text_content()
        assert review == f"bob approved it (reason: {BOBS}); carol approved it (reason: {CAROLS})", review
        assert await lead_status(db_engine, "acme") == "qualified"
        await browser.close()
    async with db_engine.connect() as conn:  # the audit keeps every approver's reason, not the last one's
        audited = (
            await conn.execute(
                select(ToolExecution.approved_by, ToolExecution.decision_reason, ToolExecution.roles).where(
                    ToolExecution.workflow_id == workflow_id
                )
            )
        ).one()
    # and alice's roles at the call, which `policy test` replays it with (issue 50)
    assert tuple(audited) == ("bob, carol", f"bob: {BOBS}; carol: {CAROLS}", ["sales"])
