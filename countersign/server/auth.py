"""Who the server's caller is: session tokens (passwords are `countersign.db.people`).

A session token is an Ed25519-signed JWT for the inbox's own audience, so it can never pass as a
proof (the worker only accepts the proof audience); it names the tenant and user the login
established, and lives at most SESSION_TTL. Its `jti` is the id of its row in `inbox_sessions`
(countersign.server.sessions): the signature alone is not enough, the row must still be live.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ValidationError

SESSION_AUDIENCE = "countersign-inbox"
SESSION_TTL = timedelta(hours=8)


class Reviewer(BaseModel):
    tenant_id: str
    user_id: str


class SessionClaims(BaseModel):
    """What a validly signed, unexpired session token says; `session_id` is its `jti`."""

    reviewer: Reviewer
    session_id: str


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
    for countersign.server.sessions to say)."""
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
