"""deliver_email: send one queued outbox row over SMTP, at most once as far as we can know.

A delivery holds a transaction-scoped advisory lock on the row for as long as it runs (a guard
transaction on its own connection). That lock is what "a live delivery owns this row" means: a row
found in 'sending' while we hold the lock was left there by a delivery that died (worker crash,
lost connection), so it is stale and claimed again. The schema keeps no claim timestamp, and the
lock is more exact than one: a slow live delivery is never mistaken for a dead one.

The claim itself is one conditional UPDATE (queued or stale sending -> sending), so it cannot race
the send_email compensation, which cancels only a 'queued' row. An email that died after the server
accepted it but before 'sent' was recorded is sent again on retry; its Message-ID, derived from the
call's idempotency key, is the same both times, so the copy is recognizable (and most servers and
clients drop it).

The SMTP server sits behind a circuit breaker: after `failure_threshold` consecutive failures
deliveries fail fast with a retryable "SmtpCircuitOpen" error whose `next_retry_delay` is the rest of
the cool-down, instead of each waiting for a connection timeout.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

import aiosmtplib
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeats
from countersign.core.activity_refs import DELIVER_EMAIL
from countersign.core.mail import message_id
from countersign.db.leads import rescore_ids
from countersign.db.schema import EmailOutbox, Lead
from countersign.runtime.circuit import CircuitBreaker

FINAL_STATUSES = frozenset({"sent", "cancelled", "failed"})
# The server refused this message for good (a recipient or the sender): retrying cannot help, and
# the server answered, so it counts as healthy for the breaker.
PERMANENT_REFUSALS = (aiosmtplib.SMTPRecipientsRefused, aiosmtplib.SMTPSenderRefused)


def compose(row: Any, sender: str, now: datetime) -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = row.to_address
    message["Subject"] = row.subject
    message["Date"] = format_datetime(now)
    message["Message-ID"] = message_id(row.idempotency_key, sender)
    message.set_content(row.body)
    if row.html_body:  # sanitised by the tool before it was stored; the plain text stays the fallback
        message.add_alternative(row.html_body, subtype="html")
    return message


class EmailActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        smtp_host: str,
        smtp_port: int,
        sender: str,
        *,
        breaker: CircuitBreaker | None = None,
        timeout: float = 30.0,
        cool_down_s: float = 300.0,
    ) -> None:
        self._sessions = sessions
        self._host = smtp_host
        self._port = smtp_port
        self._sender = sender
        self._timeout = timeout
        self.breaker = breaker or CircuitBreaker("smtp", failure_threshold=5, cool_down=cool_down_s)

    @activity.defn(name=DELIVER_EMAIL.name)
    @heartbeats
    async def deliver_email(self, outbox_id: int) -> str:
        """Deliver outbox row `outbox_id`; returns its final status: sent, cancelled or failed."""
        async with self._sessions() as guard, guard.begin():
            key = func.hashtextextended(f"countersign:email:{outbox_id}", 0)
            if not await guard.scalar(select(func.pg_try_advisory_xact_lock(key))):
                raise ApplicationError(
                    f"email {outbox_id} is being delivered by another worker",
                    type="DeliveryInProgress",
                    next_retry_delay=timedelta(seconds=5),
                )
            status = await self._status(outbox_id)
            if status in FINAL_STATUSES:
                return status
            self.breaker.allow_or_retry("SmtpCircuitOpen")
            return await self._claim_and_send(outbox_id)

    async def _claim_and_send(self, outbox_id: int) -> str:
        """Claim the row and send it; the breaker let this call through, so it must hear how it went."""
        try:
            row = await self._claim(outbox_id)
            if row is None:  # cancelled between our look and the claim
                self.breaker.abandon()
                return await self._status(outbox_id)
            await aiosmtplib.send(
                compose(row, self._sender, datetime.now(UTC)),
                hostname=self._host,
                port=self._port,
                timeout=self._timeout,
            )
        except PERMANENT_REFUSALS as exc:
            self.breaker.success()
            await self._finish(outbox_id, "failed", error=str(exc))
            return "failed"
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            self.breaker.failure()
            await self._finish(outbox_id, "queued", error=str(exc))  # a retry claims it again
            raise ApplicationError(f"SMTP delivery failed: {exc}", type="SmtpError") from exc
        except BaseException:
            self.breaker.abandon()
            raise
        self.breaker.success()
        await self._finish(outbox_id, "sent")
        return "sent"

    async def _status(self, outbox_id: int) -> str:
        async with self._sessions() as session:
            status = await session.scalar(select(EmailOutbox.status).where(EmailOutbox.id == outbox_id))
        if status is None:
            raise ApplicationError(f"no email {outbox_id} in the outbox", type="NotFound", non_retryable=True)
        return status

    async def _claim(self, outbox_id: int) -> Any:
        """queued, or sending left by a dead delivery (we hold the row's lock) -> sending."""
        async with self._sessions() as session, session.begin():
            claimed = await session.execute(
                update(EmailOutbox)
                .where(EmailOutbox.id == outbox_id, EmailOutbox.status.in_(("queued", "sending")))
                .values(status="sending", attempts=EmailOutbox.attempts + 1)
                .returning(
                    EmailOutbox.idempotency_key,
                    EmailOutbox.to_address,
                    EmailOutbox.subject,
                    EmailOutbox.body,
                    EmailOutbox.html_body,
                )
            )
            return claimed.one_or_none()

    async def _finish(self, outbox_id: int, status: str, error: str | None = None) -> None:
        values: dict[str, Any] = {"status": status, "error": error}
        if status == "sent":
            values["sent_at"] = func.now()
        async with self._sessions() as session, session.begin():
            finished = await session.execute(
                update(EmailOutbox)
                .where(EmailOutbox.id == outbox_id, EmailOutbox.status == "sending")
                .values(**values)
                .returning(EmailOutbox.tenant_id, EmailOutbox.lead_id)
            )
            row = finished.one_or_none()
            if status == "sent" and row is not None and row.lead_id is not None:
                # An email about a lead that left the building is the lead's latest engagement, and
                # counts in its score (recomputed in this transaction, with the row now 'sent').
                await session.execute(
                    update(Lead)
                    .where(Lead.id == row.lead_id, Lead.tenant_id == row.tenant_id)
                    .values(last_engaged_at=func.now())
                )
                await rescore_ids(session, row.tenant_id, [row.lead_id])
