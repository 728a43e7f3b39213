"""send_email, deliver_email and the SMTP circuit breaker, on the real PostgreSQL and a real SMTP server.

Email rows are committed (delivery runs in its own transactions, like in the worker): each test uses
fresh workflow ids, and the `outbox` fixture deletes the rows it queued.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from temporalio.exceptions import ApplicationError

from activities.email import EmailActivities
from countersign.core.calls import CallerContext
from countersign.core.mail import message_id
from countersign.db.engine import session_factory
from countersign.db.schema import EmailOutbox
from countersign.runtime.circuit import CircuitBreaker, CircuitOpen
from tests.fixtures.smtp import SmtpServer
from tools import REGISTRY
from tools.arguments import validate
from tools.registry import ToolContext, ToolFailure

SENDER = "agent@countersign.test"
JANE = "jane.doe@example.com"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the circuit breaker (pure) ------------------------------------------------------------------


def breaker(clock: FakeClock, threshold: int = 3) -> CircuitBreaker:
    return CircuitBreaker("smtp", failure_threshold=threshold, cool_down=30.0, probe_wait=2.0, clock=clock)


def state(b: CircuitBreaker) -> str:
    return b.state  # a call, so that mypy does not narrow it across the breaker's calls


def refused(b: CircuitBreaker) -> float:
    with pytest.raises(CircuitOpen) as exc:
        b.allow()
    return exc.value.retry_after


def test_breaker_opens_after_consecutive_failures_only() -> None:
    b = breaker(FakeClock())
    for _ in range(2):
        b.allow()
        b.failure()
    b.allow()
    b.success()  # a success resets the count
    for _ in range(2):
        b.allow()
        b.failure()
    assert state(b) == "closed"
    b.allow()
    b.failure()
    assert state(b) == "open"


def test_open_breaker_fails_fast_with_the_remaining_cool_down() -> None:
    clock = FakeClock()
    b = breaker(clock, threshold=1)
    b.allow()
    b.failure()
    assert refused(b) == 30.0
    clock.now += 12
    assert refused(b) == 18.0


def test_half_open_lets_one_probe_through_and_closes_on_success() -> None:
    clock = FakeClock()
    b = breaker(clock, threshold=1)
    b.allow()
    b.failure()
    clock.now += 30
    assert state(b) == "half_open"
    b.allow()  # the probe
    assert refused(b) == 2.0, "a second caller waits for the probe"
    b.success()
    assert state(b) == "closed"
    b.allow()


def test_a_failed_probe_reopens_for_a_full_cool_down() -> None:
    clock = FakeClock()
    b = breaker(clock, threshold=3)
    for _ in range(3):
        b.allow()
        b.failure()
    clock.now += 31
    b.allow()
    b.failure()  # one failure is enough while probing
    assert state(b) == "open" and refused(b) == 30.0


def test_an_abandoned_probe_frees_the_slot() -> None:
    clock = FakeClock()
    b = breaker(clock, threshold=1)
    b.allow()
    b.failure()
    clock.now += 30
    b.allow()
    b.abandon()
    b.allow()
    assert state(b) == "half_open"


def test_breaker_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker("x", failure_threshold=0)


# --- fixtures ------------------------------------------------------------------------------------


class Outbox:
    """Runs send_email and its compensation in committed transactions, and cleans up after the test."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        self.workflow_id = f"wf-email-{uuid.uuid4()}"

    def context(self, session: AsyncSession, call_id: str = "call-1") -> ToolContext:
        caller = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="lead-qualifier")
        return ToolContext(caller, session, self.workflow_id, call_id, datetime.now(UTC))

    async def send(self, call_id: str = "call-1", **raw: Any) -> dict[str, Any]:
        args = validate(
            REGISTRY["send_email"], json.dumps({"to": JANE, "subject": "Hello", "body": "Hi!"} | raw)
        )
        async with self.sessions() as session, session.begin():
            result = await REGISTRY["send_email"].run(self.context(session, call_id), args)
        return result.model_dump(mode="json")

    async def cancel(self, result: dict[str, Any] | None) -> str:
        compensation = REGISTRY["send_email"].compensation
        assert compensation is not None
        args = validate(REGISTRY["send_email"], json.dumps({"to": JANE, "subject": "Hello", "body": "Hi!"}))
        async with self.sessions() as session, session.begin():
            return await compensation(self.context(session), args, result)

    async def row(self, outbox_id: int) -> EmailOutbox:
        async with self.sessions() as session:
            return (
                await session.execute(select(EmailOutbox).where(EmailOutbox.id == outbox_id))
            ).scalar_one()

    async def set_status(self, outbox_id: int, status: str) -> None:
        async with self.sessions() as session, session.begin():
            await session.execute(
                update(EmailOutbox).where(EmailOutbox.id == outbox_id).values(status=status)
            )

    async def count(self) -> int:
        async with self.sessions() as session:
            mine = EmailOutbox.idempotency_key.startswith(self.workflow_id)
            return int(await session.scalar(select(func.count()).where(mine)) or 0)


