"""The inbox page in headless Chromium (Playwright driving Debian's chromium) against the dev server,
with the worker in APPROVER_AUTH=signed mode: bob logs in, alice's request appears without a reload,
bob edits its arguments in the form generated from the tool's schema and approves; the call runs
once with the edited arguments and the audit shows bob as proven. Screenshots in test-artifacts/."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import AgentProfile, ApprovalDecision, McpServer, ToolExecution
from countersign.runtime.config import PROJECT_ROOT
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.approvals import ECHO_RESULT, lead_status, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.mcp import HttpServer, http_config, register
from tests.fixtures.postgres import JANE

pytestmark = pytest.mark.devserver

ARTIFACTS = PROJECT_ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip


async def log_in(page: Page, url: str, user: str) -> None:
    """Through the inbox's login form, keyboard only (the form submits on Enter); seeded password."""
    await page.goto(url + "/")
    await page.get_by_label("Tenant").fill("acme")
    await page.get_by_label("User").fill(user)
    await page.get_by_label("Password").fill(f"{user}-dev")
    await page.keyboard.press("Enter")
    await page.wait_for_selector("#whoami")


async def test_bob_edits_and_approves_alices_request_live_in_the_inbox(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(qualify("budget confirmed"), ECHO_RESULT)
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        await log_in(page, stack.url, "bob")
        assert await page.text_content("#whoami") == "bob"
        await page.wait_for_function("() => document.querySelector('#live').textContent.startsWith('live')")

        handle = await stack.agent.start("qualify jane", user="alice", single_turn=True)
        asked = time.monotonic()
        card = page.locator(f'li[data-key="{handle.id}/c1"]')
        await card.wait_for(timeout=15_000)  # arrives over server-sent events: no reload
        appeared_s = time.monotonic() - asked
        lines = (await card.locator(".raw-args").text_content() or "").splitlines()
        assert lines == [f"lead: {json.dumps(JANE)}", 'new_status: "qualified"', 'reason: "budget confirmed"']
        assert "requested by alice" in (await card.text_content() or "")
        # the CLI's time format (dom.js relativeTime), not a format of the inbox's own
        expires = await card.locator(".expires").evaluate("(n) => n.parentNode.textContent")
        assert re.search(r"· expires in \d+ h( \d+ min)?$", expires), expires
        await page.screenshot(path=ARTIFACTS / "inbox-pending.png", full_page=True)

        await card.locator("summary").click()
        await card.get_by_label("reason", exact=True).fill("budget confirmed by bob on the phone")
        await card.get_by_label("new_status").select_option("contacted")
        await card.get_by_role("button", name="Approve with these arguments").click()
        await card.wait_for(state="detached", timeout=15_000)
        await page.wait_for_selector("#history td:has-text('bob (proven)')")
        # the decided history shows the edit beside what the model asked for
        await page.wait_for_selector('#history .edit:has-text(\'"new_status":"contacted"\')')
        await page.screenshot(path=ARTIFACTS / "inbox-decided.png", full_page=True)
        await browser.close()

    await handle.result()
    edited = {"lead": JANE, "new_status": "contacted", "reason": "budget confirmed by bob on the phone"}
    async with db_engine.connect() as conn:
        executions = list(
            await conn.execute(select(ToolExecution).where(ToolExecution.workflow_id == handle.id))
        )
        decisions = list(
            await conn.execute(select(ApprovalDecision).where(ApprovalDecision.workflow_id == handle.id))
        )
    # run once, with the edited arguments; the audit keeps the model's (`args`) and bob's edit
    assert [(e.outcome, e.approved_by, e.edited_args) for e in executions] == [("executed", "bob", edited)]
    assert executions[0].args == {"lead": JANE, "new_status": "qualified", "reason": "budget confirmed"}
    assert [(d.approver, d.accepted, d.proven) for d in decisions] == [("bob", True, True)]
    assert await lead_status(db_engine, "acme") == "contacted"
    assert appeared_s < 15


async def test_bob_edits_an_mcp_call_in_the_form_built_from_the_servers_schema(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, ledgered_http_server: HttpServer
) -> None:
    """An MCP tool's schema (the SDK test server's `write`: `key`, `value`, optional `note`) gives
    the edit form; a field left empty that the schema does not require is left out, so the server
    receives exactly the edited arguments."""
    stack, server = signed_dev_agent, ledgered_http_server
    agent = f"mcp-{uuid.uuid4().hex[:8]}"
    async with db_engine.begin() as conn:
        await conn.execute(insert(AgentProfile).values(name=agent, system_prompt="You use MCP tools."))
    try:
        await register(db_engine, http_config(agent, server).model_copy(update={"headers": {}}))
        asked = {"key": "greeting", "value": "hello"}
        write = {"tool_calls": [{"name": "mcp__web__write", "arguments": asked}]}
        stack.agent.script(
            {"when": {"user_contains": "store"}, "reply": write},
            {"when": {"after_tool": "mcp__web__write"}, "reply": {"content": "stored"}},
        )
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 1000})
            await log_in(page, stack.url, "bob")
            handle = await stack.agent.start("store the greeting", agent=agent, single_turn=True)
            card = page.locator(f'li[data-key="{handle.id}/c1"]')
            await card.wait_for(timeout=15_000)
            text = await card.text_content() or ""
            assert "[MCP server web]" in text and "MCP server web says (unverified)" in text
            await card.locator("summary").click()
            assert await card.get_by_label("key", exact=True).input_value() == "greeting"
            assert await card.get_by_label("note (optional)").input_value() == ""
            await card.get_by_label("value", exact=True).fill("hello, edited by bob")
            await page.screenshot(path=ARTIFACTS / "inbox-mcp-edit.png", full_page=True)
            await card.get_by_role("button", name="Approve with these arguments").click()
            await card.wait_for(state="detached", timeout=15_000)
            await browser.close()
        assert (await handle.result()).last_reply == "[scripted model] stored"
        edited = {"key": "greeting", "value": "hello, edited by bob"}
        assert [c["arguments"] for c in server.calls()] == [edited]  # no empty `note` was sent
        async with db_engine.connect() as conn:
            executions = list(
                await conn.execute(select(ToolExecution).where(ToolExecution.workflow_id == handle.id))
            )
        asked = {"key": "greeting", "value": "hello"}  # the model's; the audit keeps both
        assert [(e.outcome, e.approved_by, e.args, e.edited_args) for e in executions] == [
            ("executed", "bob", asked, edited)
        ]
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(McpServer).where(McpServer.agents.contains([agent])))
            await conn.execute(delete(AgentProfile).where(AgentProfile.name == agent))


