"""Slack as a full surface (issue 51), end to end against the Slack-Web-API-compatible chat API
served in the test (tests.fixtures.chat, real HTTP) and the server's real signature checks: a
message starts a turn, its outcome goes back to the message's thread; the call's Block Kit card
reaches the review channel with Approve, Reject and Open in inbox; a press on the signed
interactions endpoint decides as the linked person through the inbox's decision path (the
requester's press and an unlinked person's decide nothing, a redelivered press decides once, two
people complete a quorum of two), and the card is updated to say who decided; Reject asks for the
reason, and the reply in the card's thread rejects with it; a question is answered in the thread;
the tenant's setting keeps a risk to the inbox."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import ApprovalDecision, ChatCard
from countersign.server.channels import WAITING
from tests.fixtures.approvals import ECHO_RESULT, lead_status, qualify
from tests.fixtures.chat import SLACK_API, SLACK_TOKEN, Receiver, slack_press, slack_signed, webhook
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import ApplyPolicies
from tests.server.test_channel_outcomes import ASK, DONE, STATUS, THANKS, executed

SECRET = "slack-signing-secret-for-tests"
SENDER, REVIEWER, SECOND = "UALICE", "UBOB", "UCAROL"  # Slack user ids, linked by the admin
ROOM, REVIEWS = "C555", "CREVIEW"  # where alice writes; the review channel cards go to


async def slack_app(stack: SignedStack, receiver: Receiver, **links: str) -> None:
    """acme's Slack app on the receiver's Web API, and its senders linked, through the admin API."""
    carol = await stack.login("carol")
    channel = {"kind": "slack", "name": "#sales", "endpoint": f"{receiver.base_url}{SLACK_API}",
               "bot_token": SLACK_TOKEN, "chat_id": REVIEWS, "webhook_secret": SECRET}  # fmt: skip
    code, shown = await stack.call("PUT", "/api/admin/channel", carol, channel)
    assert code == 200 and SLACK_TOKEN not in json.dumps(shown), shown
    for sender, user in {SENDER: "alice", **links}.items():
        linked = {"user_id": user, "agent": "lead-qualifier"}
        assert (await stack.call("PUT", f"/api/admin/channel/senders/{sender}", carol, linked))[0] == 200


async def says(
    stack: SignedStack, n: int, text: str, thread: str | None = None, user: str = SENDER, channel: str = ROOM
) -> Any:
    """`user`'s message (in `thread`, when given) delivered to the signed events endpoint."""
    event = {"type": "message", "user": user, "channel": channel, "text": text, "ts": f"1800000000.{n:06d}"}
    if thread is not None:
        event["thread_ts"] = thread
    body = json.dumps({"type": "event_callback", "event_id": f"Ev{n}", "event": event}).encode()
    code, answer = await webhook(stack.url, "/channels/slack/acme", body, slack_signed(body, SECRET))
    assert code == 200, answer
    if "workflow_id" in answer and "answered" not in answer:
        stack.agent.track(answer["workflow_id"])
    return answer


def posts(receiver: Receiver, method: str, channel: str | None = None) -> list[dict[str, Any]]:
    said = [p["json"] for p in receiver.posts if p["path"] == f"{SLACK_API}/{method}"]
    return [s for s in said if channel is None or s.get("channel") == channel]


async def until(
    receiver: Receiver, method: str, count: int, channel: str | None = None
) -> list[dict[str, Any]]:
    for _ in range(300):
        if len(found := posts(receiver, method, channel)) >= count:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"the receiver got {receiver.posts}")


def press(user: str, card: dict[str, Any], action: str) -> dict[str, Any]:
    """Slack's `block_actions` payload of `user` pressing the card's button `action`."""
    (button,) = [b for b in card["blocks"][1]["elements"] if b["action_id"] == action]
    return {"type": "block_actions", "user": {"id": user}, "actions": [dict(button, action_ts="1.1")],
            "container": {"type": "message", "channel_id": REVIEWS, "message_ts": card["ts"]}}  # fmt: skip


async def the_card(receiver: Receiver) -> dict[str, Any]:
    """The card posted to the review channel, with the `ts` the API answered it with."""
    await until(receiver, "chat.postMessage", 1, REVIEWS)
    (index,) = [i for i, p in enumerate(receiver.posts) if p["json"].get("channel") == REVIEWS]
    return dict(receiver.posts[index]["json"], ts=f"1700000000.{index + 1:06d}")


