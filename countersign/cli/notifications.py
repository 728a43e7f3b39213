"""`notifications list` and `notifications resolve`: one user's notifications, read and closed
directly in the database, with the same scoping as the agent's tools (countersign/db/notifications.py):
the user's own and their tenant's tenant-wide ones, never another user's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.records import table
from countersign.cli.ux import with_session
from countersign.db.notifications import (
    StatusFilter,
    as_row,
    mark_resolved,
    notification_of,
    notifications_of,
)
from countersign.db.schema import User
from countersign.identity.mode import recorded_mode


async def require_user(session: AsyncSession, tenant: str, user: str) -> None:
    if await session.get(User, (tenant, user)) is None:
        raise click.ClickException(f"no user {user!r} in tenant {tenant!r}")


@cli.group()
def notifications() -> None:
    """A user's notifications: meeting proposals addressed to them, bookings, approval reminders."""


@notifications.command("list")
@click.option("--tenant", required=True)
@click.option("--user", required=True, help="Whose notifications (their own and the tenant-wide ones).")
@click.option("--status", type=click.Choice(["open", "resolved", "all"]), default="open", show_default=True)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100))
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON.")
def list_notifications(tenant: str, user: str, status: StatusFilter, limit: int, as_json: bool) -> None:
    """The user's notifications, newest first."""

    async def rows(session: AsyncSession) -> list[dict[str, Any]]:
        await require_user(session, tenant, user)
        return [as_row(n) for n in await notifications_of(session, tenant, user, status, limit)]

    found = run(with_session(rows))
    if as_json:
        print_json(found)
    elif not found:
        click.echo(f"no {'' if status == 'all' else status + ' '}notifications for {user}")
    else:
        cells = [("id", "kind", "status", "created_at", "message")] + [
            (str(r["id"]), r["kind"], r["status"], r["created_at"][:19], r["message"][:100]) for r in found
        ]
        click.echo(table(cells))


@notifications.command("resolve")
@click.argument("notification_id", type=click.IntRange(1))
@click.option("--tenant", required=True)
@click.option("--as", "user", required=True, help="Who resolves it (names mode): theirs or tenant-wide.")
@click.option("--json", "as_json", is_flag=True, help="Print the notification as JSON.")
def resolve_notification(notification_id: int, tenant: str, user: str, as_json: bool) -> None:
    """Mark one of the user's notifications resolved (an already resolved one is left as it is)."""

    async def resolve(session: AsyncSession) -> tuple[dict[str, Any], bool]:
        if await recorded_mode(session) == "signed":  # `--as` is a name nobody proved
            raise click.ClickException(
                "the deployment runs COUNTERSIGN_AUTH=signed: a notification is resolved by its user, "
                "through their own conversation (the resolve_notification tool), not by a name given here"
            )
        await require_user(session, tenant, user)
        found = await notification_of(session, tenant, user, notification_id)
        if found is None:
            raise click.ClickException(f"no notification {notification_id} for {user} in {tenant}")
        changed = mark_resolved(found, user, datetime.now(UTC))
        await session.flush()
        return as_row(found), changed

    row, changed = run(with_session(resolve))
    if as_json:
        print_json(row | {"changed": changed})
    else:
        click.echo(f"notification {row['id']} {'resolved' if changed else 'was already resolved'}")
