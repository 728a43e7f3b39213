"""Issue 53's channel findings against the real server: refused webhooks are counted per window
and rate-limited instead of chained one by one (item 5); every channel and sender change is a
chained record naming who made it, without a secret (item 6); a channel's endpoint must be a
public address unless the operator allowed it, when saved and when posting (item 7)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import AuditChainRecord, ChatTurn, InputAudit, WebhookRefusal
from countersign.runtime.endpoints import ALLOW_ENV
from countersign.server.channels import REFUSALS_PER_WINDOW, TELEGRAM_SECRET_HEADER
from tests.fixtures.chat import TOKEN, Receiver, webhook
from tests.fixtures.inbox import SignedStack
from tests.server.test_channels import hello_bot

SECRET = "webhook-secret-for-tests"
SENDER = "4242"


def telegram(endpoint: str) -> dict[str, Any]:
    return {"kind": "telegram", "name": "Sales group", "endpoint": endpoint, "bot_token": TOKEN,
            "chat_id": "-100200", "webhook_secret": SECRET}  # fmt: skip


async def chained_inputs(engine: AsyncEngine, action: str) -> list[InputAudit]:
    """acme's `input_audit` rows of `action` that are in its audit chain."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(InputAudit)
            .join(
                AuditChainRecord,
                (AuditChainRecord.source == "input_audit")
                & (AuditChainRecord.tenant_id == InputAudit.tenant_id)
                & (AuditChainRecord.source_id == func.concat("[", InputAudit.id, "]")),
            )
            .where(InputAudit.tenant_id == "acme", InputAudit.action == action)
            .order_by(InputAudit.id)
        )
        return list(rows.all())  # type: ignore[arg-type]


async def test_refused_webhooks_are_counted_and_limited_per_source_not_chained_one_by_one(
    signed_agent: SignedStack, chat_receiver: Receiver, db_engine: AsyncEngine, chat_cleanup: None
) -> None:
    stack = signed_agent
    carol = await stack.login("carol")
    assert (await stack.call("PUT", "/api/admin/channel", carol, telegram(chat_receiver.base_url)))[0] == 200
    before = len(await chained_inputs(db_engine, "chat_webhook:telegram"))
    body = json.dumps({"update_id": 1, "message": {"text": "hi"}}).encode()
    sent = 2 * REFUSALS_PER_WINDOW + 5  # at most two windows: one of them goes past the limit
    answers = [
        (await webhook(stack.url, "/channels/telegram/acme", body, {TELEGRAM_SECRET_HEADER: "guess"}))[0]
        for _ in range(sent)
    ]
    assert set(answers) == {401, 429}, answers
    chained = len(await chained_inputs(db_engine, "chat_webhook:telegram")) - before
    assert 1 <= chained <= 2  # one record a window, not one a request
    async with db_engine.connect() as conn:
        counted = await conn.scalar(
            select(func.sum(WebhookRefusal.count)).where(
                WebhookRefusal.tenant_id == "acme", WebhookRefusal.kind == "telegram"
            )
        )
    assert counted == sent
    # the right secret is still let through from that source: the limit is on refusals
    status, _ = await webhook(stack.url, "/channels/telegram/acme", body, {TELEGRAM_SECRET_HEADER: SECRET})
    assert status == 200


async def test_every_channel_and_sender_change_is_chained_naming_who_and_never_a_secret(
    signed_agent: SignedStack, chat_receiver: Receiver, db_engine: AsyncEngine, chat_cleanup: None
) -> None:
    stack = signed_agent
    carol, alice = await stack.login("carol"), await stack.login("alice")
    assert (await stack.call("PUT", "/api/admin/channel", carol, telegram(chat_receiver.base_url)))[0] == 200
    sender = {"user_id": "alice", "agent": "lead-qualifier"}
    assert (await stack.call("PUT", f"/api/admin/channel/senders/{SENDER}", carol, sender))[0] == 200
    (channel_set,) = (await chained_inputs(db_engine, "channel_set"))[-1:]
    (sender_set,) = (await chained_inputs(db_engine, "channel_sender_set"))[-1:]
    assert (channel_set.actor, sender_set.actor) == ("carol", "carol")
    assert sender_set.reason == f"sender {SENDER} writes as alice to lead-qualifier"
    status, shown = await stack.call("GET", "/api/admin/channel/changes", carol)
    assert status == 200 and [c["action"] for c in shown["changes"][:2]] == [
        "channel_sender_set",
        "channel_set",
    ]
    said = json.dumps(shown) + repr(channel_set.reason)
    for secret in (SECRET, TOKEN, chat_receiver.base_url):
        assert secret not in said
    assert (await stack.call("GET", "/api/admin/channel/changes", alice))[0] == 403  # admins only


async def test_a_channel_endpoint_that_is_not_public_is_refused_when_saved_and_when_posting(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = signed_agent
    stack.agent.script({"when": {"user_contains": "hello"}, "reply": {"content": "hi there"}})
    carol = await stack.login("carol")
    monkeypatch.delenv(ALLOW_ENV)  # no operator allowed anything
    for endpoint in ("http://169.254.169.254", "http://127.0.0.1:9", "http://localhost", "http://[::1]",
                     "http://10.0.0.8", chat_receiver.base_url):  # fmt: skip
        code, said = await stack.call("PUT", "/api/admin/channel", carol, telegram(endpoint))
        assert code == 422 and "not a public address" in said["error"], (endpoint, said)
    assert (await stack.call("GET", "/api/admin/channel", carol))[0] == 404  # nothing was saved

    # saved while the operator allowed it; the allow-list gone, posting refuses it after resolving
    monkeypatch.setenv(ALLOW_ENV, "127.0.0.0/8")
    assert (await stack.call("PUT", "/api/admin/channel", carol, telegram(chat_receiver.base_url)))[0] == 200
    sender = {"user_id": "alice", "agent": "lead-qualifier"}
    assert (await stack.call("PUT", f"/api/admin/channel/senders/{SENDER}", carol, sender))[0] == 200
    monkeypatch.setenv(ALLOW_ENV, "bots.internal, 10.0.0.0/8")
    await hello_bot(stack, message_id=5)
    async with db_engine.connect() as conn:  # the turn was followed to its end ...
        for _ in range(300):
            state = await conn.scalar(select(ChatTurn.state).where(ChatTurn.tenant_id == "acme"))
            if state == "done":
                break
            await conn.commit()
            await asyncio.sleep(0.1)
    assert state == "done"
    await asyncio.sleep(1)  # the post follows the claim
    assert chat_receiver.posts == []  # ... and nothing was posted to 127.0.0.1
