"""A tenant's chat channel and its senders, as an operator sets them (`countersign channels`, the
admin API `PUT /api/admin/channel`), and the rotation of the key their secrets are sealed with.

What anyone is shown of a channel is `ChannelView`: its kind, name and chat, and whether a token and
a webhook secret are set, never their values nor the endpoint (a Slack webhook URL is a secret).

A channel's endpoint must be a public address, or one the operator allowed (COUNTERSIGN_CHANNEL_ALLOW;
countersign.runtime.endpoints): checked here when it is saved, and again by each post. Every change of
a channel or of a sender is a chained `input_audit` record naming who made it and what changed,
never a secret (issue 53, items 6 and 7).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy import Text, column, select, table, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.bounds import Identifier
from countersign.db.chain import chain_written
from countersign.db.schema import AgentProfile, ChatChannel, ChatSender, InputAudit, User
from countersign.db.sealed import reseal
from countersign.runtime.endpoints import check_endpoint

ChatKind = Literal["telegram", "slack"]
SEALED_COLUMNS = ("endpoint", "bot_token", "webhook_secret")
CHANNEL_SET = "channel_set"  # the `input_audit` actions of a change, chained
SENDER_SET = "channel_sender_set"
SENDER_REMOVED = "channel_sender_removed"
DECIDES_SET = "channel_decides_set"
CHANGE_ACTIONS = (CHANNEL_SET, SENDER_SET, SENDER_REMOVED, DECIDES_SET)
DecidesUpTo = Literal["none", "low", "medium", "high"]


class ChannelSettings(BaseModel):
    """A channel as an operator gives it. Telegram: the Bot API's base URL, the bot's token and the
    chat to post to (and to post cards to); Slack: the Web API's base URL (https://slack.com/api),
    the app's bot token (xoxb-…) and the channel to post cards to, or only an incoming webhook's URL
    (then it posts outcomes through it, without threads or cards). `webhook_secret` lets the channel
    write to us: the `secret_token` given to Telegram's setWebhook, or the Slack app's signing
    secret."""

    model_config = ConfigDict(extra="forbid")

    kind: ChatKind
    name: str = Field(min_length=1, max_length=100)
    endpoint: str = Field(min_length=1, max_length=2_000)
    bot_token: str | None = Field(None, min_length=1, max_length=500)
    chat_id: str | None = Field(None, min_length=1, max_length=100)
    webhook_secret: str | None = Field(None, min_length=8, max_length=500)

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("endpoint must be an http(s) URL")  # the value is not repeated: a secret
        return value

    @model_validator(mode="after")
    def _telegram_names_its_bot_and_chat(self) -> ChannelSettings:
        if self.kind == "telegram" and (self.bot_token is None or self.chat_id is None):
            raise ValueError("a telegram channel needs bot_token and chat_id")
        if self.kind == "slack" and self.bot_token is not None and self.chat_id is None:
            raise ValueError("a slack channel with a bot token needs chat_id (the channel cards go to)")
        return self


class ChannelView(BaseModel):
    """What is shown of a channel: no secret."""

    tenant_id: str
    kind: str
    name: str
    chat_id: str | None
    has_bot_token: bool
    inbound: bool  # a webhook secret is set: the channel may write to us
    decides_up_to: str = "high"  # the highest risk a press in the chat decides ("none": the inbox only)

    @staticmethod
    def of(channel: ChatChannel) -> ChannelView:
        return ChannelView(
            tenant_id=channel.tenant_id,
            kind=channel.kind,
            name=channel.name,
            chat_id=channel.chat_id,
            has_bot_token=channel.bot_token is not None,
            inbound=channel.webhook_secret is not None,
            decides_up_to=channel.decides_up_to,
        )


class SenderSettings(BaseModel):
    """Whose messages a channel's user sends: one of the tenant's users, talking to `agent`."""

    model_config = ConfigDict(extra="forbid")

    user_id: Identifier
    agent: Identifier


class DecidesSettings(BaseModel):
    """Where a decision may be made: a card of a call up to `up_to` risk gets Approve and Reject in
    the chat; a riskier one only "Open in inbox" ("none": every call is decided in the inbox)."""

    model_config = ConfigDict(extra="forbid")

    up_to: DecidesUpTo


class SenderView(BaseModel):
    """One entry of the sender map."""

    sender: str
    user_id: str
    agent: str


class ChannelChange(BaseModel):
    """One change of a tenant's channel or sender map, as the channels page shows it."""

    at: str
    actor: str | None
    action: str
    change: str | None


async def record_change(session: AsyncSession, tenant_id: str, actor: str, action: str, change: str) -> None:
    """A chained record of a channel or sender change by `actor` (`change` never holds a secret)."""
    row = InputAudit(
        tenant_id=tenant_id, workflow_id="", action=action, actor=actor, accepted=True, reason=change
    )
    session.add(row)
    await chain_written(session, row)


async def changes(session: AsyncSession, tenant_id: str, limit: int = 50) -> list[ChannelChange]:
    """The tenant's latest channel and sender changes, newest first."""
    rows = await session.scalars(
        select(InputAudit)
        .where(InputAudit.tenant_id == tenant_id, InputAudit.action.in_(CHANGE_ACTIONS))
        .order_by(InputAudit.id.desc())
        .limit(limit)
    )
    return [
        ChannelChange(at=r.created_at.isoformat(), actor=r.actor, action=r.action, change=r.reason)
        for r in rows
    ]


