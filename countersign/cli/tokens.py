"""`tokens create | list | revoke`: API tokens for the server's machine clients
(countersign.identity.tokens).

Run by an operator (or a tenant's admin) with access to DATABASE_URL. The secret is printed once;
only its SHA-256 is stored.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.records import table
from countersign.cli.ux import with_session
from countersign.identity import tokens as api_tokens


@cli.group()
def tokens() -> None:
    """API tokens: a machine client acting for some users of one tenant through the server."""


@tokens.command()
@click.option("--tenant", required=True, help="The tenant the token belongs to.")
@click.option("--name", required=True, help="A name to list and revoke it by, e.g. telegram-bridge.")
@click.option("--act-as", "act_as", multiple=True, required=True, help="A user it may act for (repeat).")
def create(tenant: str, name: str, act_as: tuple[str, ...]) -> None:
    """Create a token; its secret is printed once, here, and never again."""

    async def work(session: AsyncSession) -> str:
        try:
            return await api_tokens.create(session, tenant, name, list(act_as))
        except api_tokens.TokenRefused as err:
            raise click.ClickException(str(err)) from None

    secret = run(with_session(work))
    click.echo(secret)
    click.echo(
        f"token {name} ({tenant}) may act for {', '.join(sorted(set(act_as)))}; this is the only time "
        "its secret is shown: send it as `Authorization: Bearer …`",
        err=True,
    )


@tokens.command("list")
@click.option("--tenant", help="Only this tenant's tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_tokens(tenant: str | None, as_json: bool) -> None:
    """List tokens (never their secrets): tenant, name, users, created, last used, revoked."""

    async def work(session: AsyncSession) -> list[dict[str, object]]:
        return [
            {
                "tenant_id": t.tenant_id,
                "name": t.name,
                "act_as": t.act_as,
                "created_at": t.created_at.isoformat(),
                "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
                "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
            }
            for t in await api_tokens.listed(session, tenant)
        ]

    rows = run(with_session(work))
    if as_json:
        print_json(rows)
        return
    header = ("tenant", "name", "acts for", "created", "last used", "revoked")
    cells = [
        (str(r["tenant_id"]), str(r["name"]), ",".join(r["act_as"]), str(r["created_at"])[:19],  # type: ignore[arg-type]
         str(r["last_used_at"] or "-")[:19], str(r["revoked_at"] or "-")[:19])
        for r in rows
    ]  # fmt: skip
    click.echo(table([header, *cells]) if cells else "no tokens")


@tokens.command()
@click.argument("name")
@click.option("--tenant", help="The token's tenant (needed when two tenants use the name).")
def revoke(name: str, tenant: str | None) -> None:
    """Revoke a token: its next request is refused (401)."""

    async def work(session: AsyncSession) -> str:
        try:
            row = await api_tokens.revoke(session, name, tenant, datetime.now(UTC))
        except api_tokens.TokenRefused as err:
            raise click.ClickException(str(err)) from None
        return row.tenant_id

    owner = run(with_session(work))
    click.echo(f"revoked token {name} ({owner})")