async def test_a_slack_card_is_decided_once_by_the_linked_reviewer_and_the_outcome_reaches_the_thread(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    jane_is_new: None,
) -> None:
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    await slack_app(stack, chat_receiver, **{REVIEWER: "bob"})
    workflow_id = (await says(stack, 1, "qualify jane"))["workflow_id"]
    thread = "1800000000.000001"  # the outcome goes to the thread of alice's message
    (waiting,) = await until(chat_receiver, "chat.postMessage", 1, ROOM)
    assert (waiting["text"], waiting["thread_ts"]) == (WAITING, thread), waiting
    card = await the_card(chat_receiver)
    lines = card["blocks"][0]["text"]
    assert lines["type"] == "plain_text" and "update_lead_status asked by alice (high risk)" in lines["text"]
    assert "qualified" in lines["text"], lines
    buttons = card["blocks"][1]["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Approve", "Reject", "Open in inbox"]
    assert buttons[2]["url"].endswith(f"/#{workflow_id}/c1")
    before = await executed(db_engine, workflow_id)

    # the requester's own press, an unlinked person's and an unsigned one decide nothing
    code, own = await slack_press(stack.url, "acme", press(SENDER, card, "approve"), SECRET)
    assert code == 200 and "refused" in own, own
    code, stranger = await slack_press(stack.url, "acme", press("UNOBODY", card, "approve"), SECRET)
    assert code == 200 and "decided" not in stranger, stranger
    assert (await slack_press(stack.url, "acme", press(REVIEWER, card, "approve"), "a-guess"))[0] == 401
    told = [(e["user"], e["text"]) for e in posts(chat_receiver, "chat.postEphemeral")]
    assert told[0][0] == SENDER and told[0][1].startswith("Nothing was decided"), told
    assert told[1][0] == "UNOBODY" and "not linked" in told[1][1], told
    assert await lead_status(db_engine, "acme") == "new"

    # the linked reviewer's press approves; the call runs; the card says so; the outcome reaches alice
    code, decided = await slack_press(stack.url, "acme", press(REVIEWER, card, "approve"), SECRET)
    assert (code, decided.get("decided")) == (200, "approved"), decided
    outcome = (await until(chat_receiver, "chat.postMessage", 2, ROOM))[1]
    assert (outcome["text"], outcome["thread_ts"]) == (DONE, thread), outcome
    assert await lead_status(db_engine, "acme") == "qualified"
    (updated,) = posts(chat_receiver, "chat.update")
    assert updated["ts"] == card["ts"] and updated["channel"] == REVIEWS
    assert "Approved by bob in slack" in updated["blocks"][0]["text"]["text"] and len(updated["blocks"]) == 1
    # the same press delivered again decides nothing more
    code, again = await slack_press(stack.url, "acme", press(REVIEWER, card, "approve"), SECRET)
    assert code == 200 and "refused" in again, again
    assert await executed(db_engine, workflow_id) == before + 1