def described(settings: ChannelSettings) -> str:
    """What an audit record says of a channel: never the endpoint, the token or the secret."""
    chat = f", chat {settings.chat_id}" if settings.chat_id else ""
    token = "set" if settings.bot_token else "none"
    secret = "set" if settings.webhook_secret else "none"
    kept = f"endpoint set, bot token {token}, webhook secret {secret}"
    return f"{settings.kind} channel {settings.name!r}{chat}; {kept}"


async def set_channel(
    session: AsyncSession, tenant_id: str, settings: ChannelSettings, actor: str
) -> ChannelView:
    """Create or replace the tenant's channel (sealed on the way in), recorded as `actor`'s change;
    ValueError for no such tenant, EndpointRefused for an endpoint that is not public nor allowed."""
    await check_endpoint(settings.endpoint)
    values = settings.model_dump()
    statement = (
        insert(ChatChannel)
        .values(tenant_id=tenant_id, **values)
        .on_conflict_do_update(index_elements=[ChatChannel.tenant_id], set_=values)
    )
    await session.execute(statement)
    channel = await session.get(ChatChannel, tenant_id, populate_existing=True)
    assert channel is not None  # just written
    await record_change(session, tenant_id, actor, CHANNEL_SET, described(settings))
    return ChannelView.of(channel)


async def channel_view(session: AsyncSession, tenant_id: str) -> ChannelView | None:
    channel = await session.get(ChatChannel, tenant_id)
    return None if channel is None else ChannelView.of(channel)


async def set_sender(
    session: AsyncSession, tenant_id: str, sender: str, settings: SenderSettings, actor: str
) -> None:
    """Map a channel's user to one of the tenant's users, recorded as `actor`'s change; ValueError
    naming what does not exist."""
    if await session.get(User, (tenant_id, settings.user_id)) is None:
        raise ValueError(f"no user {settings.user_id} in {tenant_id}")
    if await session.get(AgentProfile, settings.agent) is None:
        raise ValueError(f"no agent named {settings.agent}")
    values = settings.model_dump()
    await session.execute(
        insert(ChatSender)
        .values(tenant_id=tenant_id, sender=sender, **values)
        .on_conflict_do_update(index_elements=[ChatSender.tenant_id, ChatSender.sender], set_=values)
    )
    change = f"sender {sender} writes as {settings.user_id} to {settings.agent}"
    await record_change(session, tenant_id, actor, SENDER_SET, change)


async def set_decides(session: AsyncSession, tenant_id: str, settings: DecidesSettings, actor: str) -> None:
    """Set the highest risk the tenant's chat decides, recorded as `actor`'s change; ValueError
    when the tenant has no channel."""
    result = await session.execute(
        update(ChatChannel).where(ChatChannel.tenant_id == tenant_id).values(decides_up_to=settings.up_to)
    )
    if not getattr(result, "rowcount", 0):
        raise ValueError(f"{tenant_id} has no chat channel")
    change = (
        f"chat decides calls up to {settings.up_to} risk"
        if settings.up_to != "none"
        else "chat decides nothing"
    )
    await record_change(session, tenant_id, actor, DECIDES_SET, change)


async def senders(session: AsyncSession, tenant_id: str) -> list[SenderView]:
    rows = await session.scalars(
        select(ChatSender).where(ChatSender.tenant_id == tenant_id).order_by(ChatSender.sender)
    )
    return [SenderView(sender=r.sender, user_id=r.user_id, agent=r.agent) for r in rows]


async def remove_sender(session: AsyncSession, tenant_id: str, sender: str, actor: str) -> None:
    """Unlink a channel's user (their messages and presses are refused from now on), recorded as
    `actor`'s change; ValueError when nobody is linked under that id."""
    row = await session.get(ChatSender, (tenant_id, sender))
    if row is None:
        raise ValueError(f"no sender {sender} is linked")
    await session.delete(row)
    await record_change(
        session, tenant_id, actor, SENDER_REMOVED, f"sender {sender} ({row.user_id}) unlinked"
    )


async def rekey(session: AsyncSession) -> int:
    """Encrypt every sealed value again with the first key of COUNTERSIGN_SECRETS_KEY (the others
    only decrypt): the step between adding a new key and dropping the old one. Reads the values as
    stored (plain Text, not through SealedText): the channels' secrets and the tenants' webhook
    URLs. Answers how many channels it rewrote."""
    channels = await reseal_table(session, "chat_channels", "tenant_id", SEALED_COLUMNS)
    await reseal_table(session, "tenants", "id", ("webhook_url",))
    return channels


async def reseal_table(session: AsyncSession, name: str, key: str, columns: tuple[str, ...]) -> int:
    raw = table(name, column(key, Text), *(column(c, Text) for c in columns))
    rows = (await session.execute(select(raw).with_for_update())).mappings().all()
    for row in rows:
        values = {c: None if row[c] is None else reseal(row[c], name) for c in columns}
        await session.execute(update(raw).where(raw.c[key] == row[key]).values(**values))
    return len(rows)
