"""Issue 48 items 2 and 3 on the real parts (the dev server, PostgreSQL, the worker and the server in
APPROVER_AUTH=signed mode, the scripted model, headless Chromium, `starter.py` as a subprocess).

alice's agent asks to send an email whose text part is harmless, with a body line longer than the
card's limit whose end is a P.S., and whose HTML part (what a mail program shows) holds a link to
somewhere else than it says, a customer list (behind a hiding style, which the sanitizer strips: it
leaves in plain sight) and small print in a closed `<details>` (hidden until the reader opens it).
Everywhere the call is shown, the reviewer reads the HTML as its reader would see it, with the
link's real target and the hidden text, and the long line folds visibly, its end reachable:
the inbox card (at 390 and 1280 px; "show all" reveals the P.S., the HTML source is one press away),
`GET /api/approvals` (`effect_lines` folded with the mark, `effect_folds` the rest, `effect` whole),
`approvals list` (folded, saying how to see all) and `approvals show` (whole), and the notice (a
link to the card). Screenshots in test-artifacts/folds/."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import async_playwright
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import NotificationOutbox
from tests.cli.test_grants_cli import runner
from tests.e2e.test_chat_browser import ask, chat_log_in
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.approvals import pending
from tests.fixtures.inbox import SignedStack
from tests.fixtures.offer import HIDDEN, LIST, LONG, MARK, PS, SEND, TARGET

pytestmark = pytest.mark.devserver


async def notice_text(engine: AsyncEngine, workflow_id: str) -> str:
    """The body of bob's notice email for the call (queued once the request is recorded)."""
    query = select(NotificationOutbox.body).where(
        NotificationOutbox.idempotency_key.like(f"notice:{workflow_id}:%:request:email:bob")
    )
    for _ in range(200):
        async with engine.connect() as conn:
            body = await conn.scalar(query)
        if body is not None:
            return str(body)
        await asyncio.sleep(0.05)
    raise AssertionError("no notice for bob")


