"""Inbox login through a real OpenID provider (oidc-provider-mock: authlib + flask, on a free port),
over HTTP the way a browser follows it: the inbox's redirect, the provider's login form, the
callback. The user must exist in PostgreSQL; roles come from PostgreSQL, never from claims."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import aiohttp
import jwt
import pytest
import pytest_asyncio
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from markupsafe import escape
from playwright.async_api import async_playwright
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from countersign.db.schema import InboxSession, LoginAttempt
from countersign.devstack.temporal import DevServerConfig
from countersign.server import watcher as approvals_watcher
from countersign.server.oidc import OidcConfig, OidcProvider, OidcRefused
from tests.e2e.test_inbox_browser import ARTIFACTS, CHROMIUM_ARGS
from tests.e2e.test_web_ui import chromium as chromium
from tests.fixtures.inbox import AuthInbox, ProofKeys, auth_inbox_serving

with warnings.catch_warnings():  # the provider imports authlib.jose, which authlib deprecates
    warnings.simplefilter("ignore")
    import oidc_provider_mock

CLIENT_ID = "countersign-inbox"
# the provider's own use of authlib APIs that authlib deprecates
pytestmark = pytest.mark.filterwarnings("ignore:get_jwt_config:DeprecationWarning")


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    """The OpenID provider's issuer URL. It requires a nonce; any client id and secret are accepted."""
    with oidc_provider_mock.run_server_in_thread(require_nonce=True) as server:
        yield f"http://127.0.0.1:{server.server_port}"


def config(issuer: str, **changes: Any) -> OidcConfig:
    return OidcConfig(
        **{"issuer": issuer, "client_id": CLIENT_ID, "client_secret": "s3cret", "name": "Acme SSO", **changes}
    )


@pytest_asyncio.fixture
async def sso_inbox(
    provider: str, temporal_env: WorkflowEnvironment, database_url: str, db_engine: AsyncEngine,
    proof_keys: ProofKeys,
) -> AsyncIterator[AuthInbox]:  # fmt: skip
    async with auth_inbox_serving(
        temporal_env.client, database_url, db_engine, proof_keys, config(provider)
    ) as inbox:
        yield inbox


# bob as the provider vouches for him: his address, verified (the boolean true, nothing else)
BOB: dict[str, Any] = {"email": "bob@acme.example", "countersign_tenant": "acme", "email_verified": True}


async def identity(provider: str, sub: str, **claims: Any) -> None:
    """What the provider will say about `sub` once they sign in there."""
    async with aiohttp.ClientSession() as http, http.put(f"{provider}/users/{sub}", json=claims) as response:
        assert response.status == 204


def with_param(url: str, name: str, value: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    return urlunsplit(parts._replace(query=urlencode({**query, name: value})))


class Browser:
    """A cookie-keeping HTTP client stepping through the flow as a browser would."""

    def __init__(self, http: aiohttp.ClientSession, inbox: AuthInbox) -> None:
        self.http, self.inbox = http, inbox

    async def start(self) -> str:
        """Click "Sign in with …": the provider's authorization URL the inbox redirects to."""
        async with self.http.get(self.inbox.url + "/auth/oidc/login", allow_redirects=False) as response:
            assert response.status == 302, await response.text()
            return response.headers["Location"]

    async def sign_in_at_provider(self, authorize_url: str, sub: str) -> str:
        """Submit the provider's login form as `sub`: the callback URL it redirects back to."""
        async with self.http.post(authorize_url, data={"sub": sub}, allow_redirects=False) as response:
            assert response.status == 302, await response.text()
            return response.headers["Location"]

    async def callback(self, url: str) -> tuple[int, str]:
        async with self.http.get(url, allow_redirects=False) as response:
            return response.status, await response.text()

    async def me(self) -> tuple[int, Any]:
        async with self.http.get(self.inbox.url + "/api/me") as response:
            return response.status, await response.json(content_type=None)

    async def sign_in(self, sub: str) -> tuple[int, str]:
        return await self.callback(await self.sign_in_at_provider(await self.start(), sub))


@pytest_asyncio.fixture
async def browser(sso_inbox: AuthInbox) -> AsyncIterator[Browser]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        yield Browser(http, sso_inbox)


async def last_attempt(engine: AsyncEngine) -> tuple[str, str, str, str | None]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(
                    LoginAttempt.tenant_id, LoginAttempt.user_id, LoginAttempt.outcome, LoginAttempt.reason
                )
                .where(LoginAttempt.method == "oidc")
                .order_by(LoginAttempt.id.desc())
                .limit(1)
            )
        ).one()
    return row.tenant_id, row.user_id, row.outcome, row.reason


