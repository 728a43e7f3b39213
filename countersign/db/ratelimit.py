"""Rate limits per tenant, user and tool: token buckets kept in PostgreSQL (`rate_limit_buckets`).

A bucket holds up to `burst` tokens and refills at `per_s` tokens a second; each tool call takes one
from its user's bucket for the tool and one from the tenant's (`take_call`), so one user cannot spend
the budget the tenant's users share. A bucket is refilled lazily from its `updated_at` when a call
takes from it, under a row lock, so every worker shares the same buckets and concurrent calls can
never overdraw them.

The limits are the tenant's (`tenant_rate_limits`: for the tool, else for `*`), else the worker's
(`RateLimits`, from `RATE_LIMIT_*`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.access import Whose
from countersign.db.schema import RateLimitBucket, TenantRateLimit

EVERY_TOOL = "*"  # a `tenant_rate_limits` row for every tool without its own


@dataclass(frozen=True)
class RateLimit:
    per_s: float
    burst: float

    def __post_init__(self) -> None:
        if self.per_s <= 0 or self.burst < 1:
            raise ValueError(
                f"a rate limit needs per_s > 0 and burst >= 1, not {self.per_s}/s burst {self.burst}"
            )


@dataclass(frozen=True)
class CallLimits:
    """The two buckets a tool call takes from: the tenant's, shared by its users, and the user's."""

    tenant: RateLimit
    user: RateLimit


@dataclass(frozen=True)
class RateLimits:
    """The worker's limits, for tenants that set none: the tenant's bucket of every tool (`default`,
    unless `per_tool` names its own) and each user's (`per_user`, half the default). With
    `tenant_settings` off, the tenants' own limits are not read (benchmarks measure unthrottled)."""

    default: RateLimit = RateLimit(per_s=10.0, burst=20.0)
    per_tool: Mapping[str, RateLimit] = field(default_factory=dict)
    per_user: RateLimit = RateLimit(per_s=5.0, burst=10.0)
    tenant_settings: bool = True

    def of(self, tool: str) -> RateLimit:
        return self.per_tool.get(tool, self.default)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RateLimits:
        """From `RATE_LIMIT_PER_S` / `RATE_LIMIT_BURST` (the tenant's bucket), `RATE_LIMIT_USER_PER_S` /
        `RATE_LIMIT_USER_BURST` (a user's) and `RATE_LIMIT_TENANT_SETTINGS` (`off`: ignore the
        tenants' own limits), each optional."""
        default = cls()

        def limit(name: str, fallback: RateLimit) -> RateLimit:
            return RateLimit(
                per_s=float(env.get(f"RATE_LIMIT_{name}PER_S") or fallback.per_s),
                burst=float(env.get(f"RATE_LIMIT_{name}BURST") or fallback.burst),
            )

        return cls(
            limit("", default.default),
            per_user=limit("USER_", default.per_user),
            tenant_settings=env.get("RATE_LIMIT_TENANT_SETTINGS", "on").lower() not in ("off", "0", "false"),
        )

    async def for_call(self, session: AsyncSession, tenant_id: str, tool: str) -> CallLimits:
        """The limits of a call to `tool` in `tenant_id`: the tenant's row for the tool, else its
        `*` row, else this worker's."""
        if self.tenant_settings:
            rows = {
                row.tool: row
                for row in await session.scalars(
                    select(TenantRateLimit).where(
                        TenantRateLimit.tenant_id == tenant_id, TenantRateLimit.tool.in_((tool, EVERY_TOOL))
                    )
                )
            }
            row = rows.get(tool) or rows.get(EVERY_TOOL)
            if row is not None:
                return CallLimits(RateLimit(row.per_s, row.burst), RateLimit(row.user_per_s, row.user_burst))
        return CallLimits(self.of(tool), self.per_user)


# No limit at all, neither the tenant's nor a user's, whatever the tenants set: for benchmarks and fault
# tests, whose bursts of calls are not what they measure. `UNLIMITED_ENV` is the same for a worker process.
UNLIMITED = RateLimits(
    RateLimit(per_s=1e6, burst=1e6), per_user=RateLimit(per_s=1e6, burst=1e6), tenant_settings=False
)
UNLIMITED_ENV = {
    "RATE_LIMIT_PER_S": "1000000",
    "RATE_LIMIT_BURST": "1000000",
    "RATE_LIMIT_USER_PER_S": "1000000",
    "RATE_LIMIT_USER_BURST": "1000000",
    "RATE_LIMIT_TENANT_SETTINGS": "off",
}


def refill(tokens: float, last: datetime, now: datetime, rate_per_s: float, burst: float) -> float:
    """The tokens a bucket holds at `now`, having held `tokens` at `last`.

    A clock that went backwards (another worker's clock, stamped later) adds nothing rather than
    taking tokens away.
    """
    elapsed = max(0.0, (now - last).total_seconds())
    return min(burst, tokens + elapsed * rate_per_s)


