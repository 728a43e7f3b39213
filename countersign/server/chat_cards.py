"""Review cards in a chat (issue 51): a call a turn started from the chat waits on, posted to the
channel's review chat with Approve, Reject and Open in inbox (countersign.server.chat_render draws
it for Telegram and Slack alike), and what a press does.

A press decides as the presser's linked user through the inbox's decision path (`decide_card`:
Inbox.decide, the same admission, four-eyes, quorum, single use and server-issued proof), only for
a risk up to the tenant's `decides_up_to`; Reject first asks the presser for the reason
(`ask_reason`: Telegram's force_reply, a message in the Slack card's thread; the ask kept in
`chat_reason_asks`) and their reply rejects with it (`reason_given`). The presser is told what came
of it, and the card is edited to say who decided (keeping its buttons while a quorum waits).
The channel's API is called on its endpoint, checked like every post (`api_call`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from aiohttp import web
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert

from countersign.db.schema import ChatCard, ChatChannel, ChatReasonAsk, ChatTurn
from countersign.runtime.endpoints import EndpointRefused, check_endpoint
from countersign.server.auth import Reviewer
from countersign.server.chat_render import (
    Press,
    card_text,
    chat_text,
    decided_text,
    may_decide,
    slack_card,
    slack_decided,
    telegram_keyboard,
)
from countersign.server.door import REQUESTERS
from countersign.server.http import HttpRefusal
from countersign.server.inbox import DecisionRequest
from countersign.server.inbox_routes import INBOX
from countersign.server.requesters import Requesters
from tools.chat import POST_TIMEOUT_S, slack_api, slack_auth, slack_escaped

log = logging.getLogger(__name__)


def card_link(requesters: Requesters, workflow_id: str, call_id: str) -> str:
    """The call's card in the inbox."""
    return f"{requesters.inbox_url}/#{workflow_id}/{call_id}"


RECORDED_TRIES = 25  # 5 s for a pending call's record to be read
REASON_CHARS = 1_500  # of a Reject's reason given in the chat (the decision's reason takes 2,000)


def cards_go(channel: ChatChannel | None) -> bool:
    """Whether the channel can post cards with buttons: Telegram's bot, or a Slack app's bot token
    (an incoming webhook alone cannot), to a review chat."""
    return (
        channel is not None
        and channel.chat_id is not None
        and (channel.kind == "telegram" or slack_api(channel))
    )