@pytest.fixture
async def outbox(db_engine: AsyncEngine) -> AsyncIterator[Outbox]:
    box = Outbox(session_factory(db_engine))
    yield box
    async with box.sessions() as session, session.begin():
        await session.execute(
            delete(EmailOutbox).where(EmailOutbox.idempotency_key.startswith(box.workflow_id))
        )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mailer(outbox: Outbox, smtp_server: SmtpServer, clock: FakeClock) -> EmailActivities:
    return EmailActivities(
        outbox.sessions,
        smtp_server.host,
        smtp_server.port,
        SENDER,
        breaker=breaker(clock, threshold=2),
        timeout=5,
    )


# --- send_email ----------------------------------------------------------------------------------


def test_send_email_is_declared_high_risk_external_and_compensable() -> None:
    tool = REGISTRY["send_email"]
    assert (tool.risk, tool.category, tool.default_tier) == ("high", "external", "needs_approval")
    assert tool.compensation is not None


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"to": "not an email"}, "to"),
        ({"to": "a@b.example, c@d.example"}, "to"),
        ({"subject": "Hi\r\nBcc: everyone@example.com"}, "subject"),
        ({"subject": ""}, "subject"),
        ({"body": ""}, "body"),
    ],
)
def test_send_email_arguments_are_validated(raw: dict[str, Any], field: str) -> None:
    arguments = {"to": JANE, "subject": "Hello", "body": "Hi!"} | raw
    with pytest.raises(ToolFailure) as failure:
        validate(REGISTRY["send_email"], json.dumps(arguments))
    assert failure.value.code == "VALIDATION_ERROR" and failure.value.message.startswith(field)


def test_send_email_keeps_only_the_address_in_its_one_spelling() -> None:
    """The address, trimmed and lowercased (shared/CONTRACT.md): what policies judge and what leaves."""
    arguments = {"to": " Jane Doe <Jane.Doe@EXAMPLE.com>", "subject": "Hello", "body": "Hi!"}
    assert (
        validate(REGISTRY["send_email"], json.dumps(arguments)).model_dump()["to"] == "jane.doe@example.com"
    )


async def test_send_email_queues_one_row_per_idempotency_key(outbox: Outbox) -> None:
    first = await outbox.send()
    again = await outbox.send()
    assert first["status"] == "queued" and again == first
    assert await outbox.count() == 1
    row = await outbox.row(first["outbox_id"])
    assert (row.tenant_id, row.to_address, row.subject, row.body) == ("acme", JANE, "Hello", "Hi!")
    assert row.idempotency_key == f"{outbox.workflow_id}:call-1"
    other = await outbox.send(call_id="call-2")
    assert other["outbox_id"] != first["outbox_id"] and await outbox.count() == 2


async def test_concurrent_calls_with_one_key_queue_one_row(outbox: Outbox) -> None:
    """The second insert waits on the first's uncommitted row, then finds it."""
    args = validate(REGISTRY["send_email"], json.dumps({"to": JANE, "subject": "Hello", "body": "Hi!"}))
    async with outbox.sessions() as first, first.begin():
        queued = await REGISTRY["send_email"].run(outbox.context(first), args)
        second = asyncio.create_task(outbox.send())
        await asyncio.sleep(0.3)
        assert not second.done()
    assert (await second)["outbox_id"] == queued.model_dump()["outbox_id"]
    assert await outbox.count() == 1


# --- deliver_email -------------------------------------------------------------------------------


async def test_deliver_email_sends_once_to_the_smtp_server(
    outbox: Outbox, mailer: EmailActivities, smtp_server: SmtpServer
) -> None:
    queued = await outbox.send(subject="Your quote", body="Dear Jane,\nhere it is.")
    assert await mailer.deliver_email(queued["outbox_id"]) == "sent"
    (received,) = smtp_server.received
    assert received.mail_from == SENDER and received.rcpt_tos == [JANE]
    message = received.message
    assert (message["From"], message["To"], message["Subject"]) == (SENDER, JANE, "Your quote")
    assert message["Message-ID"] == message_id(f"{outbox.workflow_id}:call-1", SENDER)
    assert message.get_content() == "Dear Jane,\nhere it is.\n"
    row = await outbox.row(queued["outbox_id"])
    assert (row.status, row.attempts, row.error) == ("sent", 1, None) and row.sent_at is not None

    assert await mailer.deliver_email(queued["outbox_id"]) == "sent"
    assert len(smtp_server.received) == 1, "a second delivery sends nothing"
    assert await outbox.cancel(queued) == "irreversible"


def test_message_id_is_stable_per_call() -> None:
    assert message_id("wf:1", SENDER) == message_id("wf:1", SENDER) != message_id("wf:2", SENDER)
    assert message_id("wf:1", SENDER).endswith("@countersign.test>")


