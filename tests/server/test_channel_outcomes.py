"""Every turn started from a chat ends in that chat (issue 51): a turn that waits for a person says
so, and its outcome (the reply after a reviewer's decision, approve or reject) is posted to the
chat it came from later, also by a server started again while it waited (chat_turns)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import RequesterAction, ToolExecution
from countersign.server.app import running_server
from countersign.server.channels import TELEGRAM_SECRET_HEADER, WAITING
from tests.fixtures.approvals import ECHO_RESULT, lead_status, qualify
from tests.fixtures.chat import TOKEN, Receiver, webhook
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import ApplyPolicies

SECRET = "webhook-secret-for-tests"
SENDER = "4242"
DONE = "[scripted model] done"
ASK = {
    "when": {"user_contains": "ask"},
    "reply": {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which lead?"}}]},
}
THANKS = {"when": {"after_tool": "ask_human"}, "reply": {"content": "thanks"}}
STATUS = 'Countersign::Action::"update_lead_status"'


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


async def started_in_chat(stack: SignedStack, update_id: int, text: str) -> str:
    """The turn the requester's message starts through the webhook: accepted and tracked; its
    workflow id."""
    code, answer = await webhook(
        stack.url, "/channels/telegram/acme", said(update_id, text), {TELEGRAM_SECRET_HEADER: SECRET}
    )
    assert code == 200, answer
    stack.agent.track(answer["workflow_id"])
    return str(answer["workflow_id"])


def texts(receiver: Receiver, chat: str = "-555") -> list[tuple[str, Any]]:
    """What was posted to the requester's chat (the review chat gets the cards)."""
    said = [p["json"] for p in receiver.posts if p["path"].endswith("/sendMessage")]
    return [(s["chat_id"], s["text"]) for s in said if s["chat_id"] == chat]


async def told(receiver: Receiver, count: int, chat: str = "-555") -> list[tuple[str, Any]]:
    for _ in range(300):
        if len(texts(receiver, chat)) >= count:
            return texts(receiver, chat)
        await asyncio.sleep(0.1)
    raise AssertionError(f"the receiver got {receiver.posts}")


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
        await told(chat_receiver, 1)
        assert texts(chat_receiver) == [("-555", WAITING)]
    # the server that followed the turn has stopped while it waits; another one starts
    async with running_server(settings, "127.0.0.1", 0, client=stack.agent.client) as second:
        bob = await stack.login("bob")
        code, body = await stack.call(
            "POST", f"/api/approvals/{workflow_id}/c1", bob, {"decision": "approve"}
        )
        assert code == 200, body
        await told(chat_receiver, 2)
        assert texts(chat_receiver) == [("-555", WAITING), ("-555", DONE)]
        assert await lead_status(db_engine, "acme") == "qualified"
        # the same update delivered again (to either server) posts nothing more
        assert (await webhook(second, "/channels/telegram/acme", said(90, "qualify jane"), secret))[0] == 200
    await asyncio.sleep(1)
    assert len(texts(chat_receiver)) == 2


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
    workflow_id = await started_in_chat(stack, 91, "qualify jane")
    await told(chat_receiver, 1)
    bob = await stack.login("bob")
    decision = {"decision": "reject", "reason": "not yet"}
    code, body = await stack.call("POST", f"/api/approvals/{workflow_id}/c1", bob, decision)
    assert code == 200, body
    await told(chat_receiver, 2)
    assert texts(chat_receiver) == [("-555", WAITING), ("-555", DONE)]
    assert await lead_status(db_engine, "acme") == "new"


REVIEWER = "77"  # bob's Telegram id, linked by the admin


def press(update_id: int, sender: str, card: str, decision: str = "a") -> bytes:
    query = {"id": f"q{update_id}", "from": {"id": int(sender)}, "data": f"cs:{card}:{decision}",
             "message": {"message_id": 1002, "chat": {"id": -100200}}}  # fmt: skip
    return json.dumps({"update_id": update_id, "callback_query": query}).encode()


