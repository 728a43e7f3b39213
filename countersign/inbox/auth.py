"""Who the inbox's caller is: passwords (argon2id hashes in PostgreSQL) and session tokens.

A session token is an Ed25519-signed JWT for the inbox's own audience, so it can never pass as a
proof (the worker only accepts the proof audience); it names the tenant and user the login
established, and lives at most SESSION_TTL. Its `jti` is the id of its row in `inbox_sessions`
(countersign.inbox.sessions): the signature alone is not enough, the row must still be live.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import jwt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.db.schema import User

SESSION_AUDIENCE = "countersign-inbox"
SESSION_TTL = timedelta(hours=8)
DEV_PASSWORD_SUFFIX = "-dev"
_HASHER = PasswordHasher()
# Verified against when the user does not exist, so a wrong user name costs as long as a wrong password.
_DUMMY_HASH = _HASHER.hash("not a password")


class Reviewer(BaseModel):
    tenant_id: str
    user_id: str


class SessionClaims(BaseModel):
    """What a validly signed, unexpired session token says; `session_id` is its `jti`."""

    reviewer: Reviewer
    session_id: str


def hash_password(password: str) -> str:
    return _HASHER.hash(password)


async def check_password(session: AsyncSession, tenant_id: str, user_id: str, password: str) -> bool:
    stored = await session.scalar(
        select(User.password_hash).where(User.tenant_id == tenant_id, User.id == user_id)
    )

    def verify() -> bool:
        try:
            return _HASHER.verify(stored or _DUMMY_HASH, password) and stored is not None
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


def issue_session(key: Ed25519PrivateKey, reviewer: Reviewer, now: datetime, session_id: str) -> str:
    claims = {
        "aud": SESSION_AUDIENCE,
        "jti": session_id,
        "sub": reviewer.user_id,
        "tenant": reviewer.tenant_id,
        "iat": int(now.timestamp()),
        "exp": int((now + SESSION_TTL).timestamp()),
    }
    return jwt.encode(claims, key, algorithm="EdDSA")


def read_session(key: Ed25519PublicKey, token: str) -> SessionClaims | None:
    """What a valid, unexpired session token says, else None (whether its session is still live is
    for countersign.inbox.sessions to say)."""
    try:
        claims = jwt.decode(
            token,
            key,
            algorithms=["EdDSA"],
            audience=SESSION_AUDIENCE,
            options={"require": ["exp", "sub", "jti"]},
        )
        return SessionClaims(
            reviewer=Reviewer(tenant_id=claims["tenant"], user_id=claims["sub"]), session_id=claims["jti"]
        )
    except (jwt.InvalidTokenError, KeyError, ValidationError):
        return None
