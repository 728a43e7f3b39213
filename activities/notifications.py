"""Tell reviewers about a call that waits for them: when it starts waiting, before it expires, and
(the tenant's admins) when it expired undecided.

Through the outbox, at least once, one per (call, kind) and recipient: the activity first queues an
email per recipient (`email_outbox`, delivered by the same code as the agent's emails) and one
webhook post for the tenant (`webhook_outbox`, Slack-compatible JSON), each under an idempotency
key; then it delivers what is still queued. A retry queues nothing new and re-sends only what has
not been confirmed sent. Each message links to the item in the inbox.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.email import EmailActivities
from countersign.approvals import APPROVER_ROLES, FOUR_EYES
from countersign.db.schema import EmailOutbox, Tenant, User, UserRole, WebhookOutbox
from countersign.tooling import Risk

NoticeKind = Literal["request", "reminder", "escalation"]
WEBHOOK_TIMEOUT_S = 10
ARGS_SHOWN = 500


class ApprovalNotice(BaseModel):
    kind: NoticeKind
    tenant_id: str
    workflow_id: str
    call_id: str
    tool: str
    args: str
    risk: Risk
    requested_by: str
    expires_at: datetime


def recipients_roles(notice: ApprovalNotice) -> frozenset[str]:
    """Who is told: those who may decide the call; on expiry, the tenant's admins."""
    return frozenset({"admin"}) if notice.kind == "escalation" else APPROVER_ROLES[notice.risk]


def wording(notice: ApprovalNotice, link: str) -> tuple[str, str]:
    """(subject, text) of a notice."""
    what = f"{notice.tool} (call {notice.call_id}, risk {notice.risk}) requested by {notice.requested_by}"
    subject = {
        "request": f"Approval needed: {notice.tool}",
        "reminder": f"Reminder: {notice.tool} expires soon",
        "escalation": f"Expired undecided: {notice.tool}",
    }[notice.kind]
    state = (
        f"expired undecided at {notice.expires_at.isoformat()}"
        if notice.kind == "escalation"
        else f"waits for a decision until {notice.expires_at.isoformat()}"
    )
    text = f"{what} {state}.\nArguments: {notice.args[:ARGS_SHOWN]}\nOpen it: {link}"
    return subject, text


class NotificationActivities:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], email: EmailActivities, inbox_url: str
    ) -> None:
        self._sessions = sessions
        self._email = email
        self._inbox_url = inbox_url.rstrip("/")

    @activity.defn(name="notify_approval")
    async def notify_approval(self, notice: ApprovalNotice) -> None:
        emails, webhooks = await self._queue(notice)
        failures = []
        for outbox_id in emails:
            try:
                await self._email.deliver_email(outbox_id)
            except ApplicationError as err:
                failures.append(f"email {outbox_id}: {err.message}")
        for webhook_id in webhooks:
            error = await self._post(webhook_id)
            if error:
                failures.append(f"webhook {webhook_id}: {error}")
        if failures:  # a retry delivers only what is still queued
            raise ApplicationError("; ".join(failures), type="NotificationUndelivered")

    async def _queue(self, notice: ApprovalNotice) -> tuple[list[int], list[int]]:
        """Queue every message of this notice once (idempotency keys); the ids still to deliver."""
        key = f"notice:{notice.workflow_id}:{notice.call_id}:{notice.kind}"
        link = f"{self._inbox_url}/#{notice.workflow_id}/{notice.call_id}"
        subject, text = wording(notice, link)
        async with self._sessions() as session, session.begin():
            people = await session.execute(
                select(User.id, User.email)
                .join(UserRole, (UserRole.tenant_id == User.tenant_id) & (UserRole.user_id == User.id))
                .where(User.tenant_id == notice.tenant_id, UserRole.role.in_(recipients_roles(notice)))
                .distinct()
                .order_by(User.id)
            )
            for user_id, address in people:
                if (
                    notice.kind != "escalation"
                    and notice.risk in FOUR_EYES
                    and user_id == notice.requested_by
                ):
                    continue  # may not decide their own call: not asked to
                await session.execute(
                    insert(EmailOutbox)
                    .values(
                        tenant_id=notice.tenant_id,
                        idempotency_key=f"{key}:{user_id}",
                        to_address=address,
                        subject=subject,
                        body=text,
                    )
                    .on_conflict_do_nothing(index_elements=[EmailOutbox.idempotency_key])
                )
            url = await session.scalar(select(Tenant.webhook_url).where(Tenant.id == notice.tenant_id))
            if url:
                payload = {"text": f"*{subject}*\n{text}", "kind": notice.kind, "link": link}
                await session.execute(
                    insert(WebhookOutbox)
                    .values(tenant_id=notice.tenant_id, idempotency_key=key, url=url, payload=payload)
                    .on_conflict_do_nothing(index_elements=[WebhookOutbox.idempotency_key])
                )
            emails = await session.scalars(
                select(EmailOutbox.id).where(
                    EmailOutbox.idempotency_key.like(f"{key}:%"),
                    EmailOutbox.status.in_(("queued", "sending")),
                )
            )
            webhooks = await session.scalars(
                select(WebhookOutbox.id).where(
                    WebhookOutbox.idempotency_key == key, WebhookOutbox.status == "queued"
                )
            )
            return list(emails), list(webhooks)

    async def _post(self, webhook_id: int) -> str | None:
        """POST one queued webhook; None when the receiver accepted it (then it is marked sent)."""
        async with self._sessions() as session:
            row = await session.get(WebhookOutbox, webhook_id)
            if row is None or row.status != "queued":
                return None
            url, payload = row.url, row.payload
        error = None
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT_S)) as http,
                http.post(url, json=payload) as response,
            ):
                if response.status >= 300:
                    error = f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError) as err:
            error = f"{type(err).__name__}: {err}"
        async with self._sessions() as session, session.begin():
            values: dict[str, Any] = {"attempts": WebhookOutbox.attempts + 1, "error": error}
            if error is None:
                values |= {"status": "sent", "sent_at": func.now()}
            await session.execute(
                update(WebhookOutbox).where(WebhookOutbox.id == webhook_id).values(**values)
            )
        return error
