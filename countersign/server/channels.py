"""Chat channels that write to an agent and decide its calls, and their settings for a tenant's admins.

Inbound webhooks, outside /api/ (the channel has no session; it proves it knows the channel's
`webhook_secret` instead):

- `POST /channels/telegram/{tenant}`: a Telegram-Bot-API-compatible update (a message, or the
  `callback_query` of a card's button); the secret arrives in `X-Telegram-Bot-Api-Secret-Token`
  (the `secret_token` of setWebhook);
- `POST /channels/slack/{tenant}`: a Slack Events API request, and
  `POST /channels/slack/{tenant}/interactions`: a press on a card's button (form-encoded
  `payload=` JSON), both signed with the app's signing secret (`X-Slack-Signature`: `v0=`
  HMAC-SHA256 of `v0:{timestamp}:{body}`, the timestamp within 5 minutes); the events'
  `url_verification` handshake is answered once the signature holds.

A request without the right secret answers 401 and is counted per tenant, source and minute in
`webhook_refusals`, the first of each window also a chained `input_audit` record (naming the channel
kind, never what was sent); past REFUSALS_PER_WINDOW a minute it answers 429. A message from a
sender the operator mapped (`channels sender`, `chat_senders`) goes through the front door as that
user (countersign.server.requesters: the same admission, proof and record as the conversation API)
into their keyed conversation with the mapped agent (`{kind}_{sender}`), with the channel's own
message id so a redelivered update is answered once; a sender nobody mapped is recorded and
ignored. The turn's outcome is posted back to the same chat (Telegram: `sendMessage` to the chat it
came from; Slack: `chat.postMessage` in the thread of the message, or the channel's incoming webhook
when it has no bot token), through tools/chat.py's `post`, after the webhook was answered (a channel
retries a slow webhook): its reply; or, when it waits for a person, "waiting", its questions (a
reply answers them), and later the reply after the decision, the answer or the expiry, or that the
conversation ended. What is owed is kept in `chat_turns`, so a server that starts again still posts it.

A call the turn waits on is posted to the channel's review chat as a card with Approve, Reject and
Open in inbox, and a press decides as the presser's linked user (countersign.server.chat_cards;
drawn by countersign.server.chat_render for Telegram and Slack alike).

Admin API (a logged-in admin of the tenant; 403 otherwise), instead of SQL:
`GET`/`PUT /api/admin/channel` (ChannelSettings in, ChannelView out: never a secret),
`GET /api/admin/channel/senders`, `PUT`/`DELETE /api/admin/channel/senders/{sender}`
(`{"user_id", "agent"}`), `PUT /api/admin/channel/decides` (`{"up_to"}`), each change a chained
audit record (`GET /api/admin/channel/changes` lists them), and `POST /api/admin/channel/test`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.service import RPCError

from countersign.client.handles import channel_key
from countersign.core.authority import ADMIN
from countersign.db.chain import chain_written
from countersign.db.channels import (
    ChannelSettings,
    DecidesSettings,
    SenderSettings,
    changes,
    channel_view,
    remove_sender,
    senders,
    set_channel,
    set_decides,
    set_sender,
)
from countersign.db.people import roles_of
from countersign.db.ratings import Rating
from countersign.db.schema import (
    ChatCard,
    ChatChannel,
    ChatSender,
    ChatTurn,
    Conversation,
    InputAudit,
    WebhookRefusal,
)
from countersign.server.chat_cards import card_pressed, post_cards, reason_asked, reason_given, tell
from countersign.server.chat_render import Press, as_id, chat_text, slack_press, telegram_press
from countersign.server.door import CALLER, REQUESTERS
from countersign.server.http import HttpRefusal, parse
from countersign.server.requesters import AnswerBody, Caller, MessageBody, RatingBody, Requesters, StartBody
from tools.chat import post, post_test_message
from tools.registry import OutcomeUnknown, ToolFailure

log = logging.getLogger(__name__)

SLACK_SKEW_S = 300  # Slack's own advice: refuse a request signed more than 5 minutes ago
REPLY_WAIT_S = 600.0  # how long a channel's turn is asked through updates before its end is read from events
TELEGRAM_SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
REFUSALS_PER_WINDOW = 20  # unauthenticated requests a source may send a channel per minute before 429


@dataclass
class Replies:
    """The tasks posting replies back, cancelled when the server stops."""

    tasks: set[asyncio.Task[None]]


REPLIES = web.AppKey("channel_replies", Replies)


@dataclass(frozen=True)
class Inbound:
    """One message a channel delivered: who sent it, in which chat, its own id and its text."""

    sender: str
    chat: str
    message_id: str
    text: str
    # What it replies to: Telegram's replied-to message id, Slack's thread (a reply in a thread).
    # It answers a pending question, or gives the reason a Reject press was asked for.
    reply_to: str | None = None
    thread: str | None = None  # Slack: the thread the outcome goes to (the message's own, or its thread)

    @property
    def replying(self) -> bool:
        return self.reply_to is not None


# --- the secrets (pure) ------------------------------------------------------------------------------


def telegram_secret_holds(expected: str | None, given: str | None) -> bool:
    """Compared as bytes: `hmac.compare_digest` refuses two texts unless both are ASCII, and a
    header may carry anything (aiohttp decodes it as UTF-8 with surrogate escapes)."""
    if expected is None or given is None:
        return False
    return hmac.compare_digest(expected.encode(), given.encode(errors="surrogateescape"))


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def slack_signature_holds(
    secret: str | None, timestamp: str | None, signature: str | None, body: bytes, now: float
) -> bool:
    if secret is None or not timestamp or not signature or not (timestamp.isascii() and timestamp.isdigit()):
        return False
    if abs(now - int(timestamp)) > SLACK_SKEW_S:
        return False
    return hmac.compare_digest(
        slack_signature(secret, timestamp, body).encode(), signature.encode(errors="surrogateescape")
    )


# --- what the channel sent (pure; never raises on outside data) -----------------------------------


def telegram_message(update: Any) -> Inbound | None:
    """The text message in a Telegram update, or None (an edit, a photo, a join: nothing to answer)."""
    message = update.get("message") if isinstance(update, dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("text"), str):
        return None
    sender = as_id((message.get("from") or {}).get("id")) if isinstance(message.get("from"), dict) else None
    chat = as_id((message.get("chat") or {}).get("id")) if isinstance(message.get("chat"), dict) else None
    update_id = as_id(update.get("update_id"))
    if sender is None or chat is None or update_id is None or not message["text"].strip():
        return None
    replied = message.get("reply_to_message")
    reply_to = (as_id(replied.get("message_id")) or "?") if isinstance(replied, dict) else None
    return Inbound(
        sender=sender, chat=chat, message_id=f"telegram-{update_id}", text=message["text"], reply_to=reply_to
    )


def slack_message(payload: Any) -> Inbound | None:
    """A person's message in a Slack `event_callback`, or None (bots, ours included, edits, joins)."""
    event = payload.get("event") if isinstance(payload, dict) else None
    if not isinstance(event, dict) or event.get("type") != "message":
        return None
    if "bot_id" in event or "subtype" in event:
        return None
    sender, chat, text = as_id(event.get("user")), as_id(event.get("channel")), event.get("text")
    event_id = as_id(payload.get("event_id")) or as_id(event.get("ts"))
    if sender is None or chat is None or event_id is None or not isinstance(text, str) or not text.strip():
        return None
    ts, thread_ts = as_id(event.get("ts")), as_id(event.get("thread_ts"))
    reply_to = thread_ts if thread_ts is not None and thread_ts != ts else None
    return Inbound(
        sender=sender, chat=chat, message_id=f"slack-{event_id}", text=text, reply_to=reply_to,
        thread=thread_ts or ts,
    )  # fmt: skip


def loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def form_payload(raw: bytes) -> Any:
    """The JSON of a Slack interaction's form-encoded `payload=` field, or None."""
    payload = parse_qs(raw.decode(errors="replace")).get("payload")
    return loads(payload[0].encode()) if payload else None


# --- the webhooks -----------------------------------------------------------------------------------


def no_channel() -> web.Response:
    """No tenant has this kind of channel under that name: nothing to attribute a request to, so
    nothing is recorded (a row per request would let anyone grow the audit and the chain under
    tenant names of their choosing)."""
    return web.json_response({"error": "no such channel"}, status=404)


async def refused(request: web.Request, tenant: str, kind: str, reason: str, status: int) -> web.Response:
    """Record a refused or ignored webhook request (never what it carried) and answer it."""
    async with request.app[REQUESTERS].sessions.begin() as session:
        await chain_refusal(session, tenant, kind, reason)
    if status >= 400:
        return web.json_response({"error": reason}, status=status)
    return web.json_response({"ok": True, "ignored": reason})


async def chain_refusal(session: AsyncSession, tenant: str, kind: str, reason: str) -> None:
    row = InputAudit(
        tenant_id=tenant[:200], workflow_id="", action=f"chat_webhook:{kind}", actor=None,
        accepted=False, reason=reason,
    )  # fmt: skip
    session.add(row)
    await chain_written(session, row)


