"""A small circuit breaker for one integration (the SMTP server, the model): stop hammering what is down.

    closed ──N consecutive failures──▶ open ──cool-down elapsed──▶ half-open
      ▲                                 ▲                              │
      └────────── probe succeeds ───────┼──────── probe fails ─────────┘

While open, `allow()` raises `CircuitOpen` at once with the time left, so a caller (a Temporal
activity) can fail fast and ask to be retried exactly when a probe would be let through: the
activities call `allow_or_retry`, which says so as a retryable `ApplicationError`. Half-open
lets a single probe through; concurrent callers are refused until it reports. The breaker is pure
state plus an injectable clock: no I/O, no asyncio, so tests drive time by hand.

Kept in-house rather than using `aiobreaker` or `purgatory`: both wrap the call itself and neither
exposes the remaining cool-down that `next_retry_delay` needs; this is the whole of what we use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

from temporalio.exceptions import ApplicationError

State = Literal["closed", "open", "half_open"]


class CircuitOpen(Exception):
    """The breaker refused a call; `retry_after` seconds from now a probe may go through."""

    def __init__(self, name: str, retry_after: float) -> None:
        super().__init__(f"circuit {name!r} is open; retry in {retry_after:.1f}s")
        self.retry_after = retry_after


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int = 5,
        cool_down: float = 300.0,
        probe_wait: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1 or cool_down < 0 or probe_wait < 0:
            raise ValueError("failure_threshold must be >= 1 and the delays >= 0")
        self.name = name
        self.failure_threshold = failure_threshold
        self.cool_down = cool_down
        self.probe_wait = probe_wait  # what a caller refused during a probe is told to wait
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> State:
        if self._opened_at is None:
            return "closed"
        return "half_open" if self._remaining() <= 0 else "open"

    @property
    def retry_in(self) -> float:
        """Seconds until an open breaker lets a probe through (0 when it is not open)."""
        return max(0.0, self._remaining()) if self.state == "open" else 0.0

    def _remaining(self) -> float:
        assert self._opened_at is not None
        return self._opened_at + self.cool_down - self._clock()

    def allow(self) -> None:
        """Let a call through or raise `CircuitOpen`.

        A call let through must then report exactly once: `success()`, `failure()` or `abandon()`.
        """
        state = self.state
        if state == "open":
            raise CircuitOpen(self.name, self._remaining())
        if state == "half_open":
            if self._probing:
                raise CircuitOpen(self.name, self.probe_wait)
            self._probing = True

    def allow_or_retry(self, error_type: str) -> None:
        """`allow()` for an activity: refused, it fails with the retryable `error_type` error whose
        `next_retry_delay` is when a probe may go through."""
        try:
            self.allow()
        except CircuitOpen as exc:
            raise ApplicationError(
                str(exc), type=error_type, next_retry_delay=timedelta(seconds=exc.retry_after)
            ) from exc

    def success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def failure(self) -> None:
        """Count a failure; the threshold, or any failed probe, (re)opens the breaker for a cool-down."""
        self._failures += 1
        if self._probing or self._failures >= self.failure_threshold:
            self._opened_at = self._clock()
        self._probing = False

    def abandon(self) -> None:
        """A call let through ended without a verdict (cancelled): free the probe slot, count nothing."""
        self._probing = False
