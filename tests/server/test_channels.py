"""A chat channel writes to an agent: a Telegram-compatible update (and a Slack-compatible event)
posted to the server's webhook reaches the mapped user's conversation through the front door, and
the agent's reply comes back to the same chat on a local receiver (tests.fixtures.chat). Requests
without the channel's secret are refused and recorded; the channel is set through the admin API."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.shown import fold_mark
from countersign.db.schema import InputAudit
from countersign.server.channels import (
    TELEGRAM_SECRET_HEADER,
    slack_message,
    slack_signature,
    slack_signature_holds,
    telegram_message,
)
from countersign.server.chat_render import REPLY_CHARS
from tests.fixtures.chat import HOOK, TOKEN, Receiver, posted, webhook
from tests.fixtures.inbox import SignedStack

HELLO = {"when": {"user_contains": "hello"}, "reply": {"content": "hi there"}}
HI = "[scripted model] hi there"
SECRET = "webhook-secret-for-tests"
SENDER = "4242"


async def refusals(engine: AsyncEngine, kind: str) -> int:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(InputAudit.id).where(
                InputAudit.action == f"chat_webhook:{kind}", InputAudit.tenant_id == "acme"
            )
        )
        return len(rows.all())


async def set_up(stack: SignedStack, channel: dict[str, Any]) -> None:
    carol, alice = await stack.login("carol"), await stack.login("alice")
    assert (await stack.call("PUT", "/api/admin/channel", alice, channel))[0] == 403  # not an admin
    code, shown = await stack.call("PUT", "/api/admin/channel", carol, channel)
    assert code == 200 and shown["inbound"], shown
    assert SECRET not in json.dumps(shown) and TOKEN not in json.dumps(shown) and "endpoint" not in shown
    sender = {"user_id": "alice", "agent": "lead-qualifier"}
    code, mapped = await stack.call("PUT", f"/api/admin/channel/senders/{SENDER}", carol, sender)
    assert code == 200, mapped
    assert (await stack.call("PUT", "/api/admin/channel/senders/9", carol, {**sender, "user_id": "zed"}))[
        0
    ] == 422


async def hello_bot(stack: SignedStack, message_id: int) -> str:
    """The sender's "hello bot" (update 78) posted to acme's Telegram webhook with its secret:
    accepted and tracked; its workflow id."""
    update = {"update_id": 78, "message": {"message_id": message_id, "from": {"id": int(SENDER)},
                                          "chat": {"id": -555}, "text": "hello bot"}}  # fmt: skip
    code, answer = await webhook(
        stack.url, "/channels/telegram/acme", json.dumps(update).encode(), {TELEGRAM_SECRET_HEADER: SECRET}
    )
    assert code == 200, answer
    stack.agent.track(answer["workflow_id"])
    return str(answer["workflow_id"])


async def test_a_telegram_message_reaches_the_mapped_user_and_the_reply_comes_back(
    signed_agent: SignedStack, chat_receiver: Receiver, db_engine: AsyncEngine, chat_cleanup: None
) -> None:
    stack = signed_agent
    url = stack.url
    stack.agent.script(HELLO)
    channel = {"kind": "telegram", "name": "Sales group", "endpoint": chat_receiver.base_url,
               "bot_token": TOKEN, "chat_id": "-100200", "webhook_secret": SECRET}  # fmt: skip
    await set_up(stack, channel)
    update = {"update_id": 77, "message": {"message_id": 5, "from": {"id": int(SENDER)},
                                          "chat": {"id": -555}, "text": "hello bot"}}  # fmt: skip
    body = json.dumps(update).encode()

    before = await refusals(db_engine, "telegram")
    for headers in ({}, {TELEGRAM_SECRET_HEADER: "guess"}):
        assert (await webhook(url, "/channels/telegram/acme", body, headers))[0] == 401
    assert before + 1 <= await refusals(db_engine, "telegram") <= before + 2  # one a minute per source
    # a tenant name nobody has a channel under: 404, and nothing recorded under a name of the caller's
    assert (await webhook(url, "/channels/telegram/no-such-tenant", body, {}))[0] == 404
    assert before + 1 <= await refusals(db_engine, "telegram") <= before + 2
    assert chat_receiver.posts == []

    # a colleague cannot take the sender's conversation key first (it would be theirs, and the
    # sender's messages would answer 409 for good), nor an MCP client's (issue 53, item 4)
    carol = await stack.login("carol")
    for key in (f"telegram_{SENDER}", f"slack_{SENDER}", "mcp:1:alice:lead-qualifier"):
        squat = {"agent": "lead-qualifier", "message": "mine now", "key": key}
        code, said = await stack.call("POST", "/api/conversations", carol, squat)
        assert code == 403 and "keeps for a chat sender or an MCP client" in said["error"], said

    code, answer = await webhook(url, "/channels/telegram/acme", body, {TELEGRAM_SECRET_HEADER: SECRET})
    assert code == 200 and answer["workflow_id"] == "conv-acme-key-telegram_4242", answer
    stack.agent.track(answer["workflow_id"])
    (reply,) = await posted(chat_receiver)
    assert reply["path"] == f"/bot{TOKEN}/sendMessage"
    assert reply["json"] == {"chat_id": "-555", "text": HI}  # to the chat it came from
    async with db_engine.connect() as conn:  # what the admin API stored: sealed
        raw = repr((await conn.execute(text("SELECT * FROM chat_channels"))).all())
    assert "Sales group" in raw and SECRET not in raw and TOKEN not in raw
    status, transcript = await stack.call(
        "GET", f"/api/conversations/{answer['workflow_id']}/transcript", await stack.login("alice")
    )
    assert status == 200 and "hello bot" in [m.get("content") for m in transcript if m["role"] == "user"]

    # the same update delivered again is answered once: one user message in the conversation
    assert (await webhook(url, "/channels/telegram/acme", body, {TELEGRAM_SECRET_HEADER: SECRET}))[0] == 200
    await asyncio.sleep(1)
    status, transcript = await stack.call(
        "GET", f"/api/conversations/{answer['workflow_id']}/transcript", await stack.login("alice")
    )
    assert [m.get("content") for m in transcript if m["role"] == "user"].count("hello bot") == 1


async def test_a_reply_longer_than_one_chat_message_is_folded_with_a_link_to_the_whole(
    signed_agent: SignedStack, chat_receiver: Receiver, chat_cleanup: None
) -> None:
    """Nothing cut silently (issue 48 item 3): the end of a long reply is not dropped unsaid."""
    stack = signed_agent
    long = "a long answer; " * 300 + "P.S. the end"
    stack.agent.script({"when": {"user_contains": "hello"}, "reply": {"content": long}})
    channel = {"kind": "telegram", "name": "Sales group", "endpoint": chat_receiver.base_url,
               "bot_token": TOKEN, "chat_id": "-100200", "webhook_secret": SECRET}  # fmt: skip
    await set_up(stack, channel)
    await hello_bot(stack, message_id=6)
    (reply,) = await posted(chat_receiver)
    whole = f"[scripted model] {long}"
    head, link = reply["json"]["text"].split("\nThe whole of it: ")
    assert head == whole[:REPLY_CHARS] + fold_mark(len(whole) - REPLY_CHARS)
    assert link == f"{stack.agent.settings.inbox_url}/chat" and len(reply["json"]["text"]) <= 4_096


async def test_a_slack_event_is_verified_by_its_signature_and_answered_through_the_webhook(
    signed_agent: SignedStack, chat_receiver: Receiver, db_engine: AsyncEngine, chat_cleanup: None
) -> None:
    stack = signed_agent
    url = stack.url
    stack.agent.script(HELLO)
    channel = {"kind": "slack", "name": "#sales", "endpoint": f"{chat_receiver.base_url}{HOOK}",
               "webhook_secret": SECRET}  # fmt: skip
    await set_up(stack, channel)

    def signed(
        payload: dict[str, Any], secret: str = SECRET, at: float | None = None
    ) -> tuple[bytes, dict[str, str]]:
        body, stamp = json.dumps(payload).encode(), str(int(at or time.time()))
        return body, {
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": slack_signature(secret, stamp, body),
        }

    challenge = {"type": "url_verification", "challenge": "abc123"}
    assert await webhook(url, "/channels/slack/acme", *signed(challenge)) == (
        200,
        {"challenge": "abc123"},
    )
    said = {"type": "message", "user": SENDER, "channel": "C1", "text": "hello from slack"}
    event = {"type": "event_callback", "event_id": "Ev1", "event": said}
    before = await refusals(db_engine, "slack")
    assert (await webhook(url, "/channels/slack/acme", *signed(event, secret="another-secret")))[0] == 401
    assert (await webhook(url, "/channels/slack/acme", *signed(event, at=time.time() - 3600)))[0] == 401
    assert before + 1 <= await refusals(db_engine, "slack") <= before + 2

    code, answer = await webhook(url, "/channels/slack/acme", *signed(event))
    assert code == 200, answer
    stack.agent.track(answer["workflow_id"])
    (reply,) = await posted(chat_receiver)
    assert reply["path"] == HOOK and reply["json"] == {"text": HI}


def test_what_a_channel_sends_is_read_without_raising() -> None:
    junks: tuple[Any, ...] = (None, [], {"message": "x"}, {"message": {"text": 3}}, {"update_id": True})
    for junk in junks:
        assert telegram_message(junk) is None
        assert slack_message(junk) is None
    bot = {
        "event": {"type": "message", "bot_id": "B1", "user": "U", "channel": "C", "text": "hi"},
        "event_id": "E",
    }
    assert slack_message(bot) is None  # our own reply, echoed back: never a new message
    assert not slack_signature_holds(SECRET, "not-a-number", "v0=00", b"{}", time.time())
    assert not slack_signature_holds(None, "1", "v0=00", b"{}", 1.0)
