"""Tell reviewers about a call that waits for them: when it starts waiting, before it expires, and
(the tenant's admins) when it expired undecided.

Through the outbox, at least once, one per (call, kind) and recipient: the activity first queues an
email per recipient and one webhook post for the tenant (Slack-compatible JSON) in
`notification_outbox`, each under an idempotency key; then it delivers what is still queued. A retry
queues nothing new and re-sends only what was not confirmed sent. Each message links to the item in
the inbox. These are kept apart from `email_outbox`, which holds only what agents send.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

import aiohttp
import aiosmtplib
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeats
from countersign.core.activity_refs import NOTIFY_APPROVAL
from countersign.core.approvals import APPROVER_ROLES, FOUR_EYES, ApprovalNotice
from countersign.core.authority import ADMIN
from countersign.core.calls import call_key
from countersign.core.effects import Effect, effect_shown, effect_warnings
from countersign.core.mail import message_id
from countersign.core.shown import Folded, argument_text, argument_warnings, folded
from countersign.db.events import publish
from countersign.db.quorum import quorum_said
from countersign.db.schema import ApprovalRequest, NotificationOutbox, Tenant, User, UserRole

WEBHOOK_TIMEOUT_S = 10
NOTICE_HEADER = "X-Countersign-Notice"  # on every notice email: request, reminder or escalation
ARGS_SHOWN = 500  # characters of one argument's line
ARG_LINES_SHOWN = 20
# What a queued webhook notice names as its recipient: the tenant's URL is a secret (sealed in
# `tenants`), so the outbox never holds it; it is read when the notice is sent.
WEBHOOK_RECIPIENT = "tenant webhook"
NO_MAIL_SERVER = (
    "no mail server configured: set SMTP_HOST (`dev up` runs a mail catcher, `mail list` reads it)"
)


def recipients_roles(notice: ApprovalNotice) -> frozenset[str]:
    """Who is told: those who may decide the call; on expiry, the tenant's admins."""
    return frozenset({ADMIN}) if notice.kind == "escalation" else APPROVER_ROLES[notice.risk]


def wording(notice: ApprovalNotice, link: str, effect: Effect | None, quorum: str = "") -> tuple[str, str]:
    """(subject, text) of a notice: what the call will do first (its recorded effect), then its
    arguments; a quorum's call says how far it is (`quorum`, `quorum_said`) after its state."""
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
    every = argument_text(notice.args)
    args = folded(every[:ARG_LINES_SHOWN], ARGS_SHOWN)
    lines = "\n".join(f"  {line}" for line in args.lines)
    if len(every) > ARG_LINES_SHOWN:
        lines += f"\n  … {len(every) - ARG_LINES_SHOWN:,} more arguments: show all on the card"
    found = (effect_warnings(effect) if effect else []) + argument_warnings(notice.args)
    warnings = "".join(f"Check: {w}\n" for w in found)
    shown = effect_shown(effect) if effect else Folded(lines=[])
    does = "".join(f"{line}\n" for line in shown.lines)
    whole = (
        f"Some lines are folded here; the card shows all of them: {link}\n"
        if args.folds or shown.folds or len(every) > ARG_LINES_SHOWN
        else ""
    )
    far = f"{quorum}\n" if quorum else ""
    text = f"{what} {state}.\n{far}{does}Arguments:\n{lines}\n{warnings}{whole}Open it: {link}"
    return subject, text


async def recorded_request(session: AsyncSession, notice: ApprovalNotice) -> ApprovalRequest | None:
    """The approval request the notice is about, as the worker recorded it."""
    return await session.scalar(
        select(ApprovalRequest).where(
            ApprovalRequest.conversation_id == notice.conversation_id,
            ApprovalRequest.call_id == notice.call_id,
        )
    )


class NotificationActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        inbox_url: str,
        smtp_host: str,
        smtp_port: int,
        sender: str,
        *,
        timeout: float = 30.0,
        smtp_configured: bool = True,
    ) -> None:
        self._sessions = sessions
        self._inbox_url = inbox_url.rstrip("/")
        self._smtp = (smtp_host, smtp_port, sender, timeout)
        self._smtp_configured = smtp_configured
        self._said_unconfigured = False

    @activity.defn(name=NOTIFY_APPROVAL.name)
    @heartbeats
    async def notify_approval(self, notice: ApprovalNotice) -> None:
        failures = []
        for row_id in await self._queue(notice):
            error = await self._deliver(row_id)
            if error:
                failures.append(f"notice {row_id}: {error}")
        if failures:  # a retry delivers only what is still queued
            raise ApplicationError("; ".join(failures), type="NotificationUndelivered")

    async def _queue(self, notice: ApprovalNotice) -> list[int]:
        """Queue every message of this notice once (idempotency keys); the ids still to deliver."""
        key = f"notice:{call_key(notice.workflow_id, notice.conversation_id, notice.call_id)}:{notice.kind}"
        link = f"{self._inbox_url}/#{notice.workflow_id}/{notice.call_id}"
        async with self._sessions() as session, session.begin():
            request = await recorded_request(session, notice)
            effect = Effect.model_validate(request.effect) if request and request.effect is not None else None
            quorum = await quorum_said(session, request)
            subject, text = wording(notice, link, effect, quorum)
            people = await session.execute(
                select(User.id, User.email)
                .join(UserRole, (UserRole.tenant_id == User.tenant_id) & (UserRole.user_id == User.id))
                .where(User.tenant_id == notice.tenant_id, UserRole.role.in_(recipients_roles(notice)))
                .distinct()
                .order_by(User.id)
            )
            rows: list[dict[str, Any]] = []
            told: list[str] = []
            for user_id, address in people:
                own = notice.risk in FOUR_EYES and user_id == notice.requested_by
                if own and notice.kind != "escalation":
                    continue  # may not decide their own call: not asked to
                told.append(user_id)
                rows.append(
                    {"idempotency_key": f"{key}:email:{user_id}", "channel": "email", "recipient": address}
                )
            url = await session.scalar(select(Tenant.webhook_url).where(Tenant.id == notice.tenant_id))
            if url:  # the outbox names no URL: it is the tenant's secret, read again when sent
                payload = {"text": f"*{subject}*\n{text}", "kind": notice.kind, "link": link}
                rows.append({"idempotency_key": f"{key}:webhook", "channel": "webhook",
                             "recipient": WEBHOOK_RECIPIENT, "payload": payload})  # fmt: skip
            await self._tell_requester(session, notice, told, effect, quorum)
            for row in rows:
                await session.execute(
                    insert(NotificationOutbox)
                    .values(tenant_id=notice.tenant_id, subject=subject, body=text, **row)
                    .on_conflict_do_nothing(index_elements=[NotificationOutbox.idempotency_key])
                )
            queued = await session.scalars(
                select(NotificationOutbox.id)
                .where(
                    # the key's own `_` and `%` are literal (autoescape): another call's rows never match
                    NotificationOutbox.idempotency_key.startswith(f"{key}:", autoescape=True),
                    NotificationOutbox.status == "queued",
                )
                .order_by(NotificationOutbox.id)
            )
            return list(queued)

    @staticmethod
    async def _tell_requester(
        session: AsyncSession,
        notice: ApprovalNotice,
        reviewers: list[str],
        effect: Effect | None,
        quorum: str,
    ) -> None:
        """The conversation's readers learn that the call waits (for whom, until when, deciding on
        what effect, how far its quorum is) or expired."""
        if notice.kind == "reminder":
            return
        state = "pending" if notice.kind == "request" else "expired"
        data: dict[str, Any] = {"call_id": notice.call_id, "tool": notice.tool, "state": state}
        data["risk"] = notice.risk
        if state == "pending":
            data |= {"may_decide": reviewers, "expires_at": notice.expires_at.isoformat()}
            data |= {"quorum": quorum} if quorum else {}
            if effect is not None:
                shown = effect_shown(effect)
                data |= {
                    "effect_lines": shown.lines,
                    "effect_folds": [f.model_dump() for f in shown.folds],
                    "resolved": effect.resolved,
                }
        key = f"approval:{notice.call_id}:{state}"
        instance = notice.workflow_id, notice.conversation_id
        await publish(session, *instance, notice.tenant_id, "approval", data, key)

    async def _deliver(self, row_id: int) -> str | None:
        """Send one queued notice; None when the server or receiver accepted it (it is then `sent`)."""
        async with self._sessions() as session:
            row = await session.get(NotificationOutbox, row_id)
            if row is None or row.status != "queued":
                return None
            channel, recipient, subject, body, payload, key = (
                row.channel, row.recipient, row.subject, row.body, row.payload, row.idempotency_key
            )  # fmt: skip
            if channel == "webhook" and recipient == WEBHOOK_RECIPIENT:  # cleared since: ""
                url = await session.scalar(select(Tenant.webhook_url).where(Tenant.id == row.tenant_id))
                recipient = url or ""
        if channel == "email" and not self._smtp_configured:
            await self._undeliverable(row_id, NO_MAIL_SERVER)
            return None  # not a failure to retry: nothing will have changed in an hour
        try:
            if channel == "email":
                await self._send_email(recipient, subject, body, key)
                error = None
            elif not recipient:
                error = "the tenant's webhook was cleared after the notice was queued"
            else:
                error = await self._post(recipient, payload or {})
        except (aiosmtplib.SMTPException, OSError, TimeoutError, aiohttp.ClientError) as err:
            error = f"{type(err).__name__}: {err}"
        async with self._sessions() as session, session.begin():
            values: dict[str, Any] = {"attempts": NotificationOutbox.attempts + 1, "error": error}
            if error is None:
                values |= {"status": "sent", "sent_at": func.now()}
            await session.execute(
                update(NotificationOutbox).where(NotificationOutbox.id == row_id).values(**values)
            )
        return error

    async def _undeliverable(self, row_id: int, why: str) -> None:
        """Leave the notice queued with the reason on its row (operators see it), say so in the log
        once per worker, and do not retry."""
        if not self._said_unconfigured:
            activity.logger.warning("reviewers' notices by email are not sent: %s", why)
            self._said_unconfigured = True
        async with self._sessions() as session, session.begin():
            await session.execute(
                update(NotificationOutbox)
                .where(NotificationOutbox.id == row_id, NotificationOutbox.error.is_(None))
                .values(attempts=NotificationOutbox.attempts + 1, error=why)
            )

    async def _send_email(self, to: str, subject: str, body: str, key: str) -> None:
        host, port, sender, timeout = self._smtp
        message = EmailMessage()
        message["From"], message["To"], message["Subject"] = sender, to, subject
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = message_id(key, sender)  # the same on a re-send: recognizable
        message[NOTICE_HEADER] = key.split(":")[3]  # the kind, for mail filters (and tests)
        message.set_content(body)
        await aiosmtplib.send(message, hostname=host, port=port, timeout=timeout)

    @staticmethod
    async def _post(url: str, payload: dict[str, Any]) -> str | None:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT_S)) as http,
            http.post(url, json=payload) as response,
        ):
            return f"HTTP {response.status}" if response.status >= 300 else None
