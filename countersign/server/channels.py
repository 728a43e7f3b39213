"""Chat channels that write to an agent, and their settings for a tenant's admins.

Inbound webhooks, outside /api/ (the channel has no session; it proves it knows the channel's
`webhook_secret` instead):

- `POST /channels/telegram/{tenant}`: a Telegram-Bot-API-compatible update; the secret arrives in
  `X-Telegram-Bot-Api-Secret-Token` (the `secret_token` of setWebhook);
- `POST /channels/slack/{tenant}`: a Slack Events API request, signed with the app's signing secret
  (`X-Slack-Signature`: `v0=` HMAC-SHA256 of `v0:{timestamp}:{body}`, the timestamp within 5
  minutes); its `url_verification` handshake is answered once the signature holds.

A request without the right secret answers 401 and is counted per tenant, source and minute in
`webhook_refusals`, the first of each window also a chained `input_audit` record (naming the channel
kind, never what was sent); past REFUSALS_PER_WINDOW a minute it answers 429. A message from a
sender the operator mapped (`channels sender`,
`chat_senders`) goes through the front door as that user (countersign.server.requesters: the same
admission, proof and record as the conversation API) into their keyed conversation with the mapped
agent (`{kind}_{sender}`), with the channel's own message id so a redelivered update is answered
once; a sender nobody mapped is recorded and ignored. The turn's outcome is posted back to the
same chat (Telegram: `sendMessage` to the chat it came from; Slack: the channel's incoming webhook),
through tools/chat.py's `post`, after the webhook was answered (a channel retries a slow webhook):
its reply; or, when it waits for a person, "waiting" and later the reply after the decision, the
answer or the expiry, or that the conversation ended. What is owed is kept in `chat_turns`, so a
server that starts again still posts it.

Admin API (a logged-in admin of the tenant; 403 otherwise), instead of SQL:
`GET`/`PUT /api/admin/channel` (ChannelSettings in, ChannelView out: never a secret) and
`PUT /api/admin/channel/senders/{sender}` (`{"user_id", "agent"}`), each change a chained audit
record; `GET /api/admin/channel/changes` lists them.
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
from typing import Any, Literal

import httpx
from aiohttp import web
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.service import RPCError

from countersign.client.handles import channel_key
from countersign.core.authority import ADMIN
from countersign.core.shown import fold
from countersign.db.chain import chain_written
from countersign.db.channels import (
    ChannelSettings,
    SenderSettings,
    changes,
    channel_view,
    set_channel,
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
from countersign.runtime.endpoints import EndpointRefused, check_endpoint
from countersign.server.auth import Reviewer
from countersign.server.door import CALLER, REQUESTERS
from countersign.server.http import HttpRefusal, parse
from countersign.server.inbox import DecisionRequest, PendingItem
from countersign.server.inbox_routes import INBOX
from countersign.server.requesters import AnswerBody, Caller, MessageBody, RatingBody, Requesters, StartBody
from tools.chat import POST_TIMEOUT_S, post
from tools.registry import OutcomeUnknown, ToolFailure

log = logging.getLogger(__name__)

SLACK_SKEW_S = 300  # Slack's own advice: refuse a request signed more than 5 minutes ago
REPLY_WAIT_S = 600.0  # how long a channel's turn is asked through updates before its end is read from events
TELEGRAM_SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# Characters of a reply posted as one chat message (Telegram takes 4,096): a longer one is folded,
# its mark and the link to the whole after it.
REPLY_CHARS = 3_800
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
    replying: bool = False  # a reply to one of the bot's messages: it answers a pending question


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


def as_id(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        return None
    return str(value)


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
    replying = isinstance(message.get("reply_to_message"), dict)
    return Inbound(
        sender=sender, chat=chat, message_id=f"telegram-{update_id}", text=message["text"], replying=replying
    )


@dataclass(frozen=True)
class Press:
    """A button pressed on a card: who pressed it, which card, approve or reject, and where the
    card's message is (to edit it once decided)."""

    query_id: str
    sender: str
    card: int
    decision: Literal["approve", "reject"]
    chat: str | None
    message_id: str | None