async def test_the_html_part_and_a_long_lines_end_are_shown_everywhere_the_call_is(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, tmp_path: Path
) -> None:
    stack = signed_dev_agent
    stack.agent.script(
        {"when": {"user_contains": "offer"}, "reply": {"tool_calls": [SEND]}},
        {"when": {"after_tool": "send_email"}, "reply": {"content": "done"}},
    )
    handle = await stack.agent.start("send the offer", single_turn=True)
    await pending(handle)
    bob = await stack.login("bob")

    # the API: lines folded with the mark, the rest beside them, the effect whole
    code, items = await stack.call("GET", "/api/approvals", bob)
    assert code == 200, items
    (item,) = [i for i in items if i["workflow_id"] == handle.id]
    lines: list[str] = item["effect_lines"]
    (folded,) = [n for n, line in enumerate(lines) if line.endswith(MARK)]
    (fold,) = item["effect_folds"]
    assert fold["line"] == folded and fold["rest"].endswith(PS) and not any(PS in line for line in lines)
    count = int(lines[folded].rsplit(" … ", 1)[1].split(" ")[0].replace(",", ""))
    assert count == len(fold["rest"])
    assert f"      Please confirm at {TARGET}." in lines and f"      {LIST}" in lines
    assert f"      {HIDDEN}" in lines
    assert item["effect"]["messages"][0]["html"].startswith("<p>Dear partner,</p>")
    assert any("HTML hides text" in w for w in item["warnings"]), item["warnings"]

    # the card, on a phone and a desktop
    shots = ARTIFACTS / "folds"
    shots.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        for width in (390, 1280):
            page = await browser.new_page(viewport={"width": width, "height": 900})
            await log_in(page, stack.url, "bob")
            card = page.locator(f'li[data-key="{handle.id}/c1"]')
            await card.wait_for(timeout=30_000)
            effect = card.locator(".effect-lines")
            show_all = effect.get_by_role("button", name=f"… {count:,}{MARK}")
            await show_all.scroll_into_view_if_needed()
            assert await show_all.is_visible()
            shown = await effect.inner_text()
            assert PS not in shown and TARGET in shown and LIST in shown and HIDDEN in shown, shown
            await card.screenshot(path=shots / f"card-{width}-folded.png")
            await show_all.click()
            assert PS in await effect.inner_text()
            assert await effect.get_by_text(PS).is_visible()
            args = card.locator(".raw-args")  # the model's arguments fold the same way
            assert PS not in await args.inner_text()
            await args.locator("button.show-all").click()
            assert PS in await args.inner_text()
            source = card.locator("details.html-source")
            await source.locator("summary").click()
            assert 'href="https://evil.example/login"' in await source.locator("pre").inner_text()
            await card.screenshot(path=shots / f"card-{width}-shown.png")
            wide = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert wide <= 0, f"the page is {wide} px wider than the window at {width} px"
            await page.close()
        await browser.close()

    # the CLI: folded with how to see all, and whole
    cli = runner(stack.agent.cli_env(tmp_path))
    listed = await cli("approvals", "list", "--tenant", "acme")
    assert f"… {count:,}{MARK}" in listed and PS not in listed and TARGET in listed and HIDDEN in listed
    assert f"`approvals show {handle.id} c1` prints them whole" in listed
    whole = await cli("approvals", "show", handle.id, "c1")
    assert LONG in whole and TARGET in whole and HIDDEN in whole and MARK not in whole
    assert "HTML source of the email to partner@example.org:" in whole and "evil.example/login" in whole

    # the notice: folded, with the link to the card
    text = await notice_text(db_engine, handle.id)
    assert f"… {count:,}{MARK}" in text and PS not in text and HIDDEN in text and TARGET in text
    assert "Some lines are folded here; the card shows all of them: " in text and f"#{handle.id}/c1" in text

    code, body = await stack.call(
        "POST", f"/api/approvals/{handle.id}/c1", bob, {"decision": "reject", "reason": "seen"}
    )
    assert code == 200, body
    result: Any = await handle.result()
    assert result.last_reply == "[scripted model] done"


async def test_the_chat_pages_step_folds_the_long_line_and_shows_all_of_it(
    signed_dev_agent: SignedStack, chromium: str
) -> None:
    """alice, who asked, reads on her step what the call waits with: the HTML as its reader sees it
    and the long line folded, its end one press away (the `approval` event carries the rests); the
    call's arguments, longer than a `tool_call` event carries, fold too, read whole from the
    transcript on a press."""
    stack = signed_dev_agent
    stack.agent.script(
        {"when": {"user_contains": "offer"}, "reply": {"tool_calls": [SEND]}},
        {"when": {"after_tool": "send_email"}, "reply": {"content": "done"}},
    )
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        alice = await browser.new_page(viewport={"width": 390, "height": 900})
        await chat_log_in(alice, stack.url, "alice")
        workflow_id = await ask(alice, "send the offer")
        stack.agent.track(workflow_id)
        step = alice.locator('#log li.step[data-call="c1"]')
        await step.locator(".outcome:has-text('Waiting for a reviewer')").wait_for(timeout=30_000)
        effect = step.locator(".effect-lines")
        shown = await effect.inner_text()
        assert PS not in shown and TARGET in shown and HIDDEN in shown, shown
        show_all = effect.locator("button.show-all")
        assert MARK in (await show_all.inner_text())
        await show_all.click()
        await effect.get_by_text(PS).wait_for()
        args = step.locator("pre.args")  # the call's arguments: the event's first 2,000, then the whole
        assert PS not in await args.inner_text()
        await args.locator("button.show-all").click()
        await args.get_by_text(PS, exact=False).wait_for()
        await step.screenshot(path=ARTIFACTS / "folds" / "chat-step-390-shown.png")
        await browser.close()
