"""The user's notifications: list_notifications shows them, resolve_notification closes one.

A user sees their own notifications and the tenant-wide ones, in their tenant only
(`countersign.db.notifications.visible_to`, which the CLI's `notifications` commands use too);
another user's look exactly like none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from countersign.core.effects import Effect, one_line
from countersign.core.guards import MAX_ROWS
from countersign.db.notifications import (
    RESOLUTION_FIELDS,
    mark_resolved,
    notifications_of,
    visible_to,
)
from countersign.db.schema import Notification
from tools.effects import record_change
from tools.registry import Plan, ToolArgs, ToolContext, ToolFailure, UndoOutcome, compensates, record_id, tool
from tools.resolve import (
    RowView,
    containing,
    locked_row,
    match_first,
    needs,
    restore_fields,
    saved,
)


class NotificationView(RowView):
    id: int
    kind: str  # meeting_proposal, meeting_booked, approval_reminder
    message: str
    status: str
    created_at: datetime
    resolved_at: datetime | None
    resolved_by: str | None
    workflow_id: str | None  # the conversation that raised it


# --- list_notifications ----------------------------------------------------------------------------


class ListNotificationsArgs(ToolArgs):
    status: Literal["open", "resolved", "all"] = Field("open", description="Which ones")
    limit: int = Field(20, ge=1, le=MAX_ROWS, description="At most this many, newest first")


class NotificationList(BaseModel):
    notifications: list[NotificationView]


@tool(risk="low", category="read")
async def list_notifications(ctx: ToolContext, args: ListNotificationsArgs) -> NotificationList:
    """The user's notifications, newest first (default: the open ones): meeting proposals addressed
    to them (accept one with accept_meeting), bookings others made with them, approval reminders."""
    rows = await notifications_of(ctx.session, ctx.tenant_id, ctx.caller.user_id, args.status, args.limit)
    return NotificationList(notifications=[NotificationView.model_validate(row) for row in rows])


# --- resolve_notification --------------------------------------------------------------------------


class ResolveNotificationArgs(ToolArgs):
    notification: str = Field(
        min_length=1, max_length=200, description="The notification's id, or words from its message"
    )
    resolution: str | None = Field(None, max_length=500, description="What was done about it")


class ResolvedNotification(NotificationView):
    resolution: str | None
    changed: bool  # False when it was already resolved


async def find_notification(ctx: ToolContext, ref: str) -> Notification:
    """A notification the user may see: by id, or by text among the open ones."""
    visible = visible_to(ctx.tenant_id, ctx.caller.user_id)
    number = record_id(ref)
    # an id names one notification: never fall back to messages that happen to contain the number
    wanted = (
        visible & (Notification.id == number)
        if number is not None
        else visible & (Notification.status == "open") & containing(Notification.message, ref)
    )
    rows = await match_first(ctx, Notification, wanted, lock=True)
    if not rows:
        raise ToolFailure("NOT_FOUND", f"no notification {ref!r} for this user")
    if len(rows) > 1:
        raise needs("notification", [{"id": n.id, "kind": n.kind, "message": n.message[:160]} for n in rows])
    return rows[0]


@dataclass(kw_only=True)
class ResolvePlan(Plan):
    args: ResolveNotificationArgs
    notification: Notification
    resolver: str

    def effect(self) -> Effect:
        """Its status (the time it is resolved at is the moment the call runs, not part of the effect)."""
        notification = self.notification
        label = one_line(f"notification {notification.id} ({notification.kind}: {notification.message})", 160)
        after = {"status": "resolved", "resolved_by": self.resolver}
        if notification.status != "open":
            after = {}  # already resolved: left as it is
        before = {"status": notification.status, "resolved_by": notification.resolved_by}
        return record_change("notification", notification.id, label, before, after)


async def plan_resolve_notification(ctx: ToolContext, args: ResolveNotificationArgs) -> ResolvePlan:
    notification = await find_notification(ctx, args.notification)
    named = {"notification": str(notification.id)}
    return ResolvePlan(args=args, notification=notification, resolver=ctx.caller.user_id, named=named)


@tool(risk="low", category="write", plan=plan_resolve_notification)
async def resolve_notification(ctx: ToolContext, plan: ResolvePlan) -> ResolvedNotification:
    """Mark one of the user's open notifications resolved, named by its id or by words from its
    message, with an optional note on what was done. An already resolved one is left as it is."""
    notification, args = plan.notification, plan.args
    changed = mark_resolved(notification, ctx.caller.user_id, ctx.now)
    if changed:
        notification = await saved(ctx, notification)
    return ResolvedNotification(
        **NotificationView.model_validate(notification).model_dump(),
        resolution=args.resolution,
        changed=changed,
    )


@compensates(resolve_notification)
async def reopen_notification(
    ctx: ToolContext, args: ResolveNotificationArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Reopen the notification, only while it is still resolved by this very call."""
    if result is None or not result.get("changed"):
        return "never_happened"
    notification = await locked_row(ctx, Notification, result["id"])
    if notification is None:
        return "irreversible"
    previous = {"status": "open", "resolved_at": None, "resolved_by": None}
    changed = {name: result[name] for name in RESOLUTION_FIELDS}
    return restore_fields(notification, previous, changed, together=[RESOLUTION_FIELDS])
