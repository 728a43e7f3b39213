"""Users' standing in a tenant, read at each tool call, and changed by a tenant's operator.

`standing` is one round trip (the user's row and their scopes) on every tool call's path. `grant`,
`revoke` and `set_active` back the `users` CLI; each answers what it changed, so a repeated command
says it changed nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.access import SCOPES, Scope
from countersign.db.schema import TenantRateLimit, User, UserRole, UserScope


@dataclass(frozen=True)
class Standing:
    """A user as the access gate sees them: whether they exist and are active, and their scopes."""

    exists: bool
    active: bool
    scopes: frozenset[str]


# Read by every tool call (the access gate): built once, not per call (issue 36).
STANDING = (
    select(User.deactivated_at, UserScope.scope)
    .outerjoin(UserScope, (UserScope.tenant_id == User.tenant_id) & (UserScope.user_id == User.id))
    .where(User.tenant_id == bindparam("tenant_id"), User.id == bindparam("user_id"))
)


async def standing(session: AsyncSession, tenant_id: str, user_id: str) -> Standing:
    rows = (await session.execute(STANDING, {"tenant_id": tenant_id, "user_id": user_id})).all()
    if not rows:
        return Standing(exists=False, active=False, scopes=frozenset())
    return Standing(
        exists=True,
        active=rows[0].deactivated_at is None,
        scopes=frozenset(row.scope for row in rows if row.scope is not None),
    )


class UnknownUser(LookupError):
    pass


async def require_user(session: AsyncSession, tenant_id: str, user_id: str) -> User:
    user = await session.get(User, (tenant_id, user_id))
    if user is None:
        raise UnknownUser(f"no user {user_id!r} in tenant {tenant_id!r}")
    return user


def checked_scopes(scopes: Sequence[str]) -> list[Scope]:
    """`scopes` as known scopes, or ValueError naming the ones there are."""
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise ValueError(f"unknown scope {', '.join(unknown)}; the scopes are {', '.join(SCOPES)}")
    return [s for s in SCOPES if s in scopes]


async def grant(
    session: AsyncSession, tenant_id: str, user_id: str, scopes: Sequence[str], by: str
) -> list[str]:
    """Grant `scopes`; answers the ones the user did not hold already."""
    await require_user(session, tenant_id, user_id)
    rows = [
        {"tenant_id": tenant_id, "user_id": user_id, "scope": s, "granted_by": by}
        for s in checked_scopes(scopes)
    ]
    added = await session.scalars(
        insert(UserScope).values(rows).on_conflict_do_nothing().returning(UserScope.scope)
    )
    return sorted(added)


async def revoke(session: AsyncSession, tenant_id: str, user_id: str, scopes: Sequence[str]) -> list[str]:
    """Revoke `scopes`; answers the ones the user held."""
    await require_user(session, tenant_id, user_id)
    removed = await session.scalars(
        delete(UserScope)
        .where(
            UserScope.tenant_id == tenant_id,
            UserScope.user_id == user_id,
            UserScope.scope.in_(checked_scopes(scopes)),
        )
        .returning(UserScope.scope)
    )
    return sorted(removed)


async def set_active(
    session: AsyncSession, tenant_id: str, user_id: str, active: bool, now: datetime
) -> bool:
    """Deactivate (or reactivate) a user; answers whether anything changed. A deactivated user's
    running conversations stop acting at their next tool call."""
    await require_user(session, tenant_id, user_id)
    still = User.deactivated_at.is_(None) if not active else User.deactivated_at.is_not(None)
    changed = await session.execute(
        update(User)
        .where(User.tenant_id == tenant_id, User.id == user_id, still)
        .values(deactivated_at=None if active else now)
        .returning(User.id)
    )
    return changed.first() is not None


@dataclass(frozen=True)
class UserView:
    id: str
    display_name: str
    active: bool
    roles: list[str]
    scopes: list[str]


async def users_of(session: AsyncSession, tenant_id: str) -> list[UserView]:
    users = (await session.scalars(select(User).where(User.tenant_id == tenant_id).order_by(User.id))).all()
    roles = (
        await session.execute(select(UserRole.user_id, UserRole.role).where(UserRole.tenant_id == tenant_id))
    ).all()
    held = set(
        (
            await session.execute(
                select(UserScope.user_id, UserScope.scope).where(UserScope.tenant_id == tenant_id)
            )
        ).all()
    )
    return [
        UserView(
            id=u.id,
            display_name=u.display_name,
            active=u.deactivated_at is None,
            roles=sorted(r for who, r in roles if who == u.id),
            scopes=[s for s in SCOPES if (u.id, s) in held],
        )
        for u in users
    ]


async def set_rate_limit(
    session: AsyncSession,
    tenant_id: str,
    tool: str,
    tenant_limit: tuple[float, float],
    user_limit: tuple[float, float],
) -> None:
    """Set the tenant's limits (per second, burst) for `tool` (`*`: every tool without its own row)."""
    values = {
        "per_s": tenant_limit[0],
        "burst": tenant_limit[1],
        "user_per_s": user_limit[0],
        "user_burst": user_limit[1],
    }
    statement = insert(TenantRateLimit).values(tenant_id=tenant_id, tool=tool, **values)
    await session.execute(statement.on_conflict_do_update(index_elements=["tenant_id", "tool"], set_=values))