async def unauthenticated(request: web.Request, tenant: str, kind: str, reason: str) -> web.Response:
    """A request without the channel's secret (issue 53, item 5): anyone can send one, so each is
    counted per tenant, kind, source address and minute in `webhook_refusals`, one upsert that takes
    no chain lock; only the first of a window is a chained record. Past REFUSALS_PER_WINDOW in a
    window the source is answered 429 until the next one."""
    source = (request.remote or "unknown")[:100]
    now = datetime.now(UTC)
    window = now.replace(second=0, microsecond=0)
    statement = (
        insert(WebhookRefusal)
        .values(tenant_id=tenant[:200], kind=kind, source=source, window_start=window, count=1, reason=reason)
        .on_conflict_do_update(
            index_elements=[WebhookRefusal.tenant_id, WebhookRefusal.kind, WebhookRefusal.source,
                            WebhookRefusal.window_start],
            set_={"count": WebhookRefusal.count + 1, "reason": reason},
        )
        .returning(WebhookRefusal.count)
    )  # fmt: skip
    async with request.app[REQUESTERS].sessions.begin() as session:
        count = (await session.execute(statement)).scalar_one()
        if count == 1:
            said = f"{reason} (from {source}; more from there this minute are counted in webhook_refusals)"
            await chain_refusal(session, tenant, kind, said)
    if count > REFUSALS_PER_WINDOW:
        retry = str(60 - now.second)
        return web.json_response(
            {"error": "too many refused requests"}, status=429, headers={"Retry-After": retry}
        )
    return web.json_response({"error": reason}, status=401)


async def channel_of(session: AsyncSession, tenant: str, kind: str) -> ChatChannel | None:
    channel = await session.get(ChatChannel, tenant[:200])
    return channel if channel is not None and channel.kind == kind else None


async def telegram(request: web.Request) -> web.Response:
    tenant = request.match_info["tenant"]
    async with request.app[REQUESTERS].sessions() as session:
        channel = await channel_of(session, tenant, "telegram")
    if channel is None:
        return no_channel()
    given = request.headers.get(TELEGRAM_SECRET_HEADER)
    if not telegram_secret_holds(channel.webhook_secret, given):
        return await unauthenticated(
            request, channel.tenant_id, "telegram", "wrong or missing webhook secret"
        )
    update = loads(await request.read())
    press = telegram_press(update)
    if press is not None:
        return await pressed(request, channel, press)
    inbound = telegram_message(update)
    if inbound is None:
        return web.json_response({"ok": True})
    return await deliver(request, channel, inbound)


async def slack_verified(request: web.Request) -> tuple[ChatChannel, bytes] | web.Response:
    """The tenant's Slack channel and the request's body once its signature holds (events and
    interactions alike: the app's signing secret, v0 HMAC, a timestamp within 5 minutes); the
    answer to give otherwise."""
    tenant = request.match_info["tenant"]
    body = await request.read()
    async with request.app[REQUESTERS].sessions() as session:
        channel = await channel_of(session, tenant, "slack")
    if channel is None:
        return no_channel()
    holds = slack_signature_holds(
        channel.webhook_secret,
        request.headers.get("X-Slack-Request-Timestamp"),
        request.headers.get("X-Slack-Signature"),
        body,
        time.time(),
    )
    if not holds:
        return await unauthenticated(request, channel.tenant_id, "slack", "wrong, missing or stale signature")
    return channel, body