async def api_call(channel: ChatChannel, method: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """One method of the channel's API on its endpoint (checked like every post): Telegram's Bot
    API (`{endpoint}/bot{token}/{method}`; its `result`) or Slack's Web API
    (`{endpoint}/{method}`, the bot token as a bearer token; its answer). None when it failed
    (logged without the URL or headers: they hold the token)."""
    base = channel.endpoint.rstrip("/")
    telegram = channel.kind == "telegram"
    url = f"{base}/bot{channel.bot_token}/{method}" if telegram else f"{base}/{method}"
    try:
        await check_endpoint(url)
        async with httpx.AsyncClient(timeout=POST_TIMEOUT_S) as http:
            response = await http.post(url, json=body, headers={} if telegram else slack_auth(channel))
        answer = response.json() if response.status_code < 300 else None
    except (EndpointRefused, httpx.HTTPError, ValueError) as err:
        log.warning("%s %s for %s failed: %s", channel.kind, method, channel.tenant_id, type(err).__name__)
        return None
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        log.warning("%s %s for %s was refused", channel.kind, method, channel.tenant_id)
        return None
    result = answer.get("result") if telegram else answer
    return result if isinstance(result, dict) else {}


def message_ref(channel: ChatChannel, sent: dict[str, Any] | None) -> str | None:
    """The channel's id of a message it took: Telegram's `message_id`, Slack's `ts`."""
    ref = (sent or {}).get("message_id" if channel.kind == "telegram" else "ts")
    return None if ref is None else str(ref)[:100]


async def post_cards(app: web.Application, turn: ChatTurn, pending: list[str]) -> None:
    """Post each pending call of `turn` as a card to the channel's review chat (once per call)."""
    async with app[REQUESTERS].sessions() as session:
        channel = await session.get(ChatChannel, turn.tenant_id)
    if channel is None or not cards_go(channel):
        return  # a Slack incoming webhook has no buttons: the card is in the inbox
    for call_id in pending:
        await post_card(app, channel, turn.workflow_id, call_id)


async def post_card(app: web.Application, channel: ChatChannel, workflow_id: str, call_id: str) -> None:
    requesters, inbox = app[REQUESTERS], app[INBOX]
    item = await inbox.recorded(channel.tenant_id, workflow_id, call_id)
    for _ in range(RECORDED_TRIES):  # the status can tell of the call before its record commits
        if item is not None:
            break
        await asyncio.sleep(0.2)
        item = await inbox.recorded(channel.tenant_id, workflow_id, call_id)
    if item is None or channel.chat_id is None:
        return  # decided or expired meanwhile
    async with requesters.sessions.begin() as session:
        card = await session.scalar(
            insert(ChatCard)
            .values(tenant_id=channel.tenant_id, workflow_id=workflow_id, call_id=call_id, nonce=item.nonce,
                    chat=channel.chat_id)
            .on_conflict_do_nothing()
            .returning(ChatCard.id)
        )  # fmt: skip
    if card is None:
        return  # posted before
    link, text = card_link(requesters, workflow_id, call_id), card_text(item)
    decides = may_decide(item.risk, channel.decides_up_to)
    if channel.kind == "telegram":
        markup = telegram_keyboard(card, decides, link)
        sent = await api_call(
            channel,
            "sendMessage",
            {"chat_id": channel.chat_id, "text": chat_text(text, link), "reply_markup": markup},
        )
    else:
        sent = await api_call(
            channel, "chat.postMessage", {"channel": channel.chat_id, **slack_card(text, card, decides, link)}
        )
    if (ref := message_ref(channel, sent)) is not None:
        async with requesters.sessions.begin() as session:
            await session.execute(update(ChatCard).where(ChatCard.id == card).values(remote_id=ref))


async def tell(
    channel: ChatChannel, chat: str | None, sender: str, text: str, query_id: str | None = None
) -> None:
    """Tell the person who pressed or replied what came of it: Telegram shows a press's answer over
    the chat (`answerCallbackQuery`, at most 200 characters) and says anything else in the chat;
    Slack says it to them alone (`chat.postEphemeral`)."""
    if query_id is not None:
        await api_call(channel, "answerCallbackQuery", {"callback_query_id": query_id, "text": text[:190]})
    elif chat is None:
        return
    elif channel.kind == "telegram":
        await api_call(channel, "sendMessage", {"chat_id": chat, "text": text})
    else:
        await api_call(
            channel, "chat.postEphemeral", {"channel": chat, "user": sender, "text": slack_escaped(text)}
        )


async def edit_card(
    channel: ChatChannel, chat: str, ref: str, text: str, link: str, card: int | None
) -> None:
    """The card's message, now saying who decided and what became of the call: no buttons left
    once it is decided, or still its buttons (`card`) while a quorum waits for more approvers."""
    if channel.kind == "telegram":
        body: dict[str, Any] = {"chat_id": chat, "message_id": ref, "text": chat_text(text, link)}
        if card is not None:
            body["reply_markup"] = telegram_keyboard(card, True, link)
        await api_call(channel, "editMessageText", body)
    else:
        shown = slack_decided(text, link) if card is None else slack_card(text, card, True, link)
        await api_call(channel, "chat.update", {"channel": chat, "ts": ref, **shown})


async def card_pressed(
    app: web.Application, channel: ChatChannel, press: Press, card: ChatCard, user_id: str
) -> dict[str, Any]:
    """A card's button, pressed by the sender linked to `user_id`: Approve decides through the
    inbox's decision path (`decide_card`); Reject asks the presser for the reason first
    (`ask_reason`)."""
    if press.decision == "reject":
        return await ask_reason(app, channel, press, card)
    return await decide_card(app, channel, card, user_id, press, None)


async def decide_card(
    app: web.Application,
    channel: ChatChannel,
    card: ChatCard,
    user_id: str,
    by: Press,
    reason: str | None,
) -> dict[str, Any]:
    """Decide the card's call as `user_id` through the inbox's decision path (Inbox.decide: the
    same admission, four-eyes, quorum, single use and server-issued proof), with the channel named
    in the decision's reason; tell the presser what came of it and edit the card. Anything refused
    (not pending: decided, expired, voided; own call; not entitled; a risk the tenant keeps to the
    inbox) is told and decides nothing."""
    requesters, inbox = app[REQUESTERS], app[INBOX]
    decision, query_id = by.decision, by.query_id
    item = await inbox.recorded(card.tenant_id, card.workflow_id, card.call_id)
    reviewer = Reviewer(tenant_id=card.tenant_id, user_id=user_id)
    where = f"decided in {channel.kind} ({channel.name})"
    try:
        if item is not None and not may_decide(item.risk, channel.decides_up_to):
            raise HttpRefusal(403, f"a {item.risk}-risk call is decided in the inbox only")
        request = DecisionRequest(decision=decision, reason=f"{reason} ({where})" if reason else where)
        approval = await inbox.decide(reviewer, card.workflow_id, card.call_id, request)
    except HttpRefusal as err:
        await tell(channel, by.chat, by.sender, f"Nothing was decided: {err}", query_id)
        return {"ok": True, "refused": str(err)}
    what = "Approved" if decision == "approve" else "Rejected"
    because = f" ({reason})" if reason else ""
    state = f"{what} by {user_id} in {channel.kind}{because}; the call is now {approval.state}."
    await tell(channel, by.chat, by.sender, state, query_id)
    chat, ref = by.chat or card.chat, by.message_id or card.remote_id
    if ref is not None:
        link = card_link(requesters, card.workflow_id, card.call_id)
        waiting = card.id if approval.state == "pending" else None  # a quorum's next approver presses too
        await edit_card(channel, chat, ref, decided_text(item, state), link, waiting)
    return {"ok": True, "decided": approval.state}


async def ask_reason(
    app: web.Application, channel: ChatChannel, press: Press, card: ChatCard
) -> dict[str, Any]:
    """A Reject press decides nothing yet: the presser is asked for the reason, as a reply
    (Telegram: a `force_reply` message in the card's chat; Slack: a message in the card's thread),
    and the reply rejects the call with it (`reason_given`). The ask is kept in `chat_reason_asks`."""
    item = await app[INBOX].recorded(card.tenant_id, card.workflow_id, card.call_id)
    refusal = None if item is not None else "the call no longer waits for a decision"
    if item is not None and not may_decide(item.risk, channel.decides_up_to):
        refusal = f"a {item.risk}-risk call is decided in the inbox only"
    if refusal is not None or item is None:
        await tell(channel, press.chat, press.sender, f"Nothing was decided: {refusal}", press.query_id)
        return {"ok": True, "refused": refusal}
    chat, card_ref = press.chat or card.chat, press.message_id or card.remote_id
    if channel.kind == "telegram":
        body = {"chat_id": chat, "text": f"Why reject {item.tool}? Reply to this message with the reason.",
                "reply_markup": {"force_reply": True, "input_field_placeholder": "The reason"}}  # fmt: skip
        prompt = message_ref(channel, await api_call(channel, "sendMessage", body))
    else:
        who = f"<@{press.sender}> " if press.sender.isalnum() else ""
        text = f"{who}Why reject {slack_escaped(item.tool)}? Reply in this thread with the reason."
        sent = await api_call(
            channel, "chat.postMessage", {"channel": chat, "thread_ts": card_ref, "text": text}
        )
        prompt = card_ref if sent is not None else None
    if prompt is None:
        said = "The reason could not be asked for here: reject the call in the inbox."
        await tell(channel, press.chat, press.sender, said, press.query_id)
        return {"ok": True, "refused": said}
    ask = {"tenant_id": channel.tenant_id, "sender": press.sender[:200], "prompt": prompt, "card_id": card.id}
    async with app[REQUESTERS].sessions.begin() as session:
        await session.execute(
            insert(ChatReasonAsk)
            .values(**ask)
            .on_conflict_do_update(
                index_elements=[ChatReasonAsk.tenant_id, ChatReasonAsk.sender, ChatReasonAsk.prompt],
                set_={"card_id": card.id, "answered_by": None},
            )
        )
    said = "Reply with the reason: the call is rejected when it arrives."
    await tell(channel, press.chat, press.sender, said, press.query_id)
    return {"ok": True, "asked": "reason"}


GIVEN_BEFORE = "a reason given before"


async def reason_asked(
    app: web.Application, channel: ChatChannel, sender: str, reply_to: str, message_id: str
) -> ChatCard | str | None:
    """The card whose Reject asked `sender` for the reason their message `message_id` gives (it
    replies to `reply_to`), claimed for this message; GIVEN_BEFORE when the ask was answered already
    (a redelivered reply); None when the reply is not to an ask (then it is a message to the agent,
    or an answer to its question)."""
    key = (channel.tenant_id, sender[:200], reply_to)
    async with app[REQUESTERS].sessions.begin() as session:
        ask = await session.get(ChatReasonAsk, key, with_for_update=True)
        if ask is None:
            return None
        if ask.answered_by is not None:
            return GIVEN_BEFORE
        ask.answered_by = message_id[:200]
        return await session.get(ChatCard, ask.card_id)  # the ask goes with its card


async def reason_given(
    app: web.Application,
    channel: ChatChannel,
    user_id: str,
    sender: str,
    chat: str,
    text: str,
    card: ChatCard | str,
) -> dict[str, Any]:
    """`sender`'s reply in `chat` to a Reject's ask: the call is rejected with `text` as the
    reason, as `user_id`."""
    if not isinstance(card, ChatCard):
        return {"ok": True, "ignored": card}
    by = Press(query_id=None, sender=sender, card=card.id, decision="reject", chat=chat, message_id=None)
    return await decide_card(app, channel, card, user_id, by, text.strip()[:REASON_CHARS])  # fmt: skip
