"""API tokens: how a machine client (a chat bridge, a scheduler) calls the Countersign server.

A token belongs to one tenant and names the users it may act for (`act_as`); a request with it
acts for exactly one of them (the start body's `user_id`; afterwards, the conversation's user),
and only while that user is active: a deactivated (or removed) user is dropped from what the token
may act for at every request (`holder_of`), so the token neither reads their conversations nor
starts one for them.
The secret is 32 random bytes, shown once at creation as `cst_<base64url>`; PostgreSQL keeps only
its SHA-256, so the table leaks nothing that can call the server. A revoked token stops working on
its next request; every use is a `requester_actions` row naming the token.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.db.schema import ApiToken, User

PREFIX = "cst_"
SECRET_BYTES = 32
MAX_TOKEN_CHARS = 200


@dataclass(frozen=True)
class TokenHolder:
    """A live token as a request presents it; `act_as`: those of its users who are active now."""

    id: int
    tenant_id: str
    name: str
    act_as: frozenset[str]


class TokenRefused(Exception):
    """A token that cannot be created or revoked; the message says why."""


def new_secret() -> str:
    raw = secrets.token_bytes(SECRET_BYTES)
    return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def looks_like_token(bearer: str) -> bool:
    """An API token, as opposed to a session token (a JWT): told apart by the prefix."""
    return bearer.startswith(PREFIX)


async def create(session: AsyncSession, tenant_id: str, name: str, act_as: list[str]) -> str:
    """A new token for `tenant_id` that may act for `act_as` (users of that tenant); its secret,
    which is never stored."""
    if not act_as:
        raise TokenRefused("a token acts for at least one user (--act-as USER)")
    known = set(
        await session.scalars(select(User.id).where(User.tenant_id == tenant_id, User.id.in_(act_as)))
    )
    if missing := sorted(set(act_as) - known):
        raise TokenRefused(f"no user {', '.join(missing)} in tenant {tenant_id!r}")
    taken = await session.scalar(
        select(ApiToken.id).where(ApiToken.tenant_id == tenant_id, ApiToken.name == name)
    )
    if taken is not None:
        raise TokenRefused(f"tenant {tenant_id!r} already has a token named {name!r}")
    secret = new_secret()
    session.add(
        ApiToken(tenant_id=tenant_id, name=name, secret_sha256=digest(secret), act_as=sorted(set(act_as)))
    )
    await session.flush()
    return secret


async def holder_of(session: AsyncSession, secret: str, now: datetime) -> TokenHolder | None:
    """The live (not revoked) token whose secret this is, stamped as used now, acting for those of
    its users who are active users of its tenant now; else None."""
    if len(secret) > MAX_TOKEN_CHARS or not looks_like_token(secret):
        return None
    row = await session.scalar(
        select(ApiToken).where(ApiToken.secret_sha256 == digest(secret), ApiToken.revoked_at.is_(None))
    )
    if row is None:
        return None
    row.last_used_at = now
    active = await session.scalars(
        select(User.id).where(
            User.tenant_id == row.tenant_id, User.id.in_(row.act_as), User.deactivated_at.is_(None)
        )
    )
    return TokenHolder(id=row.id, tenant_id=row.tenant_id, name=row.name, act_as=frozenset(active))


async def listed(session: AsyncSession, tenant_id: str | None) -> list[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.tenant_id, ApiToken.name)
    if tenant_id:
        query = query.where(ApiToken.tenant_id == tenant_id)
    return list(await session.scalars(query))


async def revoke(session: AsyncSession, name: str, tenant_id: str | None, now: datetime) -> ApiToken:
    """Revoke the live token `name` (in `tenant_id` when given; a name two tenants use needs it)."""
    query = select(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
    if tenant_id:
        query = query.where(ApiToken.tenant_id == tenant_id)
    rows = list(await session.scalars(query))
    if not rows:
        raise TokenRefused(f"no live token named {name!r}" + (f" in {tenant_id!r}" if tenant_id else ""))
    if len(rows) > 1:
        raise TokenRefused(
            f"tenants {', '.join(r.tenant_id for r in rows)} each have a token {name!r}: add --tenant"
        )
    await session.execute(update(ApiToken).where(ApiToken.id == rows[0].id).values(revoked_at=now))
    return rows[0]
