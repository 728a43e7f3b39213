"""Inbox login through the company's OpenID Connect provider, when configured.

The authorization-code flow with PKCE (S256), `state` and `nonce`:
1. `GET /auth/oidc/login` makes a state, a nonce and a PKCE verifier, keeps them in a short-lived
   cookie signed with the inbox's key (HttpOnly, SameSite=Lax: the provider's redirect back is a
   cross-site navigation), and redirects to the provider's authorization endpoint.
2. `GET /auth/oidc/callback` checks the returned `state` against the cookie's, exchanges the code
   (with the verifier) at the token endpoint, and verifies the ID token: signature against the
   provider's JWKS (fetched again once on an unknown key id, for key rotation), issuer, audience
   (this client), expiry, nonce, `azp` and `at_hash` (authlib's CodeIDToken).
3. The claims name a tenant (a claim, or one fixed tenant) and a user (by email or by id). The user
   must exist in PostgreSQL: an IdP identity that matches no user is refused. Roles come from
   PostgreSQL, never from claims; the provider only says who the person is.

authlib does the security-sensitive parts (PKCE challenge, token generation, ID-token claim
validation, with joserfc for the JWS); aiohttp, the inbox's HTTP stack, does the three requests.
Configuration by environment, see `OidcConfig.from_env`.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timedelta
from typing import Any, Literal
from urllib.parse import quote, urlencode

import aiohttp
import jwt
from authlib.common.security import generate_token
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from authlib.oidc.core import CodeIDToken
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from joserfc import jwt as jose_jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.bounds import has_control
from countersign.db.schema import User
from countersign.server.auth import Reviewer

FLOW_AUDIENCE = "countersign-oidc-flow"
FLOW_TTL = timedelta(minutes=10)
CALLBACK_PATH = "/auth/oidc/callback"
HTTP_TIMEOUT_S = 10
CLOCK_LEEWAY_S = 60
MAX_CLAIM_CHARS = 320


class OidcRefused(Exception):
    """The login through the provider does not count; the message says why (shown and recorded)."""


class OidcConfig(BaseModel):
    issuer: str = Field(min_length=1)
    client_id: str = Field(min_length=1)
    client_secret: str | None = None  # None: a public client (PKCE only)
    name: str = "single sign-on"  # "Sign in with <name>" on the login page
    tenant_claim: str = "countersign_tenant"
    tenant: str | None = None  # every identity of this provider belongs to this tenant
    user_claim: str = "email"
    user_match: Literal["email", "id"] = "email"  # which column of `users` the user claim names
    scopes: str = "openid email profile"
    redirect_url: str | None = None  # default: the inbox's URL + CALLBACK_PATH

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OidcConfig | None:
        """`COUNTERSIGN_OIDC_ISSUER` turns it on; the client secret is read from the environment
        (`COUNTERSIGN_OIDC_CLIENT_SECRET`) only, never from a file or a flag."""
        env = dict(os.environ if env is None else env)
        issuer = env.get("COUNTERSIGN_OIDC_ISSUER", "").strip()
        if not issuer:
            return None
        inbox_url = env.get("COUNTERSIGN_INBOX_URL", "").rstrip("/")
        values = {
            "issuer": issuer.rstrip("/"),
            "client_id": env.get("COUNTERSIGN_OIDC_CLIENT_ID", ""),
            "client_secret": env.get("COUNTERSIGN_OIDC_CLIENT_SECRET"),
            "name": env.get("COUNTERSIGN_OIDC_NAME"),
            "tenant_claim": env.get("COUNTERSIGN_OIDC_TENANT_CLAIM"),
            "tenant": env.get("COUNTERSIGN_OIDC_TENANT"),
            "user_claim": env.get("COUNTERSIGN_OIDC_USER_CLAIM"),
            "user_match": env.get("COUNTERSIGN_OIDC_USER_MATCH"),
            "scopes": env.get("COUNTERSIGN_OIDC_SCOPES"),
            "redirect_url": env.get("COUNTERSIGN_OIDC_REDIRECT_URL")
            or (inbox_url + CALLBACK_PATH if inbox_url else None),
        }
        try:
            return cls(**{k: v for k, v in values.items() if v})
        except ValidationError as err:
            raise RuntimeError(
                f"COUNTERSIGN_OIDC_*: {err.errors()[0]['loc'][0]}: {err.errors()[0]['msg']}"
            ) from None


class Flow(BaseModel):
    """What the login started, kept in the signed flow cookie until the callback."""

    state: str
    nonce: str
    verifier: str
    redirect_uri: str


def seal_flow(key: Ed25519PrivateKey, flow: Flow, now: datetime) -> str:
    claims = {"aud": FLOW_AUDIENCE, "exp": int((now + FLOW_TTL).timestamp()), **flow.model_dump()}
    return jwt.encode(claims, key, algorithm="EdDSA")


def open_flow(key: Ed25519PublicKey, cookie: str | None) -> Flow:
    if not cookie or len(cookie) > 4096:
        raise OidcRefused("no login in progress in this browser (start again)")
    try:
        claims = jwt.decode(cookie, key, algorithms=["EdDSA"], audience=FLOW_AUDIENCE)
        return Flow.model_validate(claims)
    except (jwt.InvalidTokenError, ValidationError):
        raise OidcRefused("the login in progress expired or is not this inbox's (start again)") from None


class OidcProvider:
    """The configured provider: discovery, the authorization URL, and the callback's checks."""

    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        self._metadata: dict[str, Any] | None = None
        self._jwks: dict[str, Any] | None = None

    async def _get(self, url: str) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as http,
            http.get(url) as response,
        ):
            response.raise_for_status()
            data = await response.json(content_type=None)
        if not isinstance(data, dict):
            raise OidcRefused(f"the provider's {url} is not a JSON object")
        return data

    async def metadata(self) -> dict[str, Any]:
        """The provider's discovery document; its issuer must be the configured one."""
        if self._metadata is None:
            data = await self._get(self.config.issuer + "/.well-known/openid-configuration")
            if str(data.get("issuer", "")).rstrip("/") != self.config.issuer:
                raise OidcRefused(
                    f"the provider says it is {data.get('issuer')!r}, not {self.config.issuer!r}"
                )
            self._metadata = data
        return self._metadata

    async def _key_set(self, refresh: bool) -> KeySet:
        if self._jwks is None or refresh:
            self._jwks = await self._get(str((await self.metadata())["jwks_uri"]))
        return KeySet.import_key_set(self._jwks)  # type: ignore[arg-type]

    async def start(self, redirect_uri: str) -> tuple[str, Flow]:
        """The provider's authorization URL, and the flow to keep until the callback."""
        flow = Flow(
            state=generate_token(32), nonce=generate_token(32), verifier=generate_token(64),
            redirect_uri=redirect_uri,
        )  # fmt: skip
        query = {
            "response_type": "code",
            "client_id": self.config.client_id,
            "redirect_uri": redirect_uri,
            "scope": self.config.scopes,
            "state": flow.state,
            "nonce": flow.nonce,
            "code_challenge": create_s256_code_challenge(flow.verifier),
            "code_challenge_method": "S256",
        }
        endpoint = str((await self.metadata())["authorization_endpoint"])
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}", flow

    async def finish(self, query: dict[str, str], flow: Flow) -> dict[str, Any]:
        """The verified ID token claims for the callback's `query`, or OidcRefused."""
        if "error" in query:
            raise OidcRefused(f"the provider refused: {query['error']} {query.get('error_description', '')}")
        if not secrets.compare_digest(query.get("state", "").encode(), flow.state.encode()):
            raise OidcRefused("state does not match the login started in this browser")
        code = query.get("code", "")
        if not code or len(code) > 4096:
            raise OidcRefused("the provider sent no authorization code")
        tokens = await self.exchange(code, flow)
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise OidcRefused("the provider sent no ID token")
        return await self.verify_id_token(id_token, flow.nonce, tokens.get("access_token"))

    async def exchange(self, code: str, flow: Flow) -> dict[str, Any]:
        metadata = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": flow.redirect_uri,
            "code_verifier": flow.verifier,
            "client_id": self.config.client_id,
        }
        headers = {}
        if self.config.client_secret:
            methods = metadata.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
            if "client_secret_basic" in methods:  # RFC 6749 2.3.1: each part form-urlencoded first
                headers["Authorization"] = aiohttp.encode_basic_auth(
                    quote(self.config.client_id, safe=""), quote(self.config.client_secret, safe="")
                )
            else:
                form["client_secret"] = self.config.client_secret
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as http,
            http.post(str(metadata["token_endpoint"]), data=form, headers=headers) as response,
        ):
            data = await response.json(content_type=None)
        if not isinstance(data, dict) or response.status != 200:
            error = data.get("error") if isinstance(data, dict) else None
            public = (
                " (this inbox signs in as a public client, PKCE without a secret, which this provider "
                "does not accept: register a confidential client and set COUNTERSIGN_OIDC_CLIENT_SECRET)"
                if error == "invalid_client" and not self.config.client_secret
                else ""
            )
            raise OidcRefused(f"the provider refused the code: {error or f'HTTP {response.status}'}{public}")
        return data

    async def verify_id_token(self, id_token: str, nonce: str, access_token: object = None) -> dict[str, Any]:
        """The claims of `id_token` once its signature (JWKS), issuer, audience, expiry and nonce
        hold; OidcRefused names the first that does not."""
        metadata = await self.metadata()
        registry = JWSRegistry(algorithms=metadata.get("id_token_signing_alg_values_supported") or ["RS256"])
        try:
            try:
                token = jose_jwt.decode(id_token, await self._key_set(refresh=False), registry=registry)
            except InvalidKeyIdError:  # the provider rotated its keys
                token = jose_jwt.decode(id_token, await self._key_set(refresh=True), registry=registry)
            params: dict[str, Any] = {"nonce": nonce, "client_id": self.config.client_id}
            if isinstance(access_token, str):
                params["access_token"] = access_token
            claims = CodeIDToken(
                token.claims,
                token.header,
                {
                    "iss": {"essential": True, "value": self.config.issuer},
                    "aud": {"essential": True, "value": self.config.client_id},
                    "nonce": {"essential": True},
                },
                params,
            )
            claims.validate(leeway=CLOCK_LEEWAY_S)
        except JoseError as err:
            raise OidcRefused(
                f"ID token refused: {err.error}: {err.description or ''}".rstrip(": ")
            ) from None
        except ValueError as err:  # not a JWS at all
            raise OidcRefused(f"ID token refused: {err}") from None
        return dict(claims)