async def slack(request: web.Request) -> web.Response:
    verified = await slack_verified(request)
    if isinstance(verified, web.Response):
        return verified
    channel, body = verified
    payload = loads(body)
    if isinstance(payload, dict) and payload.get("type") == "url_verification":
        return web.json_response({"challenge": str(payload.get("challenge", ""))[:200]})
    inbound = slack_message(payload)
    if inbound is None:
        return web.json_response({"ok": True})
    return await deliver(request, channel, inbound)


async def slack_interactions(request: web.Request) -> web.Response:
    """A press on a card's button (Slack's interactivity Request URL), signed like the events."""
    verified = await slack_verified(request)
    if isinstance(verified, web.Response):
        return verified
    channel, body = verified
    press = slack_press(form_payload(body))
    if press is None:
        return web.json_response({"ok": True})
    return await pressed(request, channel, press)


async def deliver(request: web.Request, channel: ChatChannel, inbound: Inbound) -> web.Response:
    """The message into the mapped user's conversation through the front door; its outcome owed
    to the chat (`chat_turns`) and posted back from a task of its own."""
    requesters = request.app[REQUESTERS]
    async with requesters.sessions() as session:
        mapped = await session.get(ChatSender, (channel.tenant_id, inbound.sender[:200]))
    if mapped is None:
        return await refused(request, channel.tenant_id, channel.kind, "a sender nobody mapped", 200)
    if inbound.reply_to is not None and (
        card := await reason_asked(request.app, channel, inbound.sender, inbound.reply_to, inbound.message_id)
    ):
        given = await reason_given(
            request.app, channel, mapped.user_id, inbound.sender, inbound.chat, inbound.text, card
        )
        return web.json_response(given)
    caller = Caller(tenant_id=channel.tenant_id, person=mapped.user_id)
    key = channel_key(channel.kind, inbound.sender)
    workflow_id = None
    try:
        await requesters.admit(caller, mapped.user_id)
        started = await requesters.start(caller, mapped.user_id, StartBody(agent=mapped.agent, key=key))
        workflow_id = started.workflow_id
        row = await requesters.conversation(caller, workflow_id, "message")
        if (rating := rating_of(inbound.text)) is not None:
            return await rated_in_chat(request, channel, inbound, mapped.user_id, row, *rating)
        if inbound.replying and (question := await asked(requesters, row)) is not None:
            await requesters.answer(caller, row, question, AnswerBody(text=inbound.text[:20_000]))
            await requesters.record(caller, mapped.user_id, "answer", workflow_id, 202)
            return web.json_response({"ok": True, "workflow_id": workflow_id, "answered": question})
        await requesters.send(row, MessageBody(text=inbound.text[:20_000], message_id=inbound.message_id))
    except HttpRefusal as err:
        await requesters.record(caller, mapped.user_id, "message", workflow_id, err.status, str(err))
        raise
    await requesters.record(caller, mapped.user_id, "message", workflow_id, 202)
    owed = ChatTurn(
        tenant_id=channel.tenant_id, message_id=inbound.message_id[:200], workflow_id=workflow_id,
        user_id=mapped.user_id, chat=inbound.chat[:200], state="open",
        thread=inbound.thread[:100] if inbound.thread else None,
    )  # fmt: skip
    async with requesters.sessions.begin() as session:
        new = await session.scalar(
            insert(ChatTurn).values(**fact(owed)).on_conflict_do_nothing().returning(ChatTurn.message_id)
        )
    if new is not None:  # a redelivered message is followed by the task its first delivery started
        follow(request.app, owed)
    return web.json_response({"ok": True, "workflow_id": workflow_id}, status=200)


# A message that is only one of these rates the conversation's last reply (issue 53: people rate
# replies, here from a chat app), what follows it being the comment: "👍", "👎 too long", "/helpful".
RATINGS: dict[str, Rating] = {
    "👍": "helpful", "+1": "helpful", "/helpful": "helpful",
    "👎": "not_helpful", "-1": "not_helpful", "/not_helpful": "not_helpful",
}  # fmt: skip


def rating_of(text: str) -> tuple[Rating, str | None] | None:
    """(rating, comment) when `text` rates the last reply (it starts with one of RATINGS), else None."""
    word, _, comment = text.strip().partition(" ")
    rating = RATINGS.get(word.removesuffix("\ufe0f"))
    return (rating, comment.strip() or None) if rating is not None else None


