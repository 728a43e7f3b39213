"""`countersign channels`: a tenant's chat channel and its senders set without SQL, its secrets
taken from the environment, stored sealed, never printed; the key rotated with `rekey`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest_asyncio
from cryptography.fernet import Fernet
from sqlalchemy import delete, text
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ChatChannel, ChatSender
from countersign.runtime.config import PROJECT_ROOT

TOKEN = "777:cli-bot-token-plain"
SECRET = "cli-webhook-secret-plain"


async def countersign(
    database_url: str, key: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DATABASE_URL": database_url, "COUNTERSIGN_SECRETS_KEY": key, **env}
    command = [sys.executable, str(PROJECT_ROOT / "starter.py"), "channels", *args]
    return await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=60, env=environ, cwd=PROJECT_ROOT
    )


@pytest_asyncio.fixture
async def cleanup(db_engine: AsyncEngine) -> AsyncIterator[None]:
    yield
    async with db_engine.begin() as conn:
        await conn.execute(delete(ChatSender).where(ChatSender.tenant_id == "globex"))
        await conn.execute(delete(ChatChannel).where(ChatChannel.tenant_id == "globex"))


async def test_set_show_sender_and_rekey(database_url: str, db_engine: AsyncEngine, cleanup: None) -> None:
    old = Fernet.generate_key().decode()
    secrets = {"COUNTERSIGN_CHAT_BOT_TOKEN": TOKEN, "COUNTERSIGN_CHAT_WEBHOOK_SECRET": SECRET}
    args = ("set", "globex", "--kind", "telegram", "--name", "Ops", "--endpoint", "https://api.telegram.org")
    done = await countersign(database_url, old, *args, "--chat-id", "-42", **secrets)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip()
        == "globex: telegram channel 'Ops', chat -42; accepts messages (webhook secret set)"
    )
    shown = await countersign(database_url, old, "show", "globex", "--json")
    assert shown.returncode == 0 and '"has_bot_token": true' in shown.stdout
    for output in (done.stdout + done.stderr, shown.stdout + shown.stderr):
        assert TOKEN not in output and SECRET not in output
    async with db_engine.connect() as conn:
        stored = repr(
            (await conn.execute(text("SELECT * FROM chat_channels WHERE tenant_id = 'globex'"))).all()
        )
    assert "Ops" in stored and TOKEN not in stored and SECRET not in stored

    mapped = await countersign(database_url, old, "sender", "globex", "99", "dave", "--agent", "operations")
    assert mapped.returncode == 0, mapped.stderr
    unknown = await countersign(database_url, old, "sender", "globex", "98", "nobody")
    assert unknown.returncode != 0 and "no user nobody in globex" in unknown.stderr
    listed = await countersign(database_url, old, "senders", "globex")
    assert listed.stdout.splitlines() == ["99 writes as dave to operations"], listed.stderr
    assert (await countersign(database_url, old, "unlink", "globex", "99")).returncode == 0
    assert (await countersign(database_url, old, "senders", "globex")).stdout == ""
    assert "no sender 99" in (await countersign(database_url, old, "unlink", "globex", "99")).stderr
    kept = await countersign(database_url, old, "decides", "globex", "medium")
    assert (
        kept.stdout.strip() == "globex: the chat decides calls up to medium risk; riskier ones in the inbox"
    )
    assert (
        '"decides_up_to": "medium"'
        in (await countersign(database_url, old, "show", "globex", "--json")).stdout
    )
    assert (await countersign(database_url, old, "decides", "globex", "critical")).returncode == 2
    no_telegram_chat = await countersign(
        database_url, old, "set", "globex", "--kind", "telegram", "--name", "x", "--endpoint", "ftp://x"
    )
    assert no_telegram_chat.returncode != 0 and "http(s) URL" in no_telegram_chat.stderr
    slack = ("set", "globex", "--kind", "slack", "--name", "#ops", "--endpoint", "https://slack.com/api")
    no_review_channel = await countersign(database_url, old, *slack, COUNTERSIGN_CHAT_BOT_TOKEN="xoxb-1")
    assert no_review_channel.returncode != 0 and "needs chat_id" in no_review_channel.stderr

    new = (await countersign(database_url, old, "key")).stdout.strip()
    rekeyed = await countersign(database_url, f"{new},{old}", "rekey")
    assert rekeyed.returncode == 0 and rekeyed.stdout.startswith(
        tuple(f"{n} channel(s)" for n in range(1, 10))
    )
    assert (
        await countersign(database_url, new, "show", "globex")
    ).returncode == 0  # the new key alone opens it
    refused = await countersign(database_url, old, "show", "globex")
    assert refused.returncode != 0 and "cannot be opened" in refused.stderr and TOKEN not in refused.stderr