async def test_two_slack_presses_complete_a_quorum_of_two_each_person_counted_once(
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
    await slack_app(stack, chat_receiver, **{REVIEWER: "bob", SECOND: "carol"})
    await says(stack, 2, "qualify jane")
    card = await the_card(chat_receiver)
    code, first = await slack_press(stack.url, "acme", press(REVIEWER, card, "approve"), SECRET)
    assert (code, first.get("decided")) == (200, "pending"), first
    (updated,) = posts(chat_receiver, "chat.update")  # says bob approved, and keeps its buttons for carol
    assert "Approved by bob in slack" in updated["blocks"][0]["text"]["text"], updated
    assert [b["action_id"] for b in updated["blocks"][1]["elements"]] == ["approve", "reject", "open"]
    code, twice = await slack_press(stack.url, "acme", press(REVIEWER, card, "approve"), SECRET)
    assert code == 200 and "refused" in twice, twice  # bob counts once
    assert await lead_status(db_engine, "acme") == "new"
    code, second = await slack_press(stack.url, "acme", press(SECOND, card, "approve"), SECRET)
    assert (code, second.get("decided")) == (200, "approved"), second
    assert (await until(chat_receiver, "chat.postMessage", 2, ROOM))[1]["text"] == DONE
    assert await lead_status(db_engine, "acme") == "qualified"


async def test_a_slack_reject_asks_for_the_reason_and_the_reply_in_the_card_s_thread_rejects_with_it_once(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    jane_is_new: None,
) -> None:
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    await slack_app(stack, chat_receiver, **{REVIEWER: "bob"})
    workflow_id = (await says(stack, 3, "qualify jane"))["workflow_id"]
    card = await the_card(chat_receiver)
    before = len(await decisions(db_engine, workflow_id))  # the keyed conversation's earlier ones
    code, asked = await slack_press(stack.url, "acme", press(REVIEWER, card, "reject"), SECRET)
    assert (code, asked.get("asked")) == (200, "reason"), asked
    (prompt,) = [p for p in posts(chat_receiver, "chat.postMessage", REVIEWS) if p.get("thread_ts")]
    assert prompt["thread_ts"] == card["ts"] and prompt["text"].startswith(f"<@{REVIEWER}> Why reject"), (
        prompt
    )
    assert len(await decisions(db_engine, workflow_id)) == before  # nothing decided before the reason

    answer = await says(
        stack, 4, "not before the budget call", thread=card["ts"], user=REVIEWER, channel=REVIEWS
    )
    assert answer.get("decided") == "rejected", answer
    again = await says(
        stack, 4, "not before the budget call", thread=card["ts"], user=REVIEWER, channel=REVIEWS
    )
    assert again == {"ok": True, "ignored": "a reason given before"}
    assert (await decisions(db_engine, workflow_id))[before:] == [
        ("reject", "not before the budget call (decided in slack (#sales))")
    ]
    assert (await until(chat_receiver, "chat.postMessage", 2, ROOM))[1]["text"] == DONE
    assert await lead_status(db_engine, "acme") == "new"
    (updated,) = posts(chat_receiver, "chat.update")
    assert "Rejected by bob in slack (not before the budget call)" in updated["blocks"][0]["text"]["text"]


async def decisions(engine: AsyncEngine, workflow_id: str) -> list[tuple[str, str | None]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(ApprovalDecision.decision, ApprovalDecision.reason, ApprovalDecision.accepted).where(
                ApprovalDecision.workflow_id == workflow_id
            )
        )
        return [(r.decision, r.reason) for r in rows.all() if r.accepted]


async def test_a_slack_question_goes_to_the_thread_and_a_reply_there_answers_it(
    signed_agent: SignedStack, chat_receiver: Receiver, db_engine: AsyncEngine, chat_cleanup: None
) -> None:
    stack = signed_agent
    stack.agent.script(ASK, THANKS)
    await slack_app(stack, chat_receiver)
    workflow_id = (await says(stack, 5, "ask me"))["workflow_id"]
    thread = "1800000000.000005"
    shown = await until(chat_receiver, "chat.postMessage", 2, ROOM)
    assert [(s["text"], s["thread_ts"]) for s in shown] == [
        (WAITING, thread), ("Which lead?\n(Reply in this thread to answer.)", thread),
    ]  # fmt: skip
    answered = await says(stack, 6, "Jane Doe", thread=thread)
    assert answered.get("answered"), answered
    final = (await until(chat_receiver, "chat.postMessage", 3, ROOM))[2]
    assert (final["text"], final["thread_ts"]) == ("[scripted model] thanks", thread), final
    code, transcript = await stack.call(
        "GET", f"/api/conversations/{workflow_id}/transcript", await stack.login("alice")
    )
    assert code == 200 and "Jane Doe" in json.dumps([m for m in transcript if m["role"] == "tool"])


async def test_the_tenant_s_setting_keeps_a_risk_to_the_inbox(
    signed_agent: SignedStack,
    chat_receiver: Receiver,
    db_engine: AsyncEngine,
    chat_cleanup: None,
    jane_is_new: None,
) -> None:
    """An admin keeps high-risk calls to the inbox: the card has only "Open in inbox", and a press
    made up from another card's buttons decides nothing."""
    stack = signed_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    await slack_app(stack, chat_receiver, **{REVIEWER: "bob"})
    carol, alice = await stack.login("carol"), await stack.login("alice")
    assert (await stack.call("PUT", "/api/admin/channel/decides", alice, {"up_to": "medium"}))[0] == 403
    code, shown = await stack.call("PUT", "/api/admin/channel/decides", carol, {"up_to": "medium"})
    assert code == 200 and shown["decides_up_to"] == "medium", shown
    await says(stack, 7, "qualify jane")
    card = await the_card(chat_receiver)
    assert [b["text"]["text"] for b in card["blocks"][1]["elements"]] == ["Open in inbox"]
    forged = press(REVIEWER, card, "open")
    forged["actions"] = [{"action_id": "approve", "value": f"cs:{await card_id(db_engine)}:a"}]
    code, answer = await slack_press(stack.url, "acme", forged, SECRET)
    assert code == 200 and "inbox only" in answer.get("refused", ""), answer
    assert await lead_status(db_engine, "acme") == "new"


async def card_id(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(ChatCard.id).where(ChatCard.tenant_id == "acme")) or 0)
