"""`users list | deactivate | activate | grant | revoke` and `rate-limits show | set`: who may act in a
tenant, with which scopes, and how often (countersign/core/access.py).

Run by an operator (or a tenant's admin) with access to DATABASE_URL, like `tokens`. A deactivation
takes effect at the deactivated user's next tool call in every conversation already running.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import click
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.records import table
from countersign.cli.ux import with_session
from countersign.core.access import SCOPE_MEANING, SCOPES
from countersign.db import access
from countersign.db.ratelimit import EVERY_TOOL
from countersign.db.schema import TenantRateLimit

T = TypeVar("T")
GRANTED_BY = "cli"


@cli.group(
    help="A tenant's users: whether they are active, and the scopes they hold.\n\n\b\nScopes:\n"
    + "\n".join(f"  {scope}: {meaning}" for scope, meaning in SCOPE_MEANING.items())
)
def users() -> None:
    pass


def run_for_user(work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """Run `work` in a transaction; an unknown user is a one-line refusal."""

    async def guarded(session: AsyncSession) -> T:
        try:
            return await work(session)
        except access.UnknownUser as err:
            raise click.ClickException(str(err)) from None

    return run(with_session(guarded))


@users.command("list")
@click.option("--tenant", required=True, help="The tenant whose users to list.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_users(tenant: str, as_json: bool) -> None:
    """List the tenant's users: active or not, roles, scopes."""

    async def work(session: AsyncSession) -> list[access.UserView]:
        return await access.users_of(session, tenant)

    rows = run(with_session(work))
    if as_json:
        print_json([vars(u) for u in rows])
        return
    header = ("user", "name", "active", "roles", "scopes")
    cells = [
        (
            u.id,
            u.display_name,
            "yes" if u.active else "no",
            ",".join(u.roles) or "-",
            ",".join(u.scopes) or "-",
        )
        for u in rows
    ]
    click.echo(table([header, *cells]) if cells else f"no users in {tenant}")


def _set_active(tenant: str, user: str, active: bool) -> None:
    async def work(session: AsyncSession) -> bool:
        return await access.set_active(session, tenant, user, active, datetime.now(UTC))

    changed = run_for_user(work)
    state = "active" if active else "deactivated"
    click.echo(f"{user} ({tenant}) is {state}" + ("" if changed else " already"))


@users.command()
@click.argument("user")
@click.option("--tenant", required=True)
def deactivate(user: str, tenant: str) -> None:
    """Deactivate USER: no login, no decisions or messages, and their running conversations stop
    acting at their next tool call (CONNECTION_INACTIVE)."""
    _set_active(tenant, user, active=False)


@users.command()
@click.argument("user")
@click.option("--tenant", required=True)
def activate(user: str, tenant: str) -> None:
    """Make a deactivated USER active again."""
    _set_active(tenant, user, active=True)


@users.command()
@click.argument("user")
@click.argument("scopes", nargs=-1, required=True, type=click.Choice(SCOPES))
@click.option("--tenant", required=True)
def grant(user: str, scopes: tuple[str, ...], tenant: str) -> None:
    """Grant USER one or more SCOPES."""

    async def work(session: AsyncSession) -> list[str]:
        return await access.grant(session, tenant, user, scopes, GRANTED_BY)

    added = run_for_user(work)
    click.echo(f"granted {user} ({tenant}): {', '.join(added)}" if added else f"{user} held them already")


@users.command()
@click.argument("user")
@click.argument("scopes", nargs=-1, required=True, type=click.Choice(SCOPES))
@click.option("--tenant", required=True)
def revoke(user: str, scopes: tuple[str, ...], tenant: str) -> None:
    """Revoke one or more SCOPES from USER: tools that need them answer SCOPES_MISSING."""

    async def work(session: AsyncSession) -> list[str]:
        return await access.revoke(session, tenant, user, scopes)

    removed = run_for_user(work)
    click.echo(
        f"revoked from {user} ({tenant}): {', '.join(removed)}" if removed else f"{user} held none of them"
    )


@cli.group("rate-limits")
def rate_limits() -> None:
    """A tenant's tool-call rate limits: its shared bucket and each user's, per tool or for all (*)."""


@rate_limits.command("show")
@click.option("--tenant", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show_limits(tenant: str, as_json: bool) -> None:
    """Show the tenant's limits (tools without a row of their own follow `*`; no row at all: the
    worker's RATE_LIMIT_* settings)."""

    async def work(session: AsyncSession) -> list[dict[str, object]]:
        rows = await session.scalars(
            select(TenantRateLimit).where(TenantRateLimit.tenant_id == tenant).order_by(TenantRateLimit.tool)
        )
        return [
            {
                "tool": r.tool,
                "per_s": r.per_s,
                "burst": r.burst,
                "user_per_s": r.user_per_s,
                "user_burst": r.user_burst,
            }
            for r in rows
        ]

    rows = run(with_session(work))
    if as_json:
        print_json(rows)
        return
    header = ("tool", "tenant per s", "tenant burst", "user per s", "user burst")
    cells = [tuple(f"{v:g}" if isinstance(v, float) else str(v) for v in r.values()) for r in rows]
    click.echo(table([header, *cells]) if cells else f"{tenant} sets no limits: the worker's apply")


@rate_limits.command("set")
@click.option("--tenant", required=True)
@click.option("--tool", default=EVERY_TOOL, show_default=True, help="A tool's name, or * for every tool.")
@click.option(
    "--per-s", type=click.FloatRange(min=0, min_open=True), required=True, help="Tenant: calls a second."
)
@click.option("--burst", type=click.FloatRange(min=1), required=True, help="Tenant: calls at once.")
@click.option("--user-per-s", type=click.FloatRange(min=0, min_open=True), required=True, help="Each user.")
@click.option("--user-burst", type=click.FloatRange(min=1), required=True, help="Each user.")
def set_limits(
    tenant: str, tool: str, per_s: float, burst: float, user_per_s: float, user_burst: float
) -> None:
    """Set the tenant's limits for TOOL (default: every tool without its own row)."""

    async def work(session: AsyncSession) -> None:
        await access.set_rate_limit(session, tenant, tool, (per_s, burst), (user_per_s, user_burst))

    run(with_session(work))
    click.echo(
        f"{tenant} {tool}: {per_s:g}/s burst {burst:g} for the tenant, "
        f"{user_per_s:g}/s burst {user_burst:g} for each user"
    )