async def rated_in_chat(
    request: web.Request,
    channel: ChatChannel,
    inbound: Inbound,
    user_id: str,
    row: Conversation,
    rating: Rating,
    comment: str | None,
) -> web.Response:
    """Rate the last reply of the sender's conversation as the user the sender map links them to
    (Requesters.rate_from_chat: only the conversation's user rates, audited, once per reply), and
    say so in the chat."""
    requesters = request.app[REQUESTERS]
    turn = (await requesters.status(row)).turn
    try:
        await requesters.rate_from_chat(
            channel.tenant_id, user_id, row.workflow_id, turn, RatingBody(rating=rating, comment=comment)
        )
        said = f"Thanks: the last reply is rated {rating.replace('_', ' ')}."
    except HttpRefusal as err:  # no reply to rate yet
        said = f"Nothing was rated: {err}"
    try:
        await post(
            to_chat(channel, inbound.chat),
            said,
            f"{row.workflow_id}:{inbound.message_id}:rated",
            inbound.thread,
        )
    except (ToolFailure, OutcomeUnknown) as failure:
        log.warning("a rating's answer for %s not posted: %s", channel.tenant_id, failure)
    return web.json_response({"ok": True, "workflow_id": row.workflow_id, "rated": turn})


def to_chat(channel: ChatChannel, chat: str) -> ChatChannel:
    """The tenant's channel, posting to `chat` (a requester's) instead of its review chat."""
    return ChatChannel(
        tenant_id=channel.tenant_id, kind=channel.kind, endpoint=channel.endpoint,
        bot_token=channel.bot_token, chat_id=chat, name=channel.name,
    )  # fmt: skip


async def asked(requesters: Requesters, row: Conversation) -> str | None:
    """The call id of the question the conversation waits on the requester for (the oldest), if any:
    a reply in the chat answers it (the turn's follower then posts what comes of it)."""
    questions = (await requesters.status(row)).pending_questions
    return questions[0].call_id if questions else None


def fact(turn: ChatTurn) -> dict[str, str | None]:
    return {
        "tenant_id": turn.tenant_id, "message_id": turn.message_id, "workflow_id": turn.workflow_id,
        "user_id": turn.user_id, "chat": turn.chat, "thread": turn.thread, "state": turn.state,
    }  # fmt: skip


def follow(app: web.Application, turn: ChatTurn) -> None:
    """Follow `turn` to its outcome in a task of its own, cancelled when the server stops."""
    task = asyncio.create_task(answer_back(app, turn))
    app[REPLIES].tasks.add(task)
    task.add_done_callback(app[REPLIES].tasks.discard)


WAITING = "Waiting for a person: a reviewer's decision or your answer (see the inbox or the chat page)."


def reply_text(state: str, reply: str | None) -> str | None:
    if state == "replied":
        return reply
    if state == "waiting":
        return WAITING
    if state == "ended":
        return "This conversation has ended; write again to start a new one."
    return None


async def moved(app: web.Application, turn: ChatTurn, before: str, after: str) -> bool:
    """Move `turn` from state `before` to `after`; False when another process (or an earlier
    delivery) moved it first: then that one posts, and this one does not."""
    async with app[REQUESTERS].sessions.begin() as session:
        result = await session.execute(
            update(ChatTurn)
            .where(
                ChatTurn.tenant_id == turn.tenant_id,
                ChatTurn.message_id == turn.message_id,
                ChatTurn.state == before,
            )
            .values(state=after)
        )
    turn.state = after
    return bool(getattr(result, "rowcount", 0))