async def test_a_rejection_needs_a_reason_and_a_confirmation_and_says_so_near_the_cards(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, jane_is_new: None
) -> None:
    """Reject on one click with no reason was too easy: the page asks for a reason, then confirms;
    the outcome shows under the list's heading; descriptions' `code` renders as code; the
    conversation id links to the Web UI; the favicon is served."""
    stack = signed_dev_agent
    stack.agent.script(qualify("budget confirmed"), ECHO_RESULT)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        assert (await page.goto(stack.url + "/favicon.ico") or pytest.fail("no response")).ok
        await log_in(page, stack.url, "bob")
        handle = await stack.agent.start("qualify jane", user="alice", single_turn=True)
        card = page.locator(f'li[data-key="{handle.id}/c1"]')
        await card.wait_for()
        assert await card.locator(f'a[href$="/workflows/{handle.id}"]').count() == 1
        dialogs: list[str] = []

        async def answer(dialog: Any) -> None:
            dialogs.append(dialog.message)
            await (dialog.dismiss() if len(dialogs) == 1 else dialog.accept())

        page.on("dialog", answer)
        await card.get_by_role("button", name="Reject").click()
        assert "Give a reason" in (await card.locator(".error").text_content() or "") and not dialogs
        await card.get_by_label("Your reason for this decision").fill("not yet: call her first")
        await card.get_by_role("button", name="Reject").click()  # dismissed: nothing is decided
        assert len(dialogs) == 1 and "not yet: call her first" in dialogs[0]
        assert await card.is_visible()
        await card.get_by_role("button", name="Reject").click()
        await page.wait_for_function(
            "() => document.querySelector('#status').textContent.startsWith('rejected')"
        )
        status_y = (await page.locator("#status").bounding_box() or {"y": 1e9})["y"]
        history_y = (await page.locator("#history").bounding_box() or {"y": 0})["y"]
        assert status_y < history_y  # next to the list, not below the decided table
        await browser.close()
    await handle.result()
    async with db_engine.connect() as conn:
        decisions = list(
            await conn.execute(select(ApprovalDecision).where(ApprovalDecision.workflow_id == handle.id))
        )
    assert [(d.decision, d.reason, d.proven) for d in decisions] == [
        ("reject", "not yet: call her first", True)
    ]


