"""An admin's "always allow this tool for this agent" (tools/tiers.py) over the real inbox
(HTTP, APPROVER_AUTH=signed, the dev server, PostgreSQL, the scripted model over HTTP), and an
approver's edit kept beside the model's arguments in the audit."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Dialog, async_playwright
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import AgentToolPermission, Task, TenantToolTier, TierChange, ToolExecution
from countersign.runtime.config import PROJECT_ROOT
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS, log_in
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.approvals import ECHO_RESULT, pending, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE
from tools.tiers import tier_refusal

TASK_TITLE = "Call Initech (tenant tier test)"  # removed afterwards: other tests count the seeded tasks
CREATE_TASK = {
    "when": {"user_contains": "task"},
    "reply": {"tool_calls": [{"name": "create_task", "arguments": {"title": TASK_TITLE}}]},
}
TASK_DONE = {"when": {"after_tool": "create_task"}, "reply": {"content": "task created"}}


def test_high_risk_tools_are_never_always_allowed_for_a_tenant() -> None:
    assert tier_refusal("high", "always_allow") is not None
    assert "four-eyes" in (tier_refusal("high", "always_allow") or "")
    assert tier_refusal("high", "blocked") is None  # tightening is always fine
    assert tier_refusal("medium", "always_allow") is None
    assert tier_refusal("low", "always_allow") is None


async def starter(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url}
    command = [sys.executable, str(PROJECT_ROOT / "starter.py"), *args]
    return await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=60, env=env, cwd=PROJECT_ROOT
    )


@pytest_asyncio.fixture
async def create_task_needs_approval(db_engine: AsyncEngine) -> AsyncIterator[None]:
    """operations' create_task waits for a reviewer (the seed lets it run), no tenant tier set."""

    async def reset(tier: str) -> None:
        async with db_engine.begin() as conn:
            await conn.execute(delete(Task).where(Task.title == TASK_TITLE))
            await conn.execute(delete(TenantToolTier).where(TenantToolTier.agent == "operations"))
            await conn.execute(
                update(AgentToolPermission)
                .where(AgentToolPermission.agent == "operations", AgentToolPermission.tool == "create_task")
                .values(tier=tier)
            )

    await reset("needs_approval")
    yield
    await reset("always_allow")


async def tier_changes(engine: AsyncEngine, workflow_id: str) -> list[Any]:
    async with engine.connect() as conn:
        return list(
            await conn.execute(
                select(TierChange).where(TierChange.workflow_id == workflow_id).order_by(TierChange.id)
            )
        )


async def audit_row(engine: AsyncEngine, workflow_id: str) -> Any:
    async with engine.connect() as conn:
        return (
            await conn.execute(select(ToolExecution).where(ToolExecution.workflow_id == workflow_id))
        ).one()


