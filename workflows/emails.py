"""EmailOutbox: emails a turn queued, delivered once their undo window has passed.

A tool that sends email only queues it in the outbox (PostgreSQL). After the turn, its emails wait
`email_delivery_delay_s`: a rollback within that window cancels them in the outbox, and delivery
then finds them cancelled. Emails not delivered yet are carried across continue-as-new.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import DELIVER_EMAIL

from workflows.options import DELIVERY_RETRY, HEARTBEAT_TIMEOUT, execute


class EmailOutbox:
    def __init__(self, carried: list[int]) -> None:
        self.queued: list[int] = []  # emails this turn queued
        self.undelivered: list[int] = []  # queued emails whose delivery has not finished
        self._deliveries: list[asyncio.Task[None]] = []
        if carried:
            self._deliveries.append(asyncio.create_task(self._deliver_after(0, carried)))

    def deliver_turn(self, delay_s: float) -> None:
        """Deliver what this turn queued, in the background, after `delay_s`."""
        if self.queued:
            self._deliveries.append(asyncio.create_task(self._deliver_after(delay_s, self.queued)))
            self.queued = []

    async def delivered(self) -> None:
        await asyncio.gather(*self._deliveries)

    async def _deliver_after(self, delay_s: float, queued: list[int]) -> None:
        self.undelivered += queued
        if delay_s > 0:
            await workflow.sleep(delay_s, summary=f"undo window of {len(queued)} email(s)")
        for outbox_id in queued:
            try:
                await execute(
                    DELIVER_EMAIL,
                    outbox_id,
                    start_to_close_timeout=timedelta(seconds=60),
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                    retry_policy=DELIVERY_RETRY,
                    summary=f"deliver email {outbox_id} over SMTP",
                )
            except ActivityError as err:  # stays in the outbox, visible to operators; the turn is done
                workflow.logger.error("email %s not delivered: %s", outbox_id, err.cause or err)
            self.undelivered.remove(outbox_id)