async def executed(engine: AsyncEngine, workflow_id: str) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(
            select(func.count()).where(
                ToolExecution.workflow_id == workflow_id, ToolExecution.outcome == "executed"
            )
        )
    return int(count or 0)


def calls(receiver: Receiver, method: str) -> list[dict[str, Any]]:
    return [p["json"] for p in receiver.posts if p["path"].endswith(f"/{method}")]


async def test_the_card_reaches_the_review_chat_and_only_the_linked_reviewer_s_press_decides_once(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    jane_is_new: None,
) -> None:
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    await telegram_channel(stack, chat_receiver)
    carol = await stack.login("carol")
    bob = {"user_id": "bob", "agent": "lead-qualifier"}
    assert (await stack.call("PUT", f"/api/admin/channel/senders/{REVIEWER}", carol, bob))[0] == 200
    secret = {TELEGRAM_SECRET_HEADER: SECRET}
    workflow_id = await started_in_chat(stack, 92, "qualify jane")
    (card,) = [c for c in await told(chat_receiver, 1, "-100200")]
    (sent,) = [s for s in calls(chat_receiver, "sendMessage") if s["chat_id"] == "-100200"]
    assert "update_lead_status asked by alice (high risk)" in card[1] and "qualified" in card[1], card
    (buttons,) = sent["reply_markup"]["inline_keyboard"]
    assert [b["text"] for b in buttons] == ["Approve", "Reject", "Open in inbox"]
    assert buttons[2]["url"].endswith(f"/#{workflow_id}/c1")
    card_id = buttons[0]["callback_data"].split(":")[1]
    before = await executed(db_engine, workflow_id)  # the keyed conversation's earlier calls

    # the requester's own press, and an unlinked person's, decide nothing
    code, own = await webhook(stack.url, "/channels/telegram/acme", press(100, SENDER, card_id), secret)
    assert code == 200 and "refused" in own, own
    code, stranger = await webhook(stack.url, "/channels/telegram/acme", press(101, "999", card_id), secret)
    assert code == 200 and "decided" not in stranger, stranger
    answered = [a["text"] for a in calls(chat_receiver, "answerCallbackQuery")]
    assert answered[0].startswith("Nothing was decided") and "not linked" in answered[1], answered
    assert await lead_status(db_engine, "acme") == "new"

    # the linked reviewer's press approves, the call runs, and the outcome reaches the requester
    code, decided = await webhook(stack.url, "/channels/telegram/acme", press(102, REVIEWER, card_id), secret)
    assert (code, decided.get("decided")) == (200, "approved"), decided
    assert (await told(chat_receiver, 2))[1] == ("-555", DONE)
    assert await lead_status(db_engine, "acme") == "qualified"
    (edited,) = calls(chat_receiver, "editMessageText")
    assert edited["message_id"] == "1002" and "Approved by bob in telegram" in edited["text"], edited
    # the same press delivered again decides nothing more
    code, again = await webhook(stack.url, "/channels/telegram/acme", press(102, REVIEWER, card_id), secret)
    assert code == 200 and "refused" in again, again
    assert await executed(db_engine, workflow_id) == before + 1  # the call ran once