@pytest.mark.devserver  # the inbox reads conversations through Temporal visibility and queries
async def test_an_admin_always_allows_a_tool_for_the_tenants_new_conversations_only(
    signed_dev_agent: SignedStack,
    db_engine: AsyncEngine,
    database_url: str,
    create_task_needs_approval: None,
    jane_is_new: None,
) -> None:
    stack = signed_dev_agent
    stack.agent.script(CREATE_TASK, TASK_DONE, qualify(), ECHO_RESULT)
    first = await stack.agent.start("create a task to call Initech", agent="operations", single_turn=True)
    await pending(first)
    route = f"/api/approvals/{first.id}/c1/always-allow"
    bob, carol = await stack.login("bob"), await stack.login("carol")

    # a reviewer is not an admin: refused, and the attempt recorded
    status, body = await stack.call("POST", route, bob, {"confirm": True})
    assert status == 403 and "only an admin of acme" in body["error"], body
    # the change must be confirmed, as JSON (a cross-site form can send neither)
    status, body = await stack.call("POST", route, carol, {})
    assert status == 400 and "confirm" in body["error"], body
    status, body = await stack.call("POST", route, None, {"confirm": True})
    assert status == 401, body

    status, change = await stack.call("POST", route, carol, {"confirm": True})
    assert status == 200, change
    assert {k: change[k] for k in ("tenant_id", "agent", "tool", "old_tier", "new_tier", "changed_by")} == {
        "tenant_id": "acme",
        "agent": "operations",
        "tool": "create_task",
        "old_tier": "needs_approval",
        "new_tier": "always_allow",
        "changed_by": "carol",
    }
    rows = await tier_changes(db_engine, first.id)
    assert [(r.changed_by, r.accepted, r.old_tier, r.new_tier, r.via, r.workflow_id) for r in rows] == [
        ("bob", False, "needs_approval", "always_allow", "inbox", first.id),
        ("carol", True, "needs_approval", "always_allow", "inbox", first.id),
    ]

    # it decided nothing: the call still waits (its conversation keeps its snapshot) until bob approves
    assert [p.call_id for p in (await pending(first)).pending_approvals] == ["c1"]
    status, body = await stack.call("POST", f"/api/approvals/{first.id}/c1", bob, {"decision": "approve"})
    assert status == 200, body
    await first.result()
    assert (await audit_row(db_engine, first.id)).approved_by == "bob"

    # a conversation started afterwards runs the tool without asking anyone
    second = await stack.agent.start("create a task to call Initech", agent="operations", single_turn=True)
    assert "task created" in ((await second.result()).last_reply or "")
    row = await audit_row(db_engine, second.id)
    assert (row.outcome, row.approved_by) == ("executed", None)

    # globex shares the agent, not acme's tier: dave's call still waits for a reviewer of globex
    third = await stack.agent.start(
        "create a task to call Initech", agent="operations", tenant="globex", user="dave", single_turn=True
    )
    await pending(third)
    erin = await stack.login("erin", tenant="globex")
    status, body = await stack.call(
        "POST", f"/api/approvals/{third.id}/c1", erin, {"decision": "reject", "reason": "not now"}
    )
    assert status == 200, body
    await third.result()

    shown = await starter(database_url, "permissions", "show", "operations", "--tenant", "acme")
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("create_task "))
    assert line.split()[1:4] == ["always_allow", "tenant", "acme"] and "by carol" in line, line
    plain = await starter(database_url, "permissions", "show", "operations", "--tenant", "globex")
    line = next(line for line in plain.stdout.splitlines() if line.startswith("create_task "))
    assert line.split()[1:3] == ["needs_approval", "set"], line

    # high risk keeps four-eyes: carol may not always allow update_lead_status, even from the inbox
    qualifying = await stack.agent.start("qualify jane", single_turn=True)
    await pending(qualifying)
    status, body = await stack.call(
        "POST", f"/api/approvals/{qualifying.id}/c1/always-allow", carol, {"confirm": True}
    )
    assert status == 403 and "four-eyes" in body["error"], body
    # ... nor can an operator through the CLI, and a tenant change needs a named admin
    cli = await starter(
        database_url, "permissions", "set", "lead-qualifier", "update_lead_status", "always_allow",
        "--tenant", "acme", "--as", "carol",
    )  # fmt: skip
    assert cli.returncode != 0 and "four-eyes" in cli.stderr, cli
    anonymous = await starter(
        database_url, "permissions", "set", "operations", "create_task", "blocked", "--tenant", "acme"
    )
    assert anonymous.returncode != 0 and "--as" in anonymous.stderr

    # bob edits the arguments and approves: the audit keeps the model's and the edited ones
    edited = {"lead": JANE, "new_status": "contacted", "reason": "called, not qualified yet"}
    status, body = await stack.call(
        "POST", f"/api/approvals/{qualifying.id}/c1", bob, {"decision": "approve", "args": edited}
    )
    assert status == 200, body
    await qualifying.result()
    row = await audit_row(db_engine, qualifying.id)
    assert row.args == {"lead": JANE, "new_status": "qualified", "reason": "budget confirmed"}
    assert row.edited_args == edited and row.approved_by == "bob"
    audited = await starter(database_url, "audit", "--workflow", qualifying.id, "--json")
    assert audited.returncode == 0, audited.stderr
    [entry] = json.loads(audited.stdout)
    assert (entry["args"]["new_status"], entry["edited_args"], entry["edited_by"]) == (
        "qualified",
        edited,
        "bob",
    )
    status, history = await stack.call("GET", "/api/history", carol)
    assert status == 200, history
    decided = next(h for h in history if h["workflow_id"] == qualifying.id and h["accepted"])
    assert decided["edited_args"] == edited and decided["model_args"]["new_status"] == "qualified"
    unedited = next(h for h in history if h["workflow_id"] == first.id)
    assert (unedited["edited_args"], unedited["model_args"]) == (None, None)


@pytest.mark.devserver
async def test_carol_clicks_always_allow_in_the_inbox_page(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, chromium: str, create_task_needs_approval: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(CREATE_TASK, TASK_DONE)
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        confirmations: list[str] = []

        async def accept(dialog: Dialog) -> None:
            confirmations.append(dialog.message)
            await dialog.accept()

        page.on("dialog", accept)
        await log_in(page, stack.url, "carol")
        handle = await stack.agent.start(
            "create a task to call Initech", agent="operations", single_turn=True
        )
        card = page.locator(f'li[data-key="{handle.id}/c1"]')
        await card.wait_for(timeout=15_000)
        button = card.get_by_role("button", name="Always allow this tool for this agent")
        await button.wait_for(timeout=5_000)
        assert "does not approve the call above" in (await card.text_content() or "")
        await button.click()
        await page.wait_for_selector("#status:has-text('is now always_allow')")
        await page.screenshot(path=ARTIFACTS / "inbox-always-allow.png", full_page=True)
        assert confirmations and "Always allow create_task for operations" in confirmations[0]
        assert await card.is_visible()  # the call itself still waits for its decision
        await card.get_by_role("button", name="Approve", exact=True).click()
        await card.wait_for(state="detached", timeout=15_000)
        await browser.close()
    await handle.result()
    async with db_engine.connect() as conn:
        tier = (
            await conn.execute(
                select(TenantToolTier.tier, TenantToolTier.set_by).where(
                    TenantToolTier.tenant_id == "acme", TenantToolTier.tool == "create_task"
                )
            )
        ).one()
    assert tuple(tier) == ("always_allow", "carol")
