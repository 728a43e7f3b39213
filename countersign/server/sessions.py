"""Inbox sessions held server-side, so that they can end before their token expires.

A session token is signed (countersign.server.auth) *and* names a row of `inbox_sessions` by its
`jti`. The token counts only while that row:
- exists: removing the user removes their sessions (ON DELETE CASCADE);
- belongs to an active user: `users deactivate` ends their sessions at their next request;
- is not revoked: `POST /api/logout` revokes it;
- has not expired: SESSION_TTL, the same as the token's own `exp`;
- carries the `credential_tag` of the user's current password hash: changing (or clearing) the
  password ends every session issued before, whichever way the hash was changed (SQL included).

One indexed primary-key lookup per request; the inbox may run as several processes, so the record
lives in PostgreSQL, not in memory.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta
from typing import Literal

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from countersign.db.schema import InboxSession, User
from countersign.server.auth import SESSION_TTL, Reviewer, SessionClaims

LoginMethod = Literal["password", "oidc"]
# Expired and revoked rows are kept this long (who was signed in when), then pruned at a login.
KEEP_ENDED = timedelta(days=30)


def credential_tag(password_hash: str | None) -> str:
    """A digest of the user's password hash: equal while the password is unchanged. The hash itself
    is not copied into another table."""
    return hashlib.sha256((password_hash or "").encode()).hexdigest()


async def open_session(
    session: AsyncSession, reviewer: Reviewer, method: LoginMethod, now: datetime
) -> InboxSession:
    """A new session row for `reviewer` (who must exist), expiring SESSION_TTL from `now`."""
    password_hash = await session.scalar(
        select(User.password_hash).where(User.tenant_id == reviewer.tenant_id, User.id == reviewer.user_id)
    )
    await session.execute(delete(InboxSession).where(InboxSession.expires_at < now - KEEP_ENDED))
    row = InboxSession(
        id=secrets.token_urlsafe(24),
        tenant_id=reviewer.tenant_id,
        user_id=reviewer.user_id,
        method=method,
        credential_tag=credential_tag(password_hash),
        expires_at=now + SESSION_TTL,
    )
    session.add(row)
    await session.flush()
    return row


async def live_reviewer(session: AsyncSession, claims: SessionClaims, now: datetime) -> Reviewer | None:
    """The reviewer of `claims` while their session is live (see the module's docstring), else None."""
    found = (
        await session.execute(
            select(InboxSession, User.password_hash)
            .join(User, (User.tenant_id == InboxSession.tenant_id) & (User.id == InboxSession.user_id))
            .where(
                InboxSession.id == claims.session_id,
                InboxSession.revoked_at.is_(None),
                InboxSession.expires_at > now,
                User.deactivated_at.is_(None),  # a deactivated user's sessions end with `users deactivate`
            )
        )
    ).one_or_none()
    if found is None:
        return None
    row, password_hash = found
    if (row.tenant_id, row.user_id) != (claims.reviewer.tenant_id, claims.reviewer.user_id):
        return None
    if not secrets.compare_digest(row.credential_tag, credential_tag(password_hash)):
        return None
    return claims.reviewer


async def is_live(sessions: async_sessionmaker[AsyncSession], claims: SessionClaims) -> bool:
    """Whether the session of `claims` still counts now: a stream asks again as it runs."""
    async with sessions() as session:
        return await live_reviewer(session, claims, datetime.now(UTC)) is not None


async def revoke(session: AsyncSession, session_id: str, now: datetime) -> bool:
    """End one session; False when it was not live."""
    ended = await session.execute(
        update(InboxSession)
        .where(InboxSession.id == session_id, InboxSession.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return bool(ended.rowcount)  # type: ignore[attr-defined]
