"""Reviewers are told through the outbox (email over SMTP, a Slack-compatible webhook), once per
call and kind: when a call starts waiting, before it expires, and (admins) when it expired.
Real parts: the time-skipping Temporal server jumps the 24 h timers, an SMTP catcher and a local
webhook receiver see what was delivered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest_asyncio
from aiohttp import web
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.testing import WorkflowEnvironment

from countersign.db.schema import Tenant
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import ECHO_RESULT, pending, qualify
from tests.fixtures.smtp import SmtpServer
from tests.workflows.test_replay import replayer


@pytest_asyncio.fixture
async def webhook(db_engine: AsyncEngine) -> AsyncIterator[list[dict[str, Any]]]:
    """A local webhook receiver set as acme's webhook URL; yields the JSON bodies it received."""
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    async with db_engine.begin() as conn:
        await conn.execute(update(Tenant).where(Tenant.id == "acme").values(webhook_url=url))
    try:
        yield received
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(update(Tenant).where(Tenant.id == "acme").values(webhook_url=None))
        await runner.cleanup()


async def test_request_reminder_and_escalation_reach_email_and_webhook_once(
    agent: AgentHarness,
    temporal_env: WorkflowEnvironment,
    smtp_server: SmtpServer,
    webhook: list[dict[str, Any]],
    jane_is_new: None,
) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    await pending(handle)

    def mails() -> list[tuple[str, str]]:
        return sorted(
            (str(m["To"]), str(m["Subject"])) for m in smtp_server.notices if handle.id in m.get_content()
        )

    for _ in range(200):  # the request goes out while the call waits
        if len(mails()) == 2 and webhook:
            break
        await asyncio.sleep(0.05)
    assert mails() == [
        ("bob@acme.example", "Approval needed: update_lead_status"),
        ("carol@acme.example", "Approval needed: update_lead_status"),
    ]  # alice (sales) may not decide a high-risk call: not asked
    assert [w["kind"] for w in webhook] == ["request"]
    assert webhook[0]["link"].endswith(f"/#{handle.id}/c1") and "update_lead_status" in webhook[0]["text"]

    # Jump to the reminder (1 h before the 24 h expiry), then past the expiry: explicitly, since
    # automatic skipping waits while any activity of the shared test server is outstanding.
    await temporal_env.sleep(timedelta(hours=23, minutes=30))
    for _ in range(200):
        if len(mails()) == 4:
            break
        await asyncio.sleep(0.05)
    await temporal_env.sleep(timedelta(hours=1))
    await handle.result()
    assert mails() == sorted(
        [
            ("bob@acme.example", "Approval needed: update_lead_status"),
            ("carol@acme.example", "Approval needed: update_lead_status"),
            ("bob@acme.example", "Reminder: update_lead_status expires soon"),
            ("carol@acme.example", "Reminder: update_lead_status expires soon"),
            ("carol@acme.example", "Expired undecided: update_lead_status"),  # admins only
        ]
    )
    assert [w["kind"] for w in webhook] == ["request", "reminder", "escalation"]
    link = next(m for m in smtp_server.notices if handle.id in m.get_content())
    assert f"/#{handle.id}/c1" in link.get_content()
    assert not [m for m in smtp_server.messages if handle.id in m.get_content()]  # none as agent mail
    await replayer().replay_workflow(await handle.fetch_history())  # the notices replay deterministically
