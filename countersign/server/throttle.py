"""The login rate limit: failed password logins, counted in PostgreSQL over a sliding window.

Every login attempt is a row of `login_attempts` (the audit of who tried what, from where). Before
a password is checked:
- per account (tenant + user): ACCOUNT_FAILURES wrong passwords within WINDOW refuse further
  attempts with 429 until the oldest of them leaves the window;
- per client address: CLIENT_FAILURES wrong passwords (any accounts) within WINDOW, likewise.

An attacker cannot lock a real user out for good:
- the lock is bounded: it lifts WINDOW after the failures that set it at the latest, and refused
  (`throttled`) attempts do not count, so hammering a locked account does not extend it;
- the account lock does not apply to an address the user logged in from successfully within
  KNOWN_CLIENT_FOR: the real user's usual machine keeps working while someone elsewhere guesses
  (the per-address limit still applies to it).
Keeping it up takes ACCOUNT_FAILURES fresh guesses every WINDOW, each of them recorded.

PostgreSQL, not memory: the inbox may run as several processes behind one address, and the count
must hold across them and across restarts. An advisory lock per account serialises the check and
the record, so concurrent guesses cannot slip past the count.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.bounds import MAX_REASON_CHARS, cut, storable
from countersign.db.schema import LoginAttempt

WINDOW = timedelta(minutes=15)
ACCOUNT_FAILURES = 5
CLIENT_FAILURES = 20
KNOWN_CLIENT_FOR = timedelta(days=30)
MAX_CLIENT_CHARS = 200
LOCK_WAIT_S = 5
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's sqlstate when lock_timeout ends a wait


class Throttled(Exception):
    """Too many failed logins: try again after `retry_after_s` seconds."""

    def __init__(self, retry_after_s: int, scope: str) -> None:
        super().__init__(f"too many failed logins for this {scope}; try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s
        self.scope = scope


async def lock_account(session: AsyncSession, tenant_id: str, user_id: str) -> None:
    """Serialise logins to one account until the transaction ends. The wait is bounded: a login
    stuck elsewhere (a dropped client, a slow hash) must not hang every later one; after
    LOCK_WAIT_S the attempt is Throttled, and the transaction stays usable to record it."""
    await session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_WAIT_S}s'"))
    try:
        async with session.begin_nested():  # a lock taken in a released savepoint is the transaction's
            await session.execute(
                select(func.pg_advisory_xact_lock(func.hashtext(f"login:{tenant_id}/{user_id}")))
            )
    except DBAPIError as err:
        if getattr(err.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        raise Throttled(LOCK_WAIT_S, "account (another login to it is under way)") from err


async def _reopens_at(
    session: AsyncSession, where: list[ColumnElement[bool]], limit: int, now: datetime
) -> datetime | None:
    """When the `limit`-th newest recent failure matching `where` leaves the window (None: under
    the limit)."""
    nth = await session.scalar(
        select(LoginAttempt.created_at)
        .where(
            LoginAttempt.outcome == "bad_credentials",
            LoginAttempt.created_at > now - WINDOW,
            *where,
        )
        .order_by(LoginAttempt.created_at.desc())
        .offset(limit - 1)
        .limit(1)
    )
    return None if nth is None else nth + WINDOW


async def check(session: AsyncSession, tenant_id: str, user_id: str, client: str, now: datetime) -> None:
    """Raise Throttled when `client` may not try a password for tenant/user now."""
    known = await session.scalar(
        select(LoginAttempt.id)
        .where(
            LoginAttempt.tenant_id == tenant_id,
            LoginAttempt.user_id == user_id,
            LoginAttempt.client == client,
            LoginAttempt.outcome == "accepted",
            LoginAttempt.created_at > now - KNOWN_CLIENT_FOR,
        )
        .limit(1)
    )
    account = None
    if known is None:
        account = await _reopens_at(
            session,
            [LoginAttempt.tenant_id == tenant_id, LoginAttempt.user_id == user_id],
            ACCOUNT_FAILURES,
            now,
        )
    address = await _reopens_at(session, [LoginAttempt.client == client], CLIENT_FAILURES, now)
    for scope, reopens in (("account", account), ("address", address)):
        if reopens is not None:
            raise Throttled(max(1, math.ceil((reopens - now).total_seconds())), scope)


async def record(
    session: AsyncSession,
    *,
    tenant_id: str,
    user_id: str,
    client: str,
    method: str,
    outcome: str,
    reason: str | None,
    now: datetime,
) -> None:
    """One `login_attempts` row (outcome: accepted, bad_credentials, throttled, refused). Names and
    reasons of a refusal may come from anyone (a callback URL, a claim): they are cut and made
    storable here, so that the refusal is always recorded."""
    session.add(
        LoginAttempt(
            tenant_id=storable(tenant_id[:MAX_CLIENT_CHARS]),
            user_id=storable(user_id[:MAX_CLIENT_CHARS]),
            client=storable(client[:MAX_CLIENT_CHARS]),
            method=method,
            outcome=outcome,
            reason=None if reason is None else cut(storable(reason), MAX_REASON_CHARS),
            created_at=now,
        )
    )
    await session.flush()