async def test_the_login_page_offers_the_provider_only_when_configured(
    sso_inbox: AuthInbox, auth_inbox: AuthInbox
) -> None:
    assert "Sign in with Acme SSO" in (await sso_inbox.call("GET", "/"))[1]
    assert "Sign in with" not in (await auth_inbox.call("GET", "/"))[1]
    assert (await auth_inbox.call("GET", "/auth/oidc/login"))[0] == 404


async def test_a_user_signs_in_through_the_provider(
    provider: str, browser: Browser, db_engine: AsyncEngine
) -> None:
    # the provider claims an admin role: roles come from PostgreSQL (bob is a reviewer) all the same
    await identity(provider, "bob-sso", **BOB, roles=["admin"])
    authorize = await browser.start()
    query = parse_qs(urlsplit(authorize).query)
    assert query["code_challenge_method"] == ["S256"] and query["client_id"] == [CLIENT_ID]
    # PKCE: the challenge sent is S256 of the verifier the flow cookie keeps for the token request
    cookie = next(c for c in browser.http.cookie_jar if c.key == "countersign_oidc_flow")
    flow = jwt.decode(cookie.value, options={"verify_signature": False})
    assert query["code_challenge"] == [create_s256_code_challenge(flow["verifier"])]
    assert query["state"] == [flow["state"]] and query["nonce"] == [flow["nonce"]]
    status, page = await browser.callback(await browser.sign_in_at_provider(authorize, "bob-sso"))
    assert status == 200 and "Signed in." in page
    status, me = await browser.me()
    assert status == 200, me
    assert (me["tenant_id"], me["user_id"], me["roles"]) == ("acme", "bob", ["reviewer"])
    assert await last_attempt(db_engine) == ("acme", "bob", "accepted", None)
    async with db_engine.connect() as conn:
        method = await conn.scalar(
            select(InboxSession.method)
            .where(InboxSession.user_id == "bob")
            .order_by(InboxSession.created_at.desc())
        )
    assert method == "oidc"
    # the session it opened is revocable like any other
    async with browser.http.post(browser.inbox.url + "/api/logout", json={}) as response:
        assert response.status == 200
    assert (await browser.me())[0] == 401


