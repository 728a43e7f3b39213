"""Commands: `server` (`inbox serve`: the front door) and `login` (a session for the CLI).

In signed mode every command that acts on a conversation goes through the server with the session
`login` keeps (countersign.cli.session; countersign.cli.door and `approve` / `reject` use it): the
server authenticated the person and issues the proof; a bare `--as NAME` proves nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import click
from pydantic import ValidationError
from sqlalchemy import Update, update

from countersign.cli.app import cli, run
from countersign.cli.session import InboxSession, SessionEnded, inbox_request, session_file
from countersign.cli.ux import command, shown_path
from countersign.db.engine import create_engine
from countersign.db.people import hash_password
from countersign.db.schema import Tenant, User
from countersign.identity.proofs import ensure_key_pair
from countersign.runtime.config import load_settings


@cli.command()
@click.option("--tenant", required=True, help="Tenant slug, e.g. acme.")
@click.option("--as", "user", required=True, help="Who logs in, e.g. bob.")
@click.option("--password", help="Prompted (hidden) when not given.")
@click.option(
    "--inbox", "inbox_url", help="The inbox's URL (default: http://127.0.0.1:COUNTERSIGN_INBOX_PORT)."
)
def login(tenant: str, user: str, password: str | None, inbox_url: str | None) -> None:
    """Log in to the server and keep the session: for requesters (in signed mode start, send, chat,
    answer, rollback, end, status, transcript and audit go through the server with it) and for
    reviewers (approve, reject)."""
    secret = password if password is not None else click.prompt("Password", hide_input=True)
    url = (inbox_url or load_settings().inbox_url).rstrip("/")

    async def body() -> None:
        anonymous = InboxSession(inbox_url=url, tenant_id=tenant, user_id=user, token="")
        try:
            answer = await inbox_request(
                anonymous, "POST", "/api/login", {"tenant_id": tenant, "user_id": user, "password": secret}
            )
        except aiohttp.ClientConnectionError as err:
            raise click.ClickException(f"cannot reach the inbox at {url}: {err}") from None
        path = session_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        session = InboxSession(inbox_url=url, tenant_id=tenant, user_id=user, token=answer["token"])
        path.write_text(session.model_dump_json())
        click.echo(f"logged in to {url} as {user} ({tenant}); session kept in {shown_path(path)}")

    run(body())


@cli.command()
def logout() -> None:
    """End the CLI's inbox session: revoked server-side, then forgotten here."""
    path = session_file()
    try:
        session = InboxSession.model_validate_json(path.read_text())
    except (FileNotFoundError, ValidationError):
        click.echo("not logged in")
        return

    async def body() -> None:
        try:
            await inbox_request(session, "POST", "/api/logout", {})
        except aiohttp.ClientConnectionError as err:
            raise click.ClickException(
                f"cannot reach the inbox at {session.inbox_url} to revoke the session: {err}"
            ) from None
        except SessionEnded:  # already ended (expired, revoked elsewhere): nothing to revoke
            pass

    run(body())
    path.unlink(missing_ok=True)
    click.echo(f"logged out {session.user_id} ({session.tenant_id}) from {session.inbox_url}")


@cli.group()
def inbox() -> None:
    """The reviewers' inbox: pending approvals, proven decisions (web app and JSON API)."""


PORT_OPTION = click.option(
    "--port", type=click.IntRange(0, 65535), help="Default: COUNTERSIGN_INBOX_PORT or 8300."
)
HOST_OPTION = click.option("--host", default="127.0.0.1", show_default=True)


@cli.command("server")
@PORT_OPTION
@HOST_OPTION
def server(port: int | None, host: str) -> None:
    """Serve the Countersign server (the front door: conversation API, chat, inbox) until Ctrl-C
    or SIGTERM; with OIDC login when COUNTERSIGN_OIDC_ISSUER is set."""
    serve_forever(port, host)


@inbox.command()
@PORT_OPTION
@HOST_OPTION
def serve(port: int | None, host: str) -> None:
    """The same server as `server` (its older name)."""
    serve_forever(port, host)


