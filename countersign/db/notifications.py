"""A person's notifications: what they may see and resolve, for the agent's tools and the CLI alike.

A notification is either addressed to one user (`user_id`) or to everyone in its tenant (`user_id`
NULL: an approval reminder). A user sees and resolves exactly those two kinds in their own tenant;
every query here takes the tenant and the user from its caller, never from the notification.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.db.schema import Notification

StatusFilter = Literal["open", "resolved", "all"]
RESOLUTION_FIELDS = {"status", "resolved_at", "resolved_by"}  # what resolving sets, and its undo restores
MAX_LISTED = 100


def visible_to(tenant_id: str, user_id: str) -> ColumnElement[bool]:
    """The notifications `user_id` of `tenant_id` may see: their own and the tenant-wide ones."""
    return (Notification.tenant_id == tenant_id) & or_(
        Notification.user_id == user_id, Notification.user_id.is_(None)
    )


async def notifications_of(
    session: AsyncSession, tenant_id: str, user_id: str, status: StatusFilter = "open", limit: int = 20
) -> Sequence[Notification]:
    """The user's notifications with that status, newest first."""
    query = select(Notification).where(visible_to(tenant_id, user_id))
    if status != "all":
        query = query.where(Notification.status == status)
    query = query.order_by(Notification.created_at.desc(), Notification.id.desc())
    return (await session.scalars(query.limit(min(limit, MAX_LISTED)))).all()


async def notification_of(
    session: AsyncSession, tenant_id: str, user_id: str, notification_id: int
) -> Notification | None:
    """One notification the user may see, locked for the rest of the transaction; None otherwise
    (another user's or another tenant's look the same as none at all)."""
    query = select(Notification).where(visible_to(tenant_id, user_id), Notification.id == notification_id)
    return await session.scalar(query.with_for_update())


def mark_resolved(notification: Notification, user_id: str, now: datetime) -> bool:
    """Resolve an open notification; False (and nothing changed) when it already was."""
    if notification.status != "open":
        return False
    notification.status, notification.resolved_at, notification.resolved_by = "resolved", now, user_id
    return True


def as_row(n: Notification) -> dict[str, Any]:
    """A notification as the CLI's `--json` and the server's `/api/notifications` answer it."""
    return {
        "id": n.id,
        "kind": n.kind,
        "status": n.status,
        "message": n.message,
        "created_at": n.created_at.isoformat(),
        "resolved_at": n.resolved_at.isoformat() if n.resolved_at else None,
        "resolved_by": n.resolved_by,
        "workflow_id": n.workflow_id,
    }
