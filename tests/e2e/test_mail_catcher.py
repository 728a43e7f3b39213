"""Notices in the embedded stack: the mail catcher keeps what is sent (read with `mail list`), and a
worker with no mail server configured says so once and does not retry a notice for an hour."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from email.message import EmailMessage
from pathlib import Path

import aiosmtplib
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from activities.notifications import NO_MAIL_SERVER
from countersign.db.schema import NotificationOutbox
from countersign.devstack.mail import catching, caught
from countersign.runtime.config import PROJECT_ROOT
from countersign.runtime.ports import free_port
from countersign.scripted_model.server import ScriptedModelServer
from tests.fixtures.agent import running_agent
from tests.fixtures.approvals import ECHO_RESULT, qualify


async def test_the_catcher_keeps_what_is_sent_and_mail_list_reads_it(tmp_path: Path) -> None:
    port = free_port()
    controller = catching(tmp_path / "mail", "127.0.0.1", port)
    try:
        message = EmailMessage()
        message["From"], message["To"], message["Subject"] = (
            "agent@countersign.local",
            "bob@acme.test",
            "Approval needed",
        )
        message["X-Countersign-Notice"] = "request"
        message.set_content("update_lead_status waits for a decision")
        await aiosmtplib.send(message, hostname="127.0.0.1", port=port)
    finally:
        controller.stop()
    (kept,) = caught(tmp_path / "mail")
    assert (kept.number, kept.kind, kept.message["Subject"]) == (1, "request", "Approval needed")
    env = {**os.environ, "COUNTERSIGN_DATA_DIR": str(tmp_path)}
    listed = json.loads(await mail_cli(env, "list", "--json"))
    assert [(m["kind"], m["to"], m["subject"]) for m in listed] == [
        ("request", "bob@acme.test", "Approval needed")
    ]
    assert "update_lead_status waits for a decision" in await mail_cli(env, "show", "1")


async def mail_cli(env: dict[str, str], *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "starter.py", "mail", *args, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0
    return out.decode()


async def test_with_no_mail_server_a_notice_is_undeliverable_once_not_retried(
    temporal_env: WorkflowEnvironment,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
    jane_is_new: None,
) -> None:
    async with running_agent(temporal_env, database_url, db_engine, scripted_model) as agent:
        assert not agent.settings.smtp_configured
        agent.script(qualify(), ECHO_RESULT)
        handle = await agent.start("qualify jane")
        query = select(NotificationOutbox).where(
            NotificationOutbox.idempotency_key.like(f"notice:{handle.id}:%"),
            NotificationOutbox.channel == "email",
        )
        for _ in range(200):
            async with db_engine.connect() as conn:
                rows = list(await conn.execute(query))
            if rows and all(r.error for r in rows):
                break
            await asyncio.sleep(0.05)
        assert rows and {(r.status, r.attempts, r.error) for r in rows} == {("queued", 1, NO_MAIL_SERVER)}
        history = await handle.fetch_history()
        failed = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
        assert failed == [], "the notice activity succeeded at once: nothing to retry"
