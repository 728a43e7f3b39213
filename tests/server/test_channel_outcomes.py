"""Every turn started from a chat ends in that chat (issue 51): a turn that waits for a person says
so, and its outcome (the reply after a reviewer's decision, approve or reject) is posted to the
chat it came from later, also by a server started again while it waited (chat_turns)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.server.app import running_server
from countersign.server.channels import TELEGRAM_SECRET_HEADER, WAITING
from tests.fixtures.approvals import ECHO_RESULT, lead_status, qualify
from tests.fixtures.chat import TOKEN, Receiver, posted, webhook
from tests.fixtures.inbox import SignedStack

SECRET = "webhook-secret-for-tests"
SENDER = "4242"
DONE = "[scripted model] done"


async def telegram_channel(stack: SignedStack, receiver: Receiver) -> None:
    carol = await stack.login("carol")
    channel = {"kind": "telegram", "name": "Sales group", "endpoint": receiver.base_url,
               "bot_token": TOKEN, "chat_id": "-100200", "webhook_secret": SECRET}  # fmt: skip
    assert (await stack.call("PUT", "/api/admin/channel", carol, channel))[0] == 200
    sender = {"user_id": "alice", "agent": "lead-qualifier"}
    assert (await stack.call("PUT", f"/api/admin/channel/senders/{SENDER}", carol, sender))[0] == 200


def said(update_id: int, text: str) -> bytes:
    message = {"message_id": update_id, "from": {"id": int(SENDER)}, "chat": {"id": -555}, "text": text}
    return json.dumps({"update_id": update_id, "message": message}).encode()


def texts(receiver: Receiver) -> list[tuple[str, Any]]:
    return [(p["json"]["chat_id"], p["json"]["text"]) for p in receiver.posts]


async def test_a_waiting_turn_says_so_and_its_outcome_reaches_the_chat_after_a_restart(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    jane_is_new: None,
) -> None:
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    await telegram_channel(stack, chat_receiver)
    settings = stack.agent.settings.model_copy(update={"proof_private_key": stack.keys.private})
    secret = {TELEGRAM_SECRET_HEADER: SECRET}

    async with running_server(settings, "127.0.0.1", 0, client=stack.agent.client) as first:
        code, answer = await webhook(first, "/channels/telegram/acme", said(90, "qualify jane"), secret)
        assert code == 200, answer
        workflow_id = answer["workflow_id"]
        stack.agent.track(workflow_id)
        await posted(chat_receiver)
        assert texts(chat_receiver) == [("-555", WAITING)]
    # the server that followed the turn has stopped while it waits; another one starts
    async with running_server(settings, "127.0.0.1", 0, client=stack.agent.client) as second:
        bob = await stack.login("bob")
        code, body = await stack.call(
            "POST", f"/api/approvals/{workflow_id}/c1", bob, {"decision": "approve"}
        )
        assert code == 200, body
        await posted(chat_receiver, 2)
        assert texts(chat_receiver) == [("-555", WAITING), ("-555", DONE)]
        assert await lead_status(db_engine, "acme") == "qualified"
        # the same update delivered again (to either server) posts nothing more
        assert (await webhook(second, "/channels/telegram/acme", said(90, "qualify jane"), secret))[0] == 200
    await posted(chat_receiver, 2)
    assert len(chat_receiver.posts) == 2


async def test_a_rejected_call_s_outcome_reaches_the_chat(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    jane_is_new: None,
) -> None:
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    await telegram_channel(stack, chat_receiver)
    code, answer = await webhook(
        stack.url, "/channels/telegram/acme", said(91, "qualify jane"), {TELEGRAM_SECRET_HEADER: SECRET}
    )
    assert code == 200, answer
    stack.agent.track(answer["workflow_id"])
    await posted(chat_receiver)
    bob = await stack.login("bob")
    decision = {"decision": "reject", "reason": "not yet"}
    code, body = await stack.call("POST", f"/api/approvals/{answer['workflow_id']}/c1", bob, decision)
    assert code == 200, body
    await posted(chat_receiver, 2)
    assert texts(chat_receiver) == [("-555", WAITING), ("-555", DONE)]
    assert await lead_status(db_engine, "acme") == "new"
