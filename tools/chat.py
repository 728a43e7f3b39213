"""send_chat_message: post to the tenant's chat channel (a Telegram bot, or a Slack app or webhook).

The channel is the tenant's `chat_channels` row, set by an operator (`countersign channels set`, or the
admin API; its secrets stored encrypted, countersign/db/sealed.py): a Telegram-bot-API-compatible
endpoint (`POST {endpoint}/bot{token}/sendMessage` with `chat_id` and `text`), a Slack-Web-API-
compatible endpoint (`POST {endpoint}/chat.postMessage` with `channel` and `text`, the bot token as
a bearer token) or a Slack-compatible incoming webhook (`POST {endpoint}` with `text`). The model
names no address: it can only post to the channel its tenant configured, and it is never told the
endpoint or the token; neither is any error message, log line or audit row (errors say what
happened by kind and HTTP status only).

A post is high risk and external, so it waits for a reviewer (the default tier). Neither API takes
an idempotency key, so exactly-once is kept on our side: the post is claimed in `chat_posts` under
the call's idempotency key, in its own committed transaction, before the request goes out. An
attempt retried after the post (a worker that died before the tool's transaction committed) finds
the claim: `sent` answers what was posted, `sending` (the request went out and no answer was
recorded) is an unknown outcome, audited as such, and never posted again. The key also travels as
an `Idempotency-Key` header, for receivers that deduplicate. A post cannot be taken back: there is
no compensation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.core.effects import Effect, OutgoingMessage, one_line
from countersign.db.schema import ChatChannel, ChatPost
from countersign.runtime.endpoints import EndpointRefused, check_endpoint
from tools.registry import OutcomeUnknown, Plan, ToolArgs, ToolContext, ToolFailure, tool

POST_TIMEOUT_S = 10.0
MAX_CHAT_TEXT = 4_000  # under Telegram's 4,096; Slack takes more
IDEMPOTENCY_HEADER = "Idempotency-Key"
# Failures before any byte of the request was sent (a misconfigured endpoint among them)
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.InvalidURL)


class SendChatMessageArgs(ToolArgs):
    text: str = Field(
        min_length=1, max_length=MAX_CHAT_TEXT, description="The message, plain text, as it will be posted"
    )


class ChatPosted(BaseModel):
    channel: str  # the channel's name, as the operator set it
    kind: str
    post_id: int
    remote_id: str | None  # the channel's own message id (Telegram gives one; a webhook does not)
    status: Literal["sent"]


def slack_api(channel: ChatChannel) -> bool:
    """A Slack channel with a bot token posts through the Web API (`chat.postMessage` on the
    endpoint, the API's base URL) to `chat_id`, and can thread and show buttons; one without posts
    to its incoming webhook (the endpoint)."""
    return channel.kind == "slack" and channel.bot_token is not None


def request_of(
    channel: ChatChannel, text: str, thread: str | None = None
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The URL, JSON body and headers of a post to `channel` (URL and headers may hold a secret:
    never shown); `thread`: the Slack thread to post in."""
    if channel.kind == "telegram":
        url = f"{channel.endpoint.rstrip('/')}/bot{channel.bot_token}/sendMessage"
        return url, {"chat_id": channel.chat_id, "text": text}, {}
    if slack_api(channel):
        body: dict[str, Any] = {"channel": channel.chat_id, "text": slack_escaped(text)}
        if thread is not None:
            body["thread_ts"] = thread
        return f"{channel.endpoint.rstrip('/')}/chat.postMessage", body, slack_auth(channel)
    return channel.endpoint, {"text": text}, {}


def slack_escaped(text: str) -> str:
    """Text for a Slack message's `text` (mrkdwn): `&`, `<` and `>` escaped as Slack asks, so that
    nothing in it is read as a mention (`<!channel>`) or a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_auth(channel: ChatChannel) -> dict[str, str]:
    return {"Authorization": f"Bearer {channel.bot_token}"}


def remote_id_of(channel: ChatChannel, response: httpx.Response) -> str | None:
    """The channel's message id from a 2xx answer (Telegram's `message_id`, Slack's `ts`; an
    incoming webhook gives none); ToolFailure when the body says it was refused."""
    if channel.kind != "telegram" and not slack_api(channel):
        return None
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("ok") is not True:
        raise ToolFailure("INTERNAL_ERROR", f"the {channel.kind} channel refused the message")
    if channel.kind == "slack":
        message_id = body.get("ts")
    else:
        result = body.get("result")
        message_id = result.get("message_id") if isinstance(result, dict) else None
    return None if message_id is None else str(message_id)[:100]


def engine_of(ctx: ToolContext) -> AsyncEngine:
    bind = ctx.session.bind
    if not isinstance(bind, AsyncEngine):
        raise TypeError("send_chat_message needs a session bound to an engine")
    return bind


async def claim(ctx: ToolContext, channel: ChatChannel, text: str) -> ChatPost | None:
    """Claim the post in its own committed transaction; None when an earlier attempt of this call
    claimed it (`earlier` says what became of it)."""
    async with AsyncSession(engine_of(ctx), expire_on_commit=False) as session, session.begin():
        claimed = await session.scalar(
            insert(ChatPost)
            .values(
                tenant_id=ctx.tenant_id, idempotency_key=ctx.idempotency_key, kind=channel.kind, text=text
            )
            .on_conflict_do_nothing(index_elements=[ChatPost.idempotency_key])
            .returning(ChatPost)
        )
    return claimed


async def settle(ctx: ToolContext, post_id: int, **values: Any) -> None:
    """Record how the post ended, committed at once (whatever becomes of the tool's transaction)."""
    async with AsyncSession(engine_of(ctx)) as session, session.begin():
        await session.execute(update(ChatPost).where(ChatPost.id == post_id).values(**values))


async def earlier(ctx: ToolContext, channel: ChatChannel) -> ChatPosted:
    """What an earlier attempt of this call did: its post, or why it cannot be posted again."""
    async with AsyncSession(engine_of(ctx)) as session:
        post = await session.scalar(select(ChatPost).where(ChatPost.idempotency_key == ctx.idempotency_key))
    assert post is not None  # claimed before, and claims are never deleted
    if post.status == "sent":
        return ChatPosted(
            channel=channel.name, kind=post.kind, post_id=post.id, remote_id=post.remote_id, status="sent"
        )
    if post.status == "sending":
        raise OutcomeUnknown(
            "INTERNAL_ERROR",
            f"an earlier attempt sent this message to {channel.name} and no answer was recorded: it may "
            "have been posted. It is not posted again; ask the user to check the channel",
        )
    raise ToolFailure("INTERNAL_ERROR", f"the message was not posted to {channel.name}: {post.error}")


async def post(channel: ChatChannel, text: str, key: str, thread: str | None = None) -> str | None:
    """Post once (in Slack's `thread`, when given); the channel's message id. Errors name no URL
    (it may hold the token). The endpoint is checked again here, after its name resolves: only a
    public address, or one the operator allowed (countersign.runtime.endpoints), is posted to."""
    url, body, headers = request_of(channel, text, thread)
    try:
        await check_endpoint(url)
    except EndpointRefused as refused:
        raise ToolFailure("FORBIDDEN", f"{refused}; nothing was posted") from None
    try:
        async with httpx.AsyncClient(timeout=POST_TIMEOUT_S) as http:
            response = await http.post(url, json=body, headers={IDEMPOTENCY_HEADER: key, **headers})
    except NOT_SENT as exc:  # nothing left this process: a plain failure (the message says no URL)
        raise ToolFailure(
            "INTERNAL_ERROR", f"the {channel.kind} channel could not be reached; nothing was posted"
        ) from exc
    except httpx.HTTPError as exc:  # sent, and the answer was lost
        raise OutcomeUnknown(
            "INTERNAL_ERROR",
            f"the message was sent to {channel.name} and no answer came ({type(exc).__name__}): it may "
            "have been posted. Ask the user to check the channel before sending it again",
        ) from exc
    if response.status_code >= 300:
        raise ToolFailure(
            "INTERNAL_ERROR", f"the {channel.kind} channel refused the message (HTTP {response.status_code})"
        )
    return remote_id_of(channel, response)


async def post_test_message(channel: ChatChannel, by: str) -> str | None:
    """Post a test message to the channel's chat, so that an operator or admin sees its settings
    work (the channels page's button, `channels test`); the channel's message id. ToolFailure or
    OutcomeUnknown say what went wrong, naming no URL nor token."""
    said = f"A test post from Countersign, sent by {by}: this channel works."
    return await post(channel, said, f"channel-test:{channel.tenant_id}:{time.time_ns()}")


async def channel_of(ctx: ToolContext) -> ChatChannel:
    channel = await ctx.session.get(ChatChannel, ctx.tenant_id, with_for_update=ctx.lock_reads)
    if channel is None:
        raise ToolFailure("NOT_FOUND", "this workspace has no chat channel configured")
    return channel


@dataclass(kw_only=True)
class ChatPlan(Plan):
    """The text, to the channel the plan read (locked, when it runs)."""

    args: SendChatMessageArgs
    channel: ChatChannel

    def effect(self) -> Effect:
        """The channel it will be posted to (by name, never its URL: it may hold a token) and the text."""
        channel, text = self.channel, self.args.text
        message = OutgoingMessage(channel=channel.kind, to=[channel.name], body=text)
        return Effect(
            summary=one_line(f"Posts to {channel.kind} channel {channel.name}: {text}"), messages=[message]
        )


async def plan_chat_message(ctx: ToolContext, args: SendChatMessageArgs) -> ChatPlan:
    return ChatPlan(args=args, channel=await channel_of(ctx))


@tool(risk="high", category="external", plan=plan_chat_message)
async def send_chat_message(ctx: ToolContext, plan: ChatPlan) -> ChatPosted:
    """Post a message to the workspace's team chat channel (configured by an operator: a Telegram
    group or a Slack channel). It waits for a reviewer's approval and cannot be taken back."""
    channel, args = plan.channel, plan.args
    claimed = await claim(ctx, channel, args.text)
    if claimed is None:
        return await earlier(ctx, channel)
    try:
        remote_id = await post(channel, args.text, ctx.idempotency_key)
    except OutcomeUnknown:
        raise  # the claim stays `sending`: a retry reports the same, and never posts
    except ToolFailure as failure:
        await settle(ctx, claimed.id, status="failed", error=failure.message)
        raise
    await settle(ctx, claimed.id, status="sent", remote_id=remote_id, sent_at=ctx.now)
    return ChatPosted(
        channel=channel.name, kind=channel.kind, post_id=claimed.id, remote_id=remote_id, status="sent"
    )