async def test_cancelled_email_is_never_sent(
    outbox: Outbox, mailer: EmailActivities, smtp_server: SmtpServer
) -> None:
    queued = await outbox.send()
    assert await outbox.cancel(queued) == "undone"
    assert await mailer.deliver_email(queued["outbox_id"]) == "cancelled"
    assert smtp_server.received == []
    assert await outbox.cancel(queued) == "already_undone"


async def test_compensation_of_what_never_happened(outbox: Outbox) -> None:
    assert await outbox.cancel(None) == "never_happened"
    assert await outbox.cancel({"outbox_id": 2**62, "status": "queued"}) == "never_happened"


async def test_compensation_during_delivery_asks_to_retry(outbox: Outbox) -> None:
    queued = await outbox.send()
    await outbox.set_status(queued["outbox_id"], "sending")
    with pytest.raises(ToolFailure) as failure:
        await outbox.cancel(queued)
    assert failure.value.code == "CONFLICT"


async def test_a_stale_sending_claim_is_taken_over(
    outbox: Outbox, mailer: EmailActivities, smtp_server: SmtpServer
) -> None:
    """'sending' with no delivery holding the row's lock: the claimer died, so it is claimed again."""
    queued = await outbox.send()
    await outbox.set_status(queued["outbox_id"], "sending")
    assert await mailer.deliver_email(queued["outbox_id"]) == "sent"
    assert len(smtp_server.received) == 1


async def test_a_live_delivery_is_not_duplicated(
    outbox: Outbox, mailer: EmailActivities, smtp_server: SmtpServer
) -> None:
    queued = await outbox.send()
    key = func.hashtextextended(f"countersign:email:{queued['outbox_id']}", 0)
    async with outbox.sessions() as other, other.begin():
        await other.execute(select(func.pg_advisory_xact_lock(key)))  # another worker is delivering it
        with pytest.raises(ApplicationError) as exc:
            await mailer.deliver_email(queued["outbox_id"])
    assert exc.value.type == "DeliveryInProgress" and not exc.value.non_retryable
    assert smtp_server.received == []


async def test_a_permanently_refused_recipient_fails_the_email(
    outbox: Outbox, mailer: EmailActivities, smtp_server: SmtpServer
) -> None:
    smtp_server.refused.add("nobody@example.com")
    queued = await outbox.send(to="nobody@example.com")
    assert await mailer.deliver_email(queued["outbox_id"]) == "failed"
    row = await outbox.row(queued["outbox_id"])
    assert row.status == "failed" and row.error and "550" in row.error
    assert state(mailer.breaker) == "closed"
    assert await outbox.cancel(queued) == "never_happened"


async def test_unknown_outbox_row_is_a_non_retryable_error(mailer: EmailActivities) -> None:
    with pytest.raises(ApplicationError) as exc:
        await mailer.deliver_email(2**62)
    assert exc.value.non_retryable


async def test_breaker_opens_while_smtp_is_down_and_half_opens_after_the_cool_down(
    outbox: Outbox, mailer: EmailActivities, smtp_server: SmtpServer, clock: FakeClock
) -> None:
    queued = await outbox.send()
    smtp_server.stop()
    for attempt in (1, 2):  # threshold 2
        with pytest.raises(ApplicationError) as exc:
            await mailer.deliver_email(queued["outbox_id"])
        assert exc.value.type == "SmtpError" and not exc.value.non_retryable
        row = await outbox.row(queued["outbox_id"])
        assert (row.status, row.attempts) == ("queued", attempt) and row.error
    clock.now += 10
    with pytest.raises(ApplicationError) as exc:
        await mailer.deliver_email(queued["outbox_id"])
    assert exc.value.type == "SmtpCircuitOpen" and not exc.value.non_retryable
    assert exc.value.next_retry_delay == timedelta(seconds=20)
    assert (await outbox.row(queued["outbox_id"])).attempts == 2, "failing fast does not touch the row"

    clock.now += 20  # half-open: one probe goes through
    smtp_server.start()
    assert await mailer.deliver_email(queued["outbox_id"]) == "sent"
    assert state(mailer.breaker) == "closed" and len(smtp_server.received) == 1


async def test_a_failed_probe_reopens_the_breaker(
    outbox: Outbox, mailer: EmailActivities, smtp_server: SmtpServer, clock: FakeClock
) -> None:
    queued = await outbox.send()
    smtp_server.stop()
    for _ in range(2):
        with pytest.raises(ApplicationError):
            await mailer.deliver_email(queued["outbox_id"])
    clock.now += 30
    with pytest.raises(ApplicationError) as exc:
        await mailer.deliver_email(queued["outbox_id"])
    assert exc.value.type == "SmtpError"
    with pytest.raises(ApplicationError) as exc:
        await mailer.deliver_email(queued["outbox_id"])
    assert exc.value.type == "SmtpCircuitOpen" and exc.value.next_retry_delay == timedelta(seconds=30)