PRESSES: dict[str, Literal["approve", "reject"]] = {"a": "approve", "r": "reject"}


def telegram_press(update: Any) -> Press | None:
    """The `callback_query` of a card's button (`cs:<card>:<a|r>`), or None."""
    query = update.get("callback_query") if isinstance(update, dict) else None
    if not isinstance(query, dict) or not isinstance(query.get("data"), str):
        return None
    prefix, _, rest = query["data"].partition(":")
    card, _, decision = rest.partition(":")
    sender = as_id((query.get("from") or {}).get("id")) if isinstance(query.get("from"), dict) else None
    query_id = as_id(query.get("id"))
    if prefix != CARD_PREFIX or not (card.isascii() and card.isdigit()) or len(card) > 18:
        return None
    if decision not in PRESSES or sender is None or query_id is None:
        return None
    message = query.get("message")
    message = message if isinstance(message, dict) else {}
    chat = as_id((message.get("chat") or {}).get("id")) if isinstance(message.get("chat"), dict) else None
    return Press(query_id, sender, int(card), PRESSES[decision], chat, as_id(message.get("message_id")))


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
    return Inbound(sender=sender, chat=chat, message_id=f"slack-{event_id}", text=text)


def loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


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


async def slack(request: web.Request) -> web.Response:
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
    payload = loads(body)
    if isinstance(payload, dict) and payload.get("type") == "url_verification":
        return web.json_response({"challenge": str(payload.get("challenge", ""))[:200]})
    inbound = slack_message(payload)
    if inbound is None:
        return web.json_response({"ok": True})
    return await deliver(request, channel, inbound)


async def deliver(request: web.Request, channel: ChatChannel, inbound: Inbound) -> web.Response:
    """The message into the mapped user's conversation through the front door; its outcome owed
    to the chat (`chat_turns`) and posted back from a task of its own."""
    requesters = request.app[REQUESTERS]
    async with requesters.sessions() as session:
        mapped = await session.get(ChatSender, (channel.tenant_id, inbound.sender[:200]))
    if mapped is None:
        return await refused(request, channel.tenant_id, channel.kind, "a sender nobody mapped", 200)
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
    to = ChatChannel(
        tenant_id=channel.tenant_id, kind=channel.kind, endpoint=channel.endpoint,
        bot_token=channel.bot_token, chat_id=inbound.chat, name=channel.name,
    )  # fmt: skip
    try:
        await post(to, said, f"{row.workflow_id}:{inbound.message_id}:rated")
    except (ToolFailure, OutcomeUnknown) as failure:
        log.warning("a rating's answer for %s not posted: %s", channel.tenant_id, failure)
    return web.json_response({"ok": True, "workflow_id": row.workflow_id, "rated": turn})


def chat_text(text: str, whole_at: str) -> str:
    """`text` as one chat message (a reply, a card, a decided card): a long one folded with its
    visible mark (countersign.core.shown) and where the whole of it is (`whole_at`: the chat page,
    the card in the inbox), never cut silently."""
    shown, rest = fold(text, REPLY_CHARS)
    return f"{shown}\nThe whole of it: {whole_at}" if rest else shown


def card_link(requesters: Requesters, workflow_id: str, call_id: str) -> str:
    """The call's card in the inbox."""
    return f"{requesters.inbox_url}/#{workflow_id}/{call_id}"


async def asked(requesters: Requesters, row: Conversation) -> str | None:
    """The call id of the question the conversation waits on the requester for (the oldest), if any:
    a reply in the chat answers it (the turn's follower then posts what comes of it)."""
    questions = (await requesters.status(row)).pending_questions
    return questions[0].call_id if questions else None


