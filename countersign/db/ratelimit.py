"""Rate limits per tenant and tool: a token bucket kept in PostgreSQL (`rate_limit_buckets`).

A bucket holds up to `burst` tokens and refills at `per_s` tokens a second; each tool call takes one.
The bucket is refilled lazily from its `updated_at` when a call takes from it, under a row lock, so
every worker shares one bucket per tenant and tool and concurrent calls can never overdraw it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.db.schema import RateLimitBucket


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
class RateLimits:
    """The limit of every tool (`default`), unless `per_tool` names its own."""

    default: RateLimit = RateLimit(per_s=10.0, burst=20.0)
    per_tool: Mapping[str, RateLimit] = field(default_factory=dict)

    def of(self, tool: str) -> RateLimit:
        return self.per_tool.get(tool, self.default)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RateLimits:
        """The default limit from `RATE_LIMIT_PER_S` / `RATE_LIMIT_BURST`, each optional."""
        default = cls().default
        return cls(
            RateLimit(
                per_s=float(env.get("RATE_LIMIT_PER_S") or default.per_s),
                burst=float(env.get("RATE_LIMIT_BURST") or default.burst),
            )
        )


def refill(tokens: float, last: datetime, now: datetime, rate_per_s: float, burst: float) -> float:
    """The tokens a bucket holds at `now`, having held `tokens` at `last`.

    A clock that went backwards (another worker's clock, stamped later) adds nothing rather than
    taking tokens away.
    """
    elapsed = max(0.0, (now - last).total_seconds())
    return min(burst, tokens + elapsed * rate_per_s)


async def take(
    session: AsyncSession, tenant_id: str, tool: str, rate_per_s: float, burst: float, now: datetime
) -> float | None:
    """Take one token from the tenant's bucket for `tool`, in the session's transaction.

    Returns None when the call may proceed, else the seconds until a token will be available. The row
    stays locked until the transaction ends, and a rolled-back transaction gives its token back.
    """
    key = (RateLimitBucket.tenant_id == tenant_id, RateLimitBucket.tool == tool)
    # One round trip creates the bucket if needed, locks its row and reads it: the no-op DO UPDATE
    # takes the row lock (as SELECT ... FOR UPDATE would) and RETURNING gives the row as it was.
    statement = insert(RateLimitBucket).values(tenant_id=tenant_id, tool=tool, tokens=burst, updated_at=now)
    bucket = (
        await session.execute(
            statement.on_conflict_do_update(
                index_elements=[RateLimitBucket.tenant_id, RateLimitBucket.tool],
                set_={"tool": statement.excluded.tool},
            ).returning(RateLimitBucket.tokens, RateLimitBucket.updated_at)
        )
    ).one()
    tokens = refill(bucket.tokens, bucket.updated_at, now, rate_per_s, burst)
    allowed = tokens >= 1
    await session.execute(
        update(RateLimitBucket)
        .where(*key)
        .values(tokens=tokens - 1 if allowed else tokens, updated_at=max(bucket.updated_at, now))
    )
    return None if allowed else (1 - tokens) / rate_per_s