async def test_two_presses_complete_a_quorum_of_two_each_person_counted_once(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    jane_is_new: None,
    policies: ApplyPolicies,
) -> None:
    stack = signed_agent
    await policies(f'@id("two-for-status") @approvals("2") permit(principal, action == {STATUS}, resource);')
    stack.agent.script(qualify(), ECHO_RESULT)
    await telegram_channel(stack, chat_receiver)
    carol = await stack.login("carol")
    for sender, user in ((REVIEWER, "bob"), ("78", "carol")):
        linked = {"user_id": user, "agent": "lead-qualifier"}
        assert (await stack.call("PUT", f"/api/admin/channel/senders/{sender}", carol, linked))[0] == 200
    secret = {TELEGRAM_SECRET_HEADER: SECRET}
    await started_in_chat(stack, 93, "qualify jane")
    await told(chat_receiver, 1, "-100200")
    (sent,) = [s for s in calls(chat_receiver, "sendMessage") if s["chat_id"] == "-100200"]
    card_id = sent["reply_markup"]["inline_keyboard"][0][0]["callback_data"].split(":")[1]

    code, first = await webhook(stack.url, "/channels/telegram/acme", press(110, REVIEWER, card_id), secret)
    assert (code, first.get("decided")) == (200, "pending"), first  # one of two
    (edited,) = calls(chat_receiver, "editMessageText")  # says so, and keeps its buttons for the second
    assert "Approved by bob" in edited["text"] and edited["reply_markup"] == sent["reply_markup"], edited
    code, twice = await webhook(stack.url, "/channels/telegram/acme", press(111, REVIEWER, card_id), secret)
    assert code == 200 and "refused" in twice, twice  # bob counts once
    assert await lead_status(db_engine, "acme") == "new"
    code, second = await webhook(stack.url, "/channels/telegram/acme", press(112, "78", card_id), secret)
    assert (code, second.get("decided")) == (200, "approved"), second
    assert (await told(chat_receiver, 2))[1] == ("-555", DONE)
    assert await lead_status(db_engine, "acme") == "qualified"


async def test_a_question_goes_to_the_requester_s_chat_and_a_reply_answers_it(
    signed_agent: SignedStack, chat_receiver: Receiver, db_engine: AsyncEngine, chat_cleanup: None
) -> None:
    stack = signed_agent
    stack.agent.script(ASK, THANKS)
    await telegram_channel(stack, chat_receiver)
    secret = {TELEGRAM_SECRET_HEADER: SECRET}
    workflow_id = await started_in_chat(stack, 94, "ask me")
    shown = await told(chat_receiver, 2)
    assert shown == [("-555", WAITING), ("-555", "Which lead?\n(Reply to this message to answer.)")], shown
    reply = json.loads(said(95, "Jane Doe"))
    reply["message"]["reply_to_message"] = {"message_id": 1002, "text": "Which lead?"}
    code, answered = await webhook(stack.url, "/channels/telegram/acme", json.dumps(reply).encode(), secret)
    assert code == 200 and answered.get("answered"), answered
    assert (await told(chat_receiver, 3))[2] == ("-555", "[scripted model] thanks")
    code, transcript = await stack.call(
        "GET", f"/api/conversations/{workflow_id}/transcript", await stack.login("alice")
    )
    assert code == 200 and "Jane Doe" in json.dumps([m for m in transcript if m["role"] == "tool"])