def _claim(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value or len(value) > MAX_CLAIM_CHARS or has_control(value):
        raise OidcRefused(f"the ID token has no usable {name!r} claim")
    return value


async def reviewer_for(session: AsyncSession, config: OidcConfig, claims: dict[str, Any]) -> Reviewer:
    """The Countersign user the verified claims name; OidcRefused when none matches."""
    tenant = config.tenant or _claim(claims, config.tenant_claim)
    named = _claim(claims, config.user_claim)
    if config.user_match == "email":
        # Only the boolean true vouches (a missing claim or the string "false" does not), and it
        # vouches for the `email` claim only: a match on any other claim must name that address.
        if claims.get("email_verified") is not True:
            raise OidcRefused(f"the provider has not verified {named} (email_verified is not true)")
        if config.user_claim != "email" and claims.get("email") != named:
            raise OidcRefused(
                f"{named} (claim {config.user_claim!r}) is not the email address the provider verified"
            )
        match = func.lower(User.email) == named.lower()
    else:
        match = User.id == named
    found = list(await session.scalars(select(User.id).where(User.tenant_id == tenant, match).limit(2)))
    if not found:
        raise OidcRefused(f"no user {named} in tenant {tenant}")
    if len(found) > 1:  # emails differing only in case: do not guess which person this is
        raise OidcRefused(f"{named} names more than one user in tenant {tenant}")
    return Reviewer(tenant_id=tenant, user_id=found[0])
