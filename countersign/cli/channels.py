"""`channels`: a tenant's chat channel and who its senders are, set without SQL, and the key their
secrets are sealed with (countersign/db/sealed.py). Secrets are read from the environment or a
prompt, never echoed back: what is shown of a channel is `ChannelView`."""

from __future__ import annotations

import click
from cryptography.fernet import Fernet
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.ux import with_session
from countersign.db.channels import (
    ChannelSettings,
    ChannelView,
    DecidesSettings,
    SenderSettings,
    channel_view,
    rekey,
    remove_sender,
    senders,
    set_channel,
    set_decides,
    set_sender,
)
from countersign.db.schema import ChatChannel
from tools.chat import post_test_message
from tools.registry import OutcomeUnknown, ToolFailure

# Who the audit names for a change made here: whoever runs the CLI holds the database's credentials
OPERATOR = "operator (cli)"


def shown(view: ChannelView) -> str:
    inbound = "accepts messages (webhook secret set)" if view.inbound else "posts only"
    chat = f", chat {view.chat_id}" if view.chat_id else ""
    return f"{view.tenant_id}: {view.kind} channel {view.name!r}{chat}; {inbound}"


def decides_shown(view: ChannelView) -> str:
    if view.decides_up_to == "none":
        return f"{view.tenant_id}: every call is decided in the inbox; chat cards only link to it"
    return (
        f"{view.tenant_id}: the chat decides calls up to {view.decides_up_to} risk; riskier ones in the inbox"
    )


def invalid(err: ValidationError) -> click.ClickException:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "channel"
    return click.ClickException(f"invalid channel: {where}: {first['msg']}")  # the input not repeated


@cli.group()
def channels() -> None:
    """A tenant's chat channel (Telegram or Slack): where send_chat_message posts, and which of its
    users may write to an agent through it."""


@channels.command("set")
@click.argument("tenant")
@click.option("--kind", type=click.Choice(["telegram", "slack"]), required=True)
@click.option("--name", required=True, help="What the model and reviewers are told (#sales).")
@click.option(
    "--endpoint",
    envvar="COUNTERSIGN_CHAT_ENDPOINT",
    required=True,
    help="Telegram: the Bot API's base URL; Slack: the Web API's base URL (https://slack.com/api) "
    "with --bot-token, or an incoming webhook URL (a secret: prefer the env var "
    "COUNTERSIGN_CHAT_ENDPOINT).",
)
@click.option(
    "--bot-token",
    envvar="COUNTERSIGN_CHAT_BOT_TOKEN",
    help="Telegram: the bot's token; Slack: the app's bot token, xoxb-… (env COUNTERSIGN_CHAT_BOT_TOKEN).",
)
@click.option("--chat-id", help="The chat (Telegram) or channel id (Slack) to post to, cards included.")
@click.option(
    "--webhook-secret",
    envvar="COUNTERSIGN_CHAT_WEBHOOK_SECRET",
    help="Lets the channel write to an agent: Telegram's secret_token, Slack's signing "
    "secret (env COUNTERSIGN_CHAT_WEBHOOK_SECRET).",
)
def set_command(
    tenant: str, kind: str, name: str, endpoint: str, bot_token: str | None, chat_id: str | None,
    webhook_secret: str | None,
) -> None:  # fmt: skip
    """Create or replace TENANT's chat channel; its secrets are stored encrypted."""
    try:
        settings = ChannelSettings.model_validate({
            "kind": kind, "name": name, "endpoint": endpoint, "bot_token": bot_token, "chat_id": chat_id,
            "webhook_secret": webhook_secret,
        })  # fmt: skip
    except ValidationError as err:
        raise invalid(err) from None

    async def change(session: AsyncSession) -> ChannelView:
        try:
            return await set_channel(session, tenant, settings, OPERATOR)
        except ValueError as err:  # no such tenant, or an endpoint that is not public nor allowed
            raise click.ClickException(str(err)) from None

    click.echo(shown(run(with_session(change))))