async def answer_back(app: web.Application, turn: ChatTurn) -> None:
    """Post the outcome of the turn that answers the chat's message to the chat it came from: the
    reply; or, once the turn waits for a person, "waiting" first and then the outcome, whenever
    the decision, the answer, the expiry or the end comes. Each post is claimed in `chat_turns`
    before it goes out (at most once, also with several servers); a server that starts again
    follows the turns not done (`resume`)."""
    requesters = app[REQUESTERS]
    caller = Caller(tenant_id=turn.tenant_id, person=turn.user_id)
    try:
        row = await requesters.conversation(caller, turn.workflow_id, "reply")
        deadline = asyncio.get_running_loop().time() + REPLY_WAIT_S
        answer = await requesters.reply(row, turn.message_id, None, REPLY_WAIT_S)
        while answer.state == "running" and asyncio.get_running_loop().time() < deadline:
            answer = await requesters.reply(row, turn.message_id, None, REPLY_WAIT_S)
        if answer.state == "waiting" and turn.state == "open" and await moved(app, turn, "open", "waiting"):
            await post_to(app, turn, WAITING)
            how = "Reply in this thread" if turn.thread else "Reply to this message"
            for question in answer.status.pending_questions if answer.status is not None else []:
                await post_to(app, turn, f"{question.question}\n({how} to answer.)", question.call_id)
            if answer.status is not None:
                await post_cards(app, turn, [p.call_id for p in answer.status.pending_approvals])
        if answer.state in ("waiting", "running"):  # a person decides, or a long turn: its end, from events
            answer = await requesters.outcome(row, turn.message_id)
    except (HttpRefusal, RPCError) as err:  # the message was refused, or the conversation is gone
        log.warning("no outcome for a chat turn of %s: %s", turn.tenant_id, err)
        await moved(app, turn, turn.state, "done")
        return
    text = reply_text(answer.state, answer.turn.reply if answer.turn else None)
    if await moved(app, turn, turn.state, "done") and text:
        await post_to(app, turn, text)


async def post_to(app: web.Application, turn: ChatTurn, text: str, part: str = "") -> None:
    """Post `text` to the chat `turn` came from, through the tenant's channel as it is now."""
    async with app[REQUESTERS].sessions() as session:
        channel = await session.get(ChatChannel, turn.tenant_id)
    if channel is None:
        log.warning("the chat channel of %s is gone: an outcome is not posted", turn.tenant_id)
        return
    to = to_chat(channel, turn.chat)
    try:
        shown = chat_text(text, app[REQUESTERS].chat_url)
        await post(to, shown, f"{turn.workflow_id}:{turn.message_id}:{turn.state}{part}", turn.thread)
    except (ToolFailure, OutcomeUnknown) as failure:  # its message names no URL nor token
        log.warning("a chat turn's outcome for %s not posted: %s", turn.tenant_id, failure)


async def pressed(request: web.Request, channel: ChatChannel, press: Press) -> web.Response:
    """A card's button: decided as the presser's linked user (countersign.server.chat_cards); a
    press from someone nobody linked is recorded and decides nothing."""
    async with request.app[REQUESTERS].sessions() as session:
        card = await session.get(ChatCard, press.card)
        mapped = await session.get(ChatSender, (channel.tenant_id, press.sender[:200]))
    if card is None or card.tenant_id != channel.tenant_id:
        await tell(channel, press.chat, press.sender, "No such card.", press.query_id)
        return web.json_response({"ok": True})
    if mapped is None:
        await refused(request, channel.tenant_id, channel.kind, "a press from a sender nobody linked", 200)
        said = "You are not linked to a user here: nothing was decided."
        await tell(channel, press.chat, press.sender, said, press.query_id)
        return web.json_response({"ok": True})
    return web.json_response(await card_pressed(request.app, channel, press, card, mapped.user_id))


async def resume(app: web.Application) -> None:
    """At start: follow every chat turn still owed an outcome (a restart loses none)."""
    async with app[REQUESTERS].sessions() as session:
        owed = list(await session.scalars(select(ChatTurn).where(ChatTurn.state != "done")))
    for turn in owed:
        follow(app, turn)


# --- the admin API -----------------------------------------------------------------------------------


async def admin_tenant(request: web.Request, session: AsyncSession) -> str:
    caller = request[CALLER]
    if caller.person is None or ADMIN not in (await roles_of(session, caller.tenant_id, caller.person) or []):
        raise HttpRefusal(403, f"only an admin of {caller.tenant_id} sees and sets its chat channel")
    return caller.tenant_id


def admin_name(request: web.Request) -> str:
    """The admin the audit names for a change (admin_tenant has checked there is one)."""
    return str(request[CALLER].person)


async def show_channel(request: web.Request) -> web.Response:
    async with request.app[REQUESTERS].sessions() as session:
        view = await channel_view(session, await admin_tenant(request, session))
    if view is None:
        raise HttpRefusal(404, "no chat channel set")
    return web.json_response(view.model_dump())