async def test_a_public_client_the_provider_refuses_is_told_what_to_set(
    provider: str, temporal_env: WorkflowEnvironment, database_url: str, db_engine: AsyncEngine,
    proof_keys: ProofKeys,
) -> None:  # fmt: skip
    """Without a secret the inbox is a public client (PKCE alone, token auth `none`); the mock, like
    some real providers, accepts only confidential clients: the refusal says what to set."""
    await identity(provider, "bob-public", **BOB)
    public = config(provider, client_secret=None)
    async with (
        auth_inbox_serving(temporal_env.client, database_url, db_engine, proof_keys, public) as inbox,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        status, page = await Browser(http, inbox).sign_in("bob-public")
    assert status == 403, page
    assert "invalid_client" in page and "public client" in page and "COUNTERSIGN_OIDC_CLIENT_SECRET" in page


async def test_a_tampered_state_is_refused(provider: str, browser: Browser, db_engine: AsyncEngine) -> None:
    await identity(provider, "bob-sso", **BOB)
    callback = await browser.sign_in_at_provider(await browser.start(), "bob-sso")
    status, page = await browser.callback(with_param(callback, "state", "forged"))
    assert status == 403 and "state does not match" in page
    assert (await browser.me())[0] == 401
    assert (await last_attempt(db_engine))[2:] == (
        "refused",
        "state does not match the login started in this browser",
    )


async def test_a_callback_without_the_login_started_in_this_browser_is_refused(
    provider: str, browser: Browser, sso_inbox: AuthInbox
) -> None:
    """Login CSRF: a code obtained by someone else, delivered to a browser that started nothing."""
    await identity(provider, "bob-sso", **BOB)
    callback = await browser.sign_in_at_provider(await browser.start(), "bob-sso")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as other:
        victim = Browser(other, sso_inbox)
        status, page = await victim.callback(callback)
        assert status == 403 and "no login in progress" in page
        assert (await victim.me())[0] == 401


async def test_a_sign_in_denied_at_the_provider_is_refused(browser: Browser, db_engine: AsyncEngine) -> None:
    async with browser.http.post(
        await browser.start(), data={"action": "deny"}, allow_redirects=False
    ) as response:
        callback = response.headers["Location"]
    status, page = await browser.callback(callback)
    assert status == 403 and "the provider refused: access_denied" in page
    assert (await browser.me())[0] == 401
    assert (await last_attempt(db_engine))[2] == "refused"


async def test_an_id_token_with_another_nonce_is_refused(provider: str, browser: Browser) -> None:
    await identity(provider, "bob-sso", **BOB)
    authorize = with_param(await browser.start(), "nonce", "replayed-nonce")
    status, page = await browser.callback(await browser.sign_in_at_provider(authorize, "bob-sso"))
    assert status == 403 and "ID token refused" in page and "nonce" in page
    assert (await browser.me())[0] == 401


async def test_an_id_token_for_another_client_is_refused(provider: str) -> None:
    """A real ID token the provider issued to another client (audience) does not sign anyone in here."""
    await identity(provider, "bob-sso", **BOB)
    other = OidcProvider(config(provider, client_id="someone-else"))
    url, flow = await other.start("http://127.0.0.1:1/cb")
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data={"sub": "bob-sso"}, allow_redirects=False) as response,
    ):
        code = parse_qs(urlsplit(response.headers["Location"]).query)["code"][0]
    raw = (await other.exchange(code, flow))["id_token"]
    assert (await other.verify_id_token(raw, flow.nonce))["aud"] in ("someone-else", ["someone-else"])
    with pytest.raises(OidcRefused, match="aud"):
        await OidcProvider(config(provider)).verify_id_token(raw, flow.nonce)
    with pytest.raises(OidcRefused, match="ID token refused"):
        await OidcProvider(config(provider)).verify_id_token(raw[:-8] + "AAAAAAAA", flow.nonce)


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        (
            {**BOB, "email": "nobody@acme.example"},
            "no user nobody@acme.example in tenant acme",
        ),
        # bob exists, in acme: an identity claiming globex is not bob of globex
        ({**BOB, "countersign_tenant": "globex"}, "no user bob@acme.example in tenant globex"),
        ({"email": "bob@acme.example", "email_verified": True}, "no usable 'countersign_tenant' claim"),
        # only the boolean true vouches for the address (issue 40: only false was refused)
        *(
            ({**BOB, "email_verified": verified}, "has not verified bob@acme.example")
            for verified in (False, "false", "true", 1, None)
        ),
        ({k: v for k, v in BOB.items() if k != "email_verified"}, "has not verified bob@acme.example"),
    ],
)
async def test_an_identity_matching_no_user_is_refused(
    provider: str, browser: Browser, db_engine: AsyncEngine, claims: dict[str, Any], reason: str
) -> None:
    await identity(provider, "someone", **claims)
    status, page = await browser.sign_in("someone")
    assert status == 403 and str(escape(reason)) in page
    assert (await browser.me())[0] == 401
    tenant, _, outcome, recorded = await last_attempt(db_engine)
    assert outcome == "refused" and recorded is not None and reason in recorded
    assert tenant == claims.get("countersign_tenant", "")


