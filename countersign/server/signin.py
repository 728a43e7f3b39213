"""Who is signed in, for both sides of the server: a person signs in with a password or through
an OIDC provider, gets a signed session token (cookie or bearer) whose session row can be revoked,
and every attempt is recorded and throttled (countersign.server.throttle). The reviewers' inbox and
its event stream, the requesters' pages and conversation API, and the pages' header all ask
`SignIn.session_of` who a request comes from; nothing else reads a session token."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from countersign.core.bounds import Identifier
from countersign.db.people import check_password
from countersign.server import sessions, throttle
from countersign.server.auth import Reviewer, SessionClaims, issue_session, read_session
from countersign.server.http import HttpRefusal
from countersign.server.oidc import Flow, OidcConfig, OidcRefused, reviewer_for, seal_flow


class LoginRequest(BaseModel, extra="forbid"):
    # names, looked up in PostgreSQL and recorded with a refused attempt: no NUL, newline or lone surrogate
    tenant_id: Annotated[Identifier, Field(max_length=100)]
    user_id: Annotated[Identifier, Field(max_length=100)]
    password: str = Field(min_length=1, max_length=1000)


class SignIn:
    """Sign-in and sessions over the database (`sessions`) and the server's signing key, which
    signs the session tokens and the OIDC flow cookie."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], signing_key: Ed25519PrivateKey) -> None:
        self._sessions = sessions
        self._key = signing_key
        self.public_key = signing_key.public_key()

    async def login(self, request: LoginRequest, client: str) -> str:
        """A session token for a right password, unless `client` or the account is throttled
        (countersign.server.throttle); every attempt is recorded in `login_attempts`."""
        tenant, user, now = request.tenant_id, request.user_id, datetime.now(UTC)
        refusal: HttpRefusal | None = None
        async with self._sessions.begin() as session:
            try:
                await throttle.lock_account(session, tenant, user)
                await throttle.check(session, tenant, user, client, now)
                ok = await check_password(session, tenant, user, request.password)
                outcome, reason = ("accepted", None) if ok else ("bad_credentials", "wrong password")
            except throttle.Throttled as err:
                outcome, reason = "throttled", str(err)
                refusal = HttpRefusal(429, str(err), retry_after_s=err.retry_after_s)
            await throttle.record(
                session, tenant_id=tenant, user_id=user, client=client, method="password",
                outcome=outcome, reason=reason, now=now,
            )  # fmt: skip
            if outcome == "accepted":
                return await self.open_session(session, Reviewer(tenant_id=tenant, user_id=user), "password")
        raise refusal or HttpRefusal(401, "unknown user or wrong password")

    async def login_oidc(self, config: OidcConfig, claims: dict[str, Any], client: str) -> str:
        """A session token for the user verified claims name (OidcRefused when none; recorded)."""
        async with self._sessions.begin() as session:
            try:
                reviewer = await reviewer_for(session, config, claims)
            except OidcRefused as err:
                refusal = err
            else:
                await throttle.record(
                    session, tenant_id=reviewer.tenant_id, user_id=reviewer.user_id, client=client,
                    method="oidc", outcome="accepted", reason=None, now=datetime.now(UTC),
                )  # fmt: skip
                return await self.open_session(session, reviewer, "oidc")
        await self.refused_login(claims, config, client, str(refusal))
        raise refusal

    def seal_flow(self, flow: Flow) -> str:
        """The OIDC flow cookie, signed with the inbox's key."""
        return seal_flow(self._key, flow, datetime.now(UTC))

    async def refused_login(
        self, claims: dict[str, Any], config: OidcConfig, client: str, reason: str
    ) -> None:
        """Record a refused OIDC login, naming whom the claims (if any were verified) named."""
        tenant = config.tenant or claims.get(config.tenant_claim)
        user = claims.get(config.user_claim) or claims.get("sub")
        async with self._sessions.begin() as session:
            await throttle.record(
                session, tenant_id=str(tenant or ""), user_id=str(user or ""), client=client,
                method="oidc", outcome="refused", reason=reason, now=datetime.now(UTC),
            )  # fmt: skip

    async def open_session(
        self, session: AsyncSession, reviewer: Reviewer, method: sessions.LoginMethod
    ) -> str:
        """A session row for `reviewer` (in `session`'s transaction) and its signed token."""
        now = datetime.now(UTC)
        row = await sessions.open_session(session, reviewer, method, now)
        return issue_session(self._key, reviewer, now, row.id)

    async def session_of(self, token: str) -> SessionClaims | None:
        """The claims of `token` while its session is live (signed, unexpired, not revoked, the
        user still there with the same password), else None."""
        claims = read_session(self.public_key, token)
        return claims if claims is not None and await self.live(claims) else None

    async def live(self, claims: SessionClaims) -> bool:
        return await sessions.is_live(self._sessions, claims)

    async def logout(self, claims: SessionClaims) -> None:
        async with self._sessions.begin() as session:
            await sessions.revoke(session, claims.session_id, datetime.now(UTC))


SIGN_IN = web.AppKey("sign_in", SignIn)