def serve_forever(port: int | None, host: str) -> None:
    # imported here: the server (aiohttp, jinja, authlib) costs every other command a second to start
    from countersign.server.app import running_server
    from countersign.server.oidc import OidcConfig

    settings = load_settings()
    try:
        oidc = OidcConfig.from_env()
    except RuntimeError as err:
        raise click.ClickException(str(err)) from None
    # reverse proxies whose X-Forwarded-For names the client the login rate limit counts
    proxies = frozenset(
        filter(None, map(str.strip, os.environ.get("COUNTERSIGN_INBOX_TRUSTED_PROXIES", "").split(",")))
    )

    async def body() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        bound = settings.inbox_port if port is None else port
        async with running_server(settings, host, bound, oidc=oidc, trusted_proxies=proxies) as url:
            sso = f", single sign-on: {oidc.issuer}" if oidc else ""
            click.echo(f"server serving on {url} (COUNTERSIGN_AUTH={settings.approver_auth}{sso})", err=True)
            await stop.wait()

    run(body())


@inbox.command()
@click.option("--private", "private", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--public", "public", required=True, type=click.Path(dir_okay=False, path_type=Path))
def keys(private: Path, public: Path) -> None:
    """Create the proof key pair (Ed25519 PEM) unless it exists: the private key for the inbox
    (COUNTERSIGN_PROOF_PRIVATE_KEY), the public key for workers (COUNTERSIGN_PROOF_PUBLIC_KEY)."""
    existed = private.exists()
    ensure_key_pair(private, public)
    click.echo(f"{'kept' if existed else 'created'} {private}; public key {public}")


@inbox.command()
@click.option("--tenant", required=True, help="Tenant slug, e.g. acme.")
@click.argument("url", required=False)
@click.option("--clear", is_flag=True, help="Stop posting to the tenant's webhook.")
def webhook(tenant: str, url: str | None, clear: bool) -> None:
    """Set the tenant's Slack-compatible webhook URL for reviewers' notifications (or --clear it)."""
    if bool(url) == clear:
        raise click.UsageError("give a URL or --clear")
    refused = webhook_refusal(url) if url else None
    if refused:
        raise click.BadParameter(refused, param_hint="URL")

    async def body() -> None:
        if await rows_updated(update(Tenant).where(Tenant.id == tenant).values(webhook_url=url)) == 0:
            raise click.ClickException(f"no tenant {tenant!r}")
        click.echo(f"{tenant}: webhook {'cleared' if clear else 'set'}")  # the URL is a secret: not printed

    run(body())


def webhook_refusal(url: str) -> str | None:
    """Why `url` cannot be a webhook, or None. A placeholder copied from the docs
    (`https://hooks.slack.com/…`) was accepted and every notice then failed to post."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return "the webhook URL must be http(s)://HOST/…, the whole URL your chat tool gave you"
    if "…" in url or "..." in url:
        return "the URL still has a placeholder (…): paste the whole URL your chat tool gave you"
    if any(c.isspace() for c in url):
        return "the webhook URL has a space in it"
    return None


async def rows_updated(statement: Update) -> int:
    """Run one UPDATE against DATABASE_URL (or the embedded stack's); how many rows it changed."""
    settings = load_settings()
    if not settings.database_url:
        raise click.ClickException(f"no DATABASE_URL: run `{command()} dev up` or set DATABASE_URL")
    engine = create_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            return (await conn.execute(statement)).rowcount
    finally:
        await engine.dispose()


@inbox.command()
@click.option("--tenant", required=True, help="Tenant slug, e.g. acme.")
@click.option("--as", "user", required=True, help="Whose password, e.g. bob.")
@click.option("--password", help="Prompted (hidden, twice) when not given.")
def password(tenant: str, user: str, password: str | None) -> None:
    """Set a user's inbox password (argon2id). Every session opened under the old one ends."""
    secret = password or click.prompt("New password", hide_input=True, confirmation_prompt=True)
    if not 8 <= len(secret) <= 1000:
        raise click.BadParameter("a password has 8 to 1000 characters", param_hint="--password")

    async def body() -> None:
        statement = (
            update(User)
            .where(User.tenant_id == tenant, User.id == user)
            .values(password_hash=hash_password(secret))
        )
        if await rows_updated(statement) == 0:
            raise click.ClickException(f"no user {user!r} in tenant {tenant!r}")
        click.echo(f"{user} ({tenant}): password set; earlier sessions ended")

    run(body())