@channels.command("show")
@click.argument("tenant")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show_command(tenant: str, as_json: bool) -> None:
    """TENANT's chat channel, without its secrets."""
    view = run(with_session(lambda session: channel_view(session, tenant)))
    if view is None:
        raise click.ClickException(f"{tenant} has no chat channel")
    if as_json:
        print_json(view.model_dump())
    else:
        click.echo(shown(view))
        click.echo(decides_shown(view))


@channels.command("sender")
@click.argument("tenant")
@click.argument("sender")
@click.argument("user")
@click.option("--agent", default="admin-assistant", show_default=True, help="Whom they talk to.")
def sender_command(tenant: str, sender: str, user: str, agent: str) -> None:
    """Messages from SENDER (the channel's user id: Telegram's from.id, Slack's user) are USER's,
    in their conversation with AGENT. Anyone else writing to the channel is refused."""

    async def change(session: AsyncSession) -> None:
        try:
            await set_sender(session, tenant, sender, SenderSettings(user_id=user, agent=agent), OPERATOR)
        except (ValueError, ValidationError) as err:
            raise click.ClickException(str(err)) from None

    run(with_session(change))
    click.echo(f"{tenant}: chat sender {sender} writes as {user} to {agent}")


@channels.command("unlink")
@click.argument("tenant")
@click.argument("sender")
def unlink_command(tenant: str, sender: str) -> None:
    """Unlink SENDER: their messages and presses are refused from now on."""

    async def change(session: AsyncSession) -> None:
        try:
            await remove_sender(session, tenant, sender, OPERATOR)
        except ValueError as err:
            raise click.ClickException(str(err)) from None

    run(with_session(change))
    click.echo(f"{tenant}: chat sender {sender} unlinked")


@channels.command("senders")
@click.argument("tenant")
def senders_command(tenant: str) -> None:
    """Who may write to TENANT's channel and press its cards, as whom."""
    for view in run(with_session(lambda session: senders(session, tenant))):
        click.echo(f"{view.sender} writes as {view.user_id} to {view.agent}")


@channels.command("decides")
@click.argument("tenant")
@click.argument("up_to", type=click.Choice(["none", "low", "medium", "high"]))
def decides_command(tenant: str, up_to: str) -> None:
    """Where a decision may be made: a card of a call up to UP_TO risk gets Approve and Reject in
    the chat, a riskier one only "Open in inbox" (none: every call is decided in the inbox)."""

    async def change(session: AsyncSession) -> ChannelView | None:
        try:
            await set_decides(session, tenant, DecidesSettings.model_validate({"up_to": up_to}), OPERATOR)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        return await channel_view(session, tenant)

    view = run(with_session(change))
    assert view is not None  # just updated
    click.echo(decides_shown(view))


@channels.command("test")
@click.argument("tenant")
def test_command(tenant: str) -> None:
    """Post a test message to TENANT's chat: the settings work when it arrives."""

    async def send(session: AsyncSession) -> tuple[ChatChannel, str | None]:
        channel = await session.get(ChatChannel, tenant)
        if channel is None:
            raise click.ClickException(f"{tenant} has no chat channel")
        try:
            return channel, await post_test_message(channel, OPERATOR)
        except (ToolFailure, OutcomeUnknown) as failure:  # names no URL nor token
            raise click.ClickException(failure.message) from None

    channel, remote_id = run(with_session(send))
    message = f" (message {remote_id})" if remote_id else ""
    click.echo(f"{tenant}: a test post reached {channel.kind} channel {channel.name!r}{message}")


@channels.command("rekey")
def rekey_command() -> None:
    """Encrypt every channel secret again with the first key of COUNTERSIGN_SECRETS_KEY: run it after
    putting a new key first, then drop the old one (docs/explanation/security.md, "Rotating the
    secrets key")."""
    count = run(with_session(rekey))
    click.echo(f"{count} channel(s) encrypted with the first key")


@channels.command("key")
def key_command() -> None:
    """Print a new key for COUNTERSIGN_SECRETS_KEY (nothing is stored)."""
    click.echo(Fernet.generate_key().decode())