async def test_a_thumbs_up_in_the_chat_rates_the_last_reply_as_the_linked_user(
    signed_agent: SignedStack, chat_receiver: Receiver, db_engine: AsyncEngine, chat_cleanup: None
) -> None:
    """People rate replies from a chat app (issue 53): "👍" (or "👎", "/helpful", "+1"…) with an
    optional comment rates the last reply of the sender's conversation, as the user the sender map
    links them to, through the same path as the API (one rating per reply, replaced, audited); an
    unlinked sender rates nothing; nothing starts a model turn."""
    stack = signed_agent
    stack.agent.script({"when": {"user_contains": "hello"}, "reply": {"content": "hi there"}})
    await telegram_channel(stack, chat_receiver)
    secret = {TELEGRAM_SECRET_HEADER: SECRET}
    workflow_id = await started_in_chat(stack, 95, "hello bot")
    await told(chat_receiver, 1)
    requests_before = len(stack.agent.model.requests)

    code, rated = await webhook(stack.url, "/channels/telegram/acme", said(96, "👍 very clear"), secret)
    assert code == 200 and rated["rated"] == 1, rated
    assert (await told(chat_receiver, 2))[-1] == ("-555", "Thanks: the last reply is rated helpful.")
    code, rated = await webhook(stack.url, "/channels/telegram/acme", said(97, "👎"), secret)
    assert code == 200 and rated["rated"] == 1, rated
    await told(chat_receiver, 3)

    alice = await stack.login("alice")
    code, ratings = await stack.call("GET", f"/api/conversations/{workflow_id}/ratings", alice)
    assert code == 200, ratings
    assert [(r["turn"], r["rating"]) for r in ratings] == [(1, "not_helpful")]  # replaced, one per reply
    assert len(stack.agent.model.requests) == requests_before  # a rating is no message to the model

    stranger = json.dumps(
        {
            "update_id": 98,
            "message": {"message_id": 98, "from": {"id": 777}, "chat": {"id": -9}, "text": "👍"},
        }
    ).encode()
    assert (await webhook(stack.url, "/channels/telegram/acme", stranger, secret))[0] == 200
    code, ratings = await stack.call("GET", f"/api/conversations/{workflow_id}/ratings", alice)
    assert [(r["turn"], r["rating"]) for r in ratings] == [(1, "not_helpful")]
    async with db_engine.connect() as conn:
        recorded = (
            await conn.execute(
                select(RequesterAction.via, RequesterAction.status).where(
                    RequesterAction.workflow_id == workflow_id, RequesterAction.action == "rate"
                )
            )
        ).all()
    assert [tuple(r) for r in recorded if r.via == "chat"] == [("chat", 200), ("chat", 200)], recorded


async def test_a_reject_press_asks_for_the_reason_and_the_reply_to_that_prompt_rejects_with_it_once(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    jane_is_new: None,
) -> None:
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    await telegram_channel(stack, chat_receiver)
    carol = await stack.login("carol")
    bob = {"user_id": "bob", "agent": "lead-qualifier"}
    assert (await stack.call("PUT", f"/api/admin/channel/senders/{REVIEWER}", carol, bob))[0] == 200
    secret = {TELEGRAM_SECRET_HEADER: SECRET}
    await started_in_chat(stack, 120, "qualify jane")
    await told(chat_receiver, 1, "-100200")
    (sent,) = [s for s in calls(chat_receiver, "sendMessage") if s["chat_id"] == "-100200"]
    card_id = sent["reply_markup"]["inline_keyboard"][0][1]["callback_data"].split(":")[1]

    code, asked = await webhook(
        stack.url, "/channels/telegram/acme", press(121, REVIEWER, card_id, "r"), secret
    )
    assert (code, asked.get("asked")) == (200, "reason"), asked
    (index,) = [
        i for i, p in enumerate(chat_receiver.posts) if "force_reply" in p["json"].get("reply_markup", {})
    ]
    assert chat_receiver.posts[index]["json"]["text"].startswith("Why reject update_lead_status?")
    assert await lead_status(db_engine, "acme") == "new" and not calls(chat_receiver, "editMessageText")

    reason = {"update_id": 122, "message": {
        "message_id": 122, "from": {"id": int(REVIEWER)}, "chat": {"id": -100200}, "text": "no budget yet",
        "reply_to_message": {"message_id": 1001 + index}}}  # fmt: skip
    body = json.dumps(reason).encode()
    code, rejected = await webhook(stack.url, "/channels/telegram/acme", body, secret)
    assert (code, rejected.get("decided")) == (200, "rejected"), rejected
    assert (await told(chat_receiver, 2))[1] == ("-555", DONE)
    (edited,) = calls(chat_receiver, "editMessageText")
    assert "Rejected by bob in telegram (no budget yet)" in edited["text"], edited
    # the same reply delivered again decides nothing, and is no message to the agent either
    code, again = await webhook(stack.url, "/channels/telegram/acme", body, secret)
    assert again == {"ok": True, "ignored": "a reason given before"}, again
    assert await lead_status(db_engine, "acme") == "new"
