"""Who people are in a tenant: their roles (read by the worker's authority checks and the server) and
their passwords (argon2id hashes: memory-hard, the OWASP recommendation)."""

from __future__ import annotations

import asyncio
import functools

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.db.schema import User, UserRole

DEV_PASSWORD_SUFFIX = "-dev"
_HASHER = PasswordHasher()


async def roles_of(session: AsyncSession, tenant_id: str, user_id: str) -> list[str] | None:
    """The user's roles in the tenant, or None when they are not a user of it, or were deactivated
    (one round trip: it is on the way from a reviewer's click to the tool call, in the inbox and in
    record_decision). A deactivated user therefore cannot decide, send messages, end or roll back."""
    rows = (
        await session.execute(
            select(User.id, UserRole.role)
            .outerjoin(UserRole, (UserRole.tenant_id == User.tenant_id) & (UserRole.user_id == User.id))
            .where(User.tenant_id == tenant_id, User.id == user_id, User.deactivated_at.is_(None))
        )
    ).all()
    if not rows:
        return None
    return [role for _, role in rows if role is not None]


@functools.cache
def _dummy_hash() -> str:
    """Verified against when the user does not exist, so a wrong user name costs as long as a wrong
    password. Made on first use: hashing takes ~0.7 s of CPU, which every CLI command paid at import."""
    return _HASHER.hash("not a password")


def hash_password(password: str) -> str:
    return _HASHER.hash(password)


async def check_password(session: AsyncSession, tenant_id: str, user_id: str, password: str) -> bool:
    stored = await session.scalar(  # a deactivated user cannot log in
        select(User.password_hash).where(
            User.tenant_id == tenant_id, User.id == user_id, User.deactivated_at.is_(None)
        )
    )

    def verify() -> bool:
        try:
            return _HASHER.verify(stored or _dummy_hash(), password) and stored is not None
        except (VerificationError, InvalidHashError):
            return False

    # argon2 takes a few hundred ms of CPU by design (and releases the GIL): off the event loop, so
    # other requests and open event streams are served meanwhile
    return await asyncio.to_thread(verify)


async def set_dev_passwords(session: AsyncSession) -> None:
    """`<user>-dev` for every user who has no password yet (`db seed`); others are left alone."""
    users = await session.scalars(select(User).where(User.password_hash.is_(None)))
    for user in users:
        user.password_hash = hash_password(user.id + DEV_PASSWORD_SUFFIX)