async def test_the_batch_buttons_ask_first_then_decide_the_selected_cards_together(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, jane_is_new: None
) -> None:
    """Bob selects two conversations' calls: "Reject selected" wants a reason and a confirmation (he
    dismisses it: nothing is decided); "Approve selected" asks too, with his reason and that it grants
    nothing (dismissed: nothing decided), then decides both at once with his reason; both cards leave
    the page, the page says no grant was given, and each decision is recorded as proven, with the
    reason."""
    stack = signed_dev_agent
    stack.agent.script(qualify("budget confirmed"), ECHO_RESULT)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        await log_in(page, stack.url, "bob")
        handles = [await stack.agent.start("qualify jane", user="alice", single_turn=True) for _ in range(2)]
        cards = [page.locator(f'li[data-key="{h.id}/c1"]') for h in handles]
        for card in cards:
            await card.wait_for(timeout=15_000)
        dialogs: list[str] = []

        async def dismiss(dialog: Any) -> None:  # the first two asked are dismissed, the third accepted
            dialogs.append(dialog.message)
            await (dialog.dismiss() if len(dialogs) < 3 else dialog.accept())

        page.on("dialog", dismiss)
        status = page.locator("#status")
        await page.get_by_role("button", name="Approve selected").click()
        assert (await status.text_content() or "").startswith("select calls first")
        for card in cards:
            await card.locator("input.select").check()
        await page.get_by_role("button", name="Reject selected").click()
        assert "give a reason" in (await status.text_content() or "") and not dialogs
        await page.get_by_label("Reason for the selected").fill("checked with the team")
        await page.get_by_role("button", name="Reject selected").click()  # dismissed: nothing decided
        assert len(dialogs) == 1 and "Reject 2 selected" in dialogs[0]
        assert all([await card.is_visible() for card in cards])
        await page.get_by_role("button", name="Approve selected").click()  # dismissed: nothing decided
        assert (
            len(dialogs) == 2
            and "Approve 2 selected call(s)? The agents are told: checked with the team" in (dialogs[1])
        )
        assert "No grant: each call is approved once" in dialogs[1], dialogs
        assert all([await card.is_visible() for card in cards])
        await page.get_by_role("button", name="Approve selected").click()
        # each card as bob saw it leaves; the call that runs second may come back under the same key,
        # asked again (below), as soon as the first has run, so only the card as it was must go
        for handle in handles:
            as_seen = page.locator(f'li[data-key="{handle.id}/c1"]:not(:has(.asked-again))')
            await as_seen.wait_for(state="detached", timeout=15_000)
        await page.wait_for_function(
            "() => document.querySelector('#status').textContent.startsWith('2 decided')", timeout=15_000
        )
        assert "No grant: each call is approved once" in (await status.text_content() or "")
        await page.screenshot(path=ARTIFACTS / "inbox-batch.png", full_page=True)
        # issue 34: both were approved as "Jane: new → qualified"; the one that runs second finds her
        # qualified already, so what it would do changed: it comes back, asked again: nothing ran twice
        again = page.locator("li.card:has(.asked-again)")
        await again.wait_for(timeout=30_000)
        await again.get_by_role("button", name="Approve", exact=True).click()
        await again.wait_for(state="detached", timeout=15_000)
        await browser.close()
    for handle in handles:
        await handle.result()
    async with db_engine.connect() as conn:
        decisions = list(
            await conn.execute(
                select(ApprovalDecision).where(ApprovalDecision.workflow_id.in_([h.id for h in handles]))
            )
        )
    assert sorted(
        (d.decision, d.approver, d.reason or "", d.proven, d.voided_at is not None) for d in decisions
    ) == [
        ("approve", "bob", "", True, False),
        ("approve", "bob", "checked with the team", True, False),
        ("approve", "bob", "checked with the team", True, True),
    ]