_BUCKETS = insert(RateLimitBucket)
# Built once, its rows given as parameters (one INSERT of as many VALUES, in their order, by
# SQLAlchemy's "insertmanyvalues"): a multi-VALUES statement has no cache key, so SQLAlchemy
# compiled it again at every tool call.
LOCK_BUCKETS = _BUCKETS.on_conflict_do_update(
    index_elements=[RateLimitBucket.tenant_id, RateLimitBucket.tool, RateLimitBucket.user_id],
    set_={"tool": _BUCKETS.excluded.tool},
).returning(RateLimitBucket.user_id, RateLimitBucket.tokens, RateLimitBucket.updated_at)


@dataclass(frozen=True)
class Bucket:
    """A bucket as read under its row lock, refilled to `now` (`tokens`) with the limit it has."""

    user_id: str
    limit: RateLimit
    tokens: float
    updated_at: datetime


async def _locked(
    session: AsyncSession, tenant_id: str, tool: str, limits: dict[str, RateLimit], now: datetime
) -> dict[str, Bucket]:
    """Create the buckets of `limits` (user id -> limit; "" the tenant's) if needed, lock their rows
    in `limits`' order and read them, in one round trip: the no-op DO UPDATE takes each row lock (as
    SELECT ... FOR UPDATE would) and RETURNING gives the rows as they were."""
    connection = await session.connection()  # Core: the rows are parameters, not ORM objects
    rows = await connection.execute(
        LOCK_BUCKETS,
        [
            {"tenant_id": tenant_id, "tool": tool, "user_id": who, "tokens": limit.burst, "updated_at": now}
            for who, limit in limits.items()
        ],
    )
    return {
        row.user_id: Bucket(
            row.user_id,
            limits[row.user_id],
            refill(row.tokens, row.updated_at, now, limits[row.user_id].per_s, limits[row.user_id].burst),
            max(row.updated_at, now),
        )
        for row in rows
    }


# Built once and run on the Core connection: the ORM's bulk UPDATE by primary key built its
# statement on every tool call.
STORE_BUCKETS = (
    update(RateLimitBucket)
    .where(
        RateLimitBucket.tenant_id == bindparam("b_tenant_id"),
        RateLimitBucket.tool == bindparam("b_tool"),
        RateLimitBucket.user_id == bindparam("b_user_id"),
    )
    .values(tokens=bindparam("b_tokens"), updated_at=bindparam("b_updated_at"))
)


async def _store(session: AsyncSession, tenant_id: str, tool: str, buckets: list[Bucket]) -> None:
    connection = await session.connection()
    await connection.execute(
        STORE_BUCKETS,
        [
            {
                "b_tenant_id": tenant_id,
                "b_tool": tool,
                "b_user_id": b.user_id,
                "b_tokens": b.tokens,
                "b_updated_at": b.updated_at,
            }
            for b in buckets
        ],
    )


def _wait(bucket: Bucket) -> float:
    """The seconds until `bucket` holds a token again."""
    return (1 - bucket.tokens) / bucket.limit.per_s


def _taken(bucket: Bucket) -> Bucket:
    return replace(bucket, tokens=bucket.tokens - 1)


async def take(
    session: AsyncSession,
    tenant_id: str,
    tool: str,
    rate_per_s: float,
    burst: float,
    now: datetime,
    user_id: str = "",
) -> float | None:
    """Take one token from the tenant's bucket for `tool` (with `user_id`, that user's), in the
    session's transaction.

    Returns None when the call may proceed, else the seconds until a token will be available. The row
    stays locked until the transaction ends, and a rolled-back transaction gives its token back.
    """
    bucket = (await _locked(session, tenant_id, tool, {user_id: RateLimit(rate_per_s, burst)}, now))[user_id]
    allowed = bucket.tokens >= 1
    await _store(session, tenant_id, tool, [_taken(bucket) if allowed else bucket])
    return None if allowed else _wait(bucket)


@dataclass(frozen=True)
class Spent:
    """A call refused: whose bucket is empty, its limit, and the seconds until it holds a token."""

    whose: Whose
    limit: RateLimit
    wait_s: float


async def take_call(
    session: AsyncSession, tenant_id: str, user_id: str, tool: str, limits: CallLimits, now: datetime
) -> Spent | None:
    """Take a token from the user's bucket and one from the tenant's; None when the call may run.

    A call either takes from both or from neither: a user over their own limit takes nothing from
    what the tenant's users share, and a call the tenant's bucket refuses keeps the user's token.
    Two round trips whatever the outcome; every call locks the user's row before the tenant's, so
    concurrent calls cannot deadlock.
    """
    buckets = await _locked(session, tenant_id, tool, {user_id: limits.user, "": limits.tenant}, now)
    user, tenant = buckets[user_id], buckets[""]
    spent = (
        Spent("user", user.limit, _wait(user))
        if user.tokens < 1
        else Spent("tenant", tenant.limit, _wait(tenant))
        if tenant.tokens < 1
        else None
    )
    await _store(session, tenant_id, tool, [user, tenant] if spent else [_taken(user), _taken(tenant)])
    return spent