async def test_a_fixed_tenant_and_a_user_id_claim(
    provider: str, temporal_env: WorkflowEnvironment, database_url: str, db_engine: AsyncEngine,
    proof_keys: ProofKeys,
) -> None:  # fmt: skip
    """A provider for one tenant, whose `preferred_username` is the Countersign user id."""
    one_tenant = config(provider, tenant="globex", user_claim="preferred_username", user_match="id")
    await identity(provider, "erin-sso", preferred_username="erin", email="erin@elsewhere.example")
    async with (
        auth_inbox_serving(temporal_env.client, database_url, db_engine, proof_keys, one_tenant) as inbox,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        browser = Browser(http, inbox)
        assert (await browser.sign_in("erin-sso"))[0] == 200
        status, me = await browser.me()
        assert (status, me["tenant_id"], me["user_id"], me["roles"]) == (200, "globex", "erin", ["reviewer"])


@pytest.mark.security
async def test_a_match_by_email_on_another_claim_must_name_the_verified_address(
    provider: str, temporal_env: WorkflowEnvironment, database_url: str, db_engine: AsyncEngine,
    proof_keys: ProofKeys,
) -> None:  # fmt: skip
    """A provider configured to match users by email through another claim (`upn`): its
    `email_verified` speaks for the `email` claim, so the `upn` must be that address (issue 40:
    a verified address of mallory's let an unverified `upn` of bob's sign in as bob)."""
    by_upn = config(provider, user_claim="upn")
    await identity(
        provider, "mallory-sso", **{**BOB, "upn": "bob@acme.example", "email": "mallory@evil.example"}
    )
    await identity(provider, "bob-sso", **BOB, upn="bob@acme.example")
    async with (
        auth_inbox_serving(temporal_env.client, database_url, db_engine, proof_keys, by_upn) as inbox,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        browser = Browser(http, inbox)
        status, page = await browser.sign_in("mallory-sso")
        assert status == 403 and "not the email address the provider verified" in page, page
        assert (await browser.me())[0] == 401
        assert (await browser.sign_in("bob-sso"))[0] == 200
        status, me = await browser.me()
        assert (status, me["tenant_id"], me["user_id"]) == (200, "acme", "bob")


def test_configuration_from_the_environment() -> None:
    assert OidcConfig.from_env({}) is None
    env = {
        "COUNTERSIGN_OIDC_ISSUER": "https://login.example.com/",
        "COUNTERSIGN_OIDC_CLIENT_ID": "countersign",
        "COUNTERSIGN_OIDC_CLIENT_SECRET": "s",
        "COUNTERSIGN_OIDC_NAME": "Example SSO",
        "COUNTERSIGN_INBOX_URL": "https://inbox.example.com/",
    }
    loaded = OidcConfig.from_env(env)
    assert loaded is not None
    assert (loaded.issuer, loaded.client_secret, loaded.tenant_claim, loaded.user_match) == (
        "https://login.example.com", "s", "countersign_tenant", "email",
    )  # fmt: skip
    assert loaded.redirect_url == "https://inbox.example.com/auth/oidc/callback"
    with pytest.raises(RuntimeError, match="client_id"):
        OidcConfig.from_env({"COUNTERSIGN_OIDC_ISSUER": "https://login.example.com"})
    with pytest.raises(RuntimeError, match="user_match"):
        OidcConfig.from_env({**env, "COUNTERSIGN_OIDC_USER_MATCH": "name"})


@pytest.mark.devserver
async def test_bob_signs_in_with_the_provider_in_the_browser_and_logs_out(
    provider: str, dev_server: DevServerConfig, database_url: str, db_engine: AsyncEngine,
    proof_keys: ProofKeys, chromium: str, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Headless Chromium: the login page's button, the provider's own form, back to the inbox
    signed in (the session cookie is SameSite=Strict: the callback answers a page, not a redirect).
    A session revoked elsewhere takes the open page back to the login form; so does "Log out"."""
    monkeypatch.setattr(approvals_watcher, "KEEPALIVE_S", 0.3)
    await identity(provider, "bob-sso", **BOB)
    client = await Client.connect(
        dev_server.address, namespace=dev_server.namespace, data_converter=pydantic_data_converter
    )
    ARTIFACTS.mkdir(exist_ok=True)
    async with (
        auth_inbox_serving(client, database_url, db_engine, proof_keys, config(provider)) as inbox,
        async_playwright() as p,
    ):
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = await browser.new_page()
        await page.route("https://**", lambda route: route.abort())  # the provider's page links a CDN
        await page.goto(inbox.url + "/")

        async def sign_in() -> None:
            await page.get_by_role("link", name="Sign in with Acme SSO").click()
            await page.wait_for_url(f"{provider}/oauth2/authorize**", wait_until="domcontentloaded")
            await page.get_by_placeholder("sub").fill("bob-sso")
            await page.get_by_role("button", name="Authorize").click()
            await page.wait_for_selector("#whoami", timeout=15_000)
            assert await page.text_content("#whoami") == "bob"

        await sign_in()
        await page.wait_for_function("() => document.querySelector('#live').textContent.startsWith('live')")
        await page.screenshot(path=ARTIFACTS / "inbox-oidc-signed-in.png", full_page=True)
        async with db_engine.begin() as conn:  # an admin ends bob's sessions
            await conn.execute(
                update(InboxSession).where(InboxSession.user_id == "bob").values(revoked_at=datetime.now(UTC))
            )
        await page.wait_for_selector("#login", timeout=15_000)
        await sign_in()
        await page.get_by_role("button", name="Log out").click()
        await page.wait_for_selector("#login")
        assert await page.locator("#whoami").count() == 0
        await browser.close()


@pytest.mark.security
@pytest.mark.parametrize("where", ["callback", "claim"])
async def test_text_postgresql_cannot_hold_is_refused_on_the_record(
    provider: str, browser: Browser, db_engine: AsyncEngine, where: str
) -> None:
    """A NUL in what a visitor puts in the callback URL, or in a claim, ends in a refusal and its
    row: never a server error with no record (it was a 500)."""
    if where == "callback":  # a visitor who started a login writes their own callback URL
        state = parse_qs(urlsplit(await browser.start()).query)["state"][0]
        query = urlencode({"state": state, "error": "denied\x00"})
        status, page = await browser.callback(f"{browser.inbox.url}/auth/oidc/callback?{query}")
    else:
        await identity(provider, "nul", email="bob\x00@acme.example", countersign_tenant="acme")
        status, page = await browser.sign_in("nul")
    assert status == 403, page
    assert (await browser.me())[0] == 401
    _, _, outcome, reason = await last_attempt(db_engine)
    assert outcome == "refused" and reason is not None
    assert ("denied\ufffd" if where == "callback" else "no usable 'email' claim") in reason