async def channel_changes(request: web.Request) -> web.Response:
    """Who changed the channel and its senders, and what, newest first (never a secret)."""
    async with request.app[REQUESTERS].sessions() as session:
        shown = await changes(session, await admin_tenant(request, session))
    return web.json_response({"changes": [c.model_dump() for c in shown]})


async def put_channel(request: web.Request) -> web.Response:
    settings = await parse(request, ChannelSettings)
    async with request.app[REQUESTERS].sessions.begin() as session:
        tenant = await admin_tenant(request, session)
        try:
            view = await set_channel(session, tenant, settings, admin_name(request))
        except ValueError as err:  # an endpoint that is not public nor allowed
            raise HttpRefusal(422, str(err)) from None
    return web.json_response(view.model_dump())


async def put_sender(request: web.Request) -> web.Response:
    settings = await parse(request, SenderSettings)
    sender = request.match_info["sender"][:200]
    async with request.app[REQUESTERS].sessions.begin() as session:
        tenant = await admin_tenant(request, session)
        try:
            await set_sender(session, tenant, sender, settings, admin_name(request))
        except ValueError as err:
            raise HttpRefusal(422, str(err)) from None
    return web.json_response({"tenant_id": tenant, "sender": sender, **settings.model_dump()})


async def put_decides(request: web.Request) -> web.Response:
    """Where a decision may be made: the highest risk a press in the chat decides."""
    settings = await parse(request, DecidesSettings)
    async with request.app[REQUESTERS].sessions.begin() as session:
        tenant = await admin_tenant(request, session)
        try:
            await set_decides(session, tenant, settings, admin_name(request))
        except ValueError as err:  # no channel yet
            raise HttpRefusal(404, str(err)) from None
        view = await channel_view(session, tenant)
    assert view is not None  # just updated
    return web.json_response(view.model_dump())


async def list_senders(request: web.Request) -> web.Response:
    async with request.app[REQUESTERS].sessions() as session:
        shown = await senders(session, await admin_tenant(request, session))
    return web.json_response({"senders": [s.model_dump() for s in shown]})


async def delete_sender(request: web.Request) -> web.Response:
    sender = request.match_info["sender"][:200]
    async with request.app[REQUESTERS].sessions.begin() as session:
        tenant = await admin_tenant(request, session)
        try:
            await remove_sender(session, tenant, sender, admin_name(request))
        except ValueError as err:
            raise HttpRefusal(404, str(err)) from None
    return web.json_response({"tenant_id": tenant, "sender": sender, "removed": True})


async def send_test_post(request: web.Request) -> web.Response:
    """Post a test message to the channel's chat, so an admin sees the settings work; what went
    wrong is answered by kind and HTTP status only (never the endpoint nor the token)."""
    async with request.app[REQUESTERS].sessions() as session:
        tenant = await admin_tenant(request, session)
        channel = await session.get(ChatChannel, tenant)
    if channel is None:
        raise HttpRefusal(404, "no chat channel set")
    try:
        remote_id = await post_test_message(channel, admin_name(request))
    except (ToolFailure, OutcomeUnknown) as failure:
        raise HttpRefusal(502, failure.message) from None
    return web.json_response({"ok": True, "posted_to": channel.name, "remote_id": remote_id})


def add_routes(app: web.Application) -> None:
    """The webhooks and the admin API (after door.add_routes: they use its REQUESTERS)."""
    app[REPLIES] = Replies(tasks=set())

    async def stop_replies(app: web.Application) -> None:
        running = list(app[REPLIES].tasks)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    app.on_startup.append(resume)
    app.on_shutdown.append(stop_replies)
    app.router.add_post("/channels/telegram/{tenant}", telegram)
    app.router.add_post("/channels/slack/{tenant}", slack)
    app.router.add_post("/channels/slack/{tenant}/interactions", slack_interactions)
    app.router.add_get("/api/admin/channel", show_channel)
    app.router.add_put("/api/admin/channel", put_channel)
    app.router.add_get("/api/admin/channel/changes", channel_changes)
    app.router.add_put("/api/admin/channel/senders/{sender}", put_sender)
    app.router.add_delete("/api/admin/channel/senders/{sender}", delete_sender)
    app.router.add_get("/api/admin/channel/senders", list_senders)
    app.router.add_put("/api/admin/channel/decides", put_decides)
    app.router.add_post("/api/admin/channel/test", send_test_post)