def fact(turn: ChatTurn) -> dict[str, str]:
    return {
        "tenant_id": turn.tenant_id, "message_id": turn.message_id, "workflow_id": turn.workflow_id,
        "user_id": turn.user_id, "chat": turn.chat, "state": turn.state,
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
            for question in answer.status.pending_questions if answer.status is not None else []:
                await post_to(
                    app, turn, f"{question.question}\n(Reply to this message to answer.)", question.call_id
                )
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
    to = ChatChannel(
        tenant_id=channel.tenant_id, kind=channel.kind, endpoint=channel.endpoint,
        bot_token=channel.bot_token, chat_id=turn.chat, name=channel.name,
    )  # fmt: skip
    try:
        shown = chat_text(text, app[REQUESTERS].chat_url)
        await post(to, shown, f"{turn.workflow_id}:{turn.message_id}:{turn.state}{part}")
    except (ToolFailure, OutcomeUnknown) as failure:  # its message names no URL nor token
        log.warning("a chat turn's outcome for %s not posted: %s", turn.tenant_id, failure)


CARD_PREFIX = "cs"
CHAT_DECIDES: frozenset[str] = frozenset({"low", "medium", "high"})  # critical: only in the inbox
RECORDED_TRIES = 25  # 5 s for a pending call's record to be read


def card_text(item: PendingItem) -> str:
    """A card: the call, who asked, its risk, and the effect's lines (the arguments' when the tool
    resolved no effect); posted through `chat_text`, which folds it past one message's length."""
    lines = item.effect_lines or item.arg_lines
    return "\n".join([f"{item.tool} asked by {item.requested_by} ({item.risk} risk)", *lines, *item.warnings])


def keyboard(card: int, risk: str, link: str) -> dict[str, Any]:
    """Approve and Reject (for a risk a chat may decide), and Open in inbox."""
    row: list[dict[str, str]] = []
    if risk in CHAT_DECIDES:
        row += [{"text": "Approve", "callback_data": f"{CARD_PREFIX}:{card}:a"},
                {"text": "Reject", "callback_data": f"{CARD_PREFIX}:{card}:r"}]  # fmt: skip
    row.append({"text": "Open in inbox", "url": link})
    return {"inline_keyboard": [row]}


async def bot_call(channel: ChatChannel, method: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """One Telegram Bot API method on the channel's endpoint (checked like every post); its
    `result`, or None when it failed (logged without the URL: it holds the token)."""
    url = f"{channel.endpoint.rstrip('/')}/bot{channel.bot_token}/{method}"
    try:
        await check_endpoint(url)
        async with httpx.AsyncClient(timeout=POST_TIMEOUT_S) as http:
            response = await http.post(url, json=body)
        answer = response.json() if response.status_code < 300 else None
    except (EndpointRefused, httpx.HTTPError, ValueError) as err:
        log.warning("telegram %s for %s failed: %s", method, channel.tenant_id, type(err).__name__)
        return None
    result = answer.get("result") if isinstance(answer, dict) else None
    return result if isinstance(result, dict) else {}


async def post_cards(app: web.Application, turn: ChatTurn, pending: list[str]) -> None:
    """Post each pending call of `turn` as a card to the channel's review chat (once per call)."""
    requesters, inbox = app[REQUESTERS], app[INBOX]
    async with requesters.sessions() as session:
        channel = await session.get(ChatChannel, turn.tenant_id)
    if channel is None or channel.kind != "telegram" or channel.chat_id is None:
        return  # Slack's buttons are not there yet: the card is in the inbox
    for call_id in pending:
        item = await inbox.recorded(turn.tenant_id, turn.workflow_id, call_id)
        for _ in range(RECORDED_TRIES):  # the status can tell of the call before its record commits
            if item is not None:
                break
            await asyncio.sleep(0.2)
            item = await inbox.recorded(turn.tenant_id, turn.workflow_id, call_id)
        if item is None:
            continue  # decided or expired meanwhile
        async with requesters.sessions.begin() as session:
            card = await session.scalar(
                insert(ChatCard)
                .values(
                    tenant_id=turn.tenant_id,
                    workflow_id=turn.workflow_id,
                    call_id=call_id,
                    nonce=item.nonce,
                    chat=channel.chat_id,
                )
                .on_conflict_do_nothing()
                .returning(ChatCard.id)
            )
        if card is None:
            continue  # posted before
        link = card_link(requesters, turn.workflow_id, call_id)
        body = {
            "chat_id": channel.chat_id,
            "text": chat_text(card_text(item), link),
            "reply_markup": keyboard(card, item.risk, link),
        }
        sent = await bot_call(channel, "sendMessage", body)
        if sent and sent.get("message_id") is not None:
            async with requesters.sessions.begin() as session:
                await session.execute(
                    update(ChatCard)
                    .where(ChatCard.id == card)
                    .values(remote_id=str(sent["message_id"])[:100])
                )


async def answer_press(channel: ChatChannel, press: Press, text: str) -> None:
    """What the presser sees at once (Telegram shows it over the chat; at most 200 characters)."""
    await bot_call(channel, "answerCallbackQuery", {"callback_query_id": press.query_id, "text": text[:190]})


async def pressed(request: web.Request, channel: ChatChannel, press: Press) -> web.Response:
    """A card's button: decides as the sender's linked user through the inbox's decision path
    (Inbox.decide: the same admission, four-eyes, quorum, single use and server-issued proof),
    with the channel named in the decision's reason; anything refused is answered in the chat."""
    requesters, inbox = request.app[REQUESTERS], request.app[INBOX]
    async with requesters.sessions() as session:
        card = await session.get(ChatCard, press.card)
        mapped = await session.get(ChatSender, (channel.tenant_id, press.sender[:200]))
    if card is None or card.tenant_id != channel.tenant_id:
        await answer_press(channel, press, "No such card.")
        return web.json_response({"ok": True})
    if mapped is None:
        await refused(request, channel.tenant_id, channel.kind, "a press from a sender nobody linked", 200)
        said = "You are not linked to a user here: nothing was decided."
        await answer_press(channel, press, said)
        return web.json_response({"ok": True})
    item = await inbox.recorded(card.tenant_id, card.workflow_id, card.call_id)
    reviewer = Reviewer(tenant_id=card.tenant_id, user_id=mapped.user_id)
    try:
        if item is not None and item.risk not in CHAT_DECIDES:
            raise HttpRefusal(403, f"a {item.risk}-risk call is decided in the inbox only")
        reason = f"decided in {channel.kind} ({channel.name})"
        approval = await inbox.decide(
            reviewer, card.workflow_id, card.call_id, DecisionRequest(decision=press.decision, reason=reason)
        )
    except HttpRefusal as err:  # not pending (decided, expired, voided), own call, not entitled
        said = f"Nothing was decided: {err}"
        await answer_press(channel, press, said)
        return web.json_response({"ok": True, "refused": str(err)})
    what = "Approved" if press.decision == "approve" else "Rejected"
    state = f"{what} by {mapped.user_id} in {channel.kind}; the call is now {approval.state}."
    await answer_press(channel, press, state)
    if press.chat is not None and press.message_id is not None:
        text = (card_text(item) + "\n\n" if item is not None else "") + state
        link = card_link(requesters, card.workflow_id, card.call_id)
        edit = {"chat_id": press.chat, "message_id": press.message_id, "text": chat_text(text, link)}
        await bot_call(channel, "editMessageText", edit)
    return web.json_response({"ok": True, "decided": approval.state})


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
    app.router.add_get("/api/admin/channel", show_channel)
    app.router.add_put("/api/admin/channel", put_channel)
    app.router.add_get("/api/admin/channel/changes", channel_changes)
    app.router.add_put("/api/admin/channel/senders/{sender}", put_sender)
