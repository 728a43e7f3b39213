"""Inbox sessions end for real, and failed logins are throttled: over HTTP against the served inbox
and the real PostgreSQL (the session and attempt rows it keeps), plus `starter.py logout`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.testing import WorkflowEnvironment

from countersign.db.people import hash_password
from countersign.db.schema import InboxSession, LoginAttempt, Tenant, User, UserRole
from countersign.identity.proofs import load_private_key
from countersign.runtime.config import PROJECT_ROOT
from countersign.server import watcher as approvals_watcher
from countersign.server.auth import Reviewer, issue_session
from countersign.server.throttle import ACCOUNT_FAILURES, CLIENT_FAILURES, LOCK_WAIT_S, WINDOW
from tests.fixtures.inbox import AuthInbox, ProofKeys, auth_inbox_serving

PASSWORD = "zed-secret-1"


@pytest_asyncio.fixture
async def zed(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """A reviewer of acme of the test's own (removed afterwards, with their sessions)."""
    async with db_engine.begin() as conn:
        await conn.execute(
            insert(User).values(
                tenant_id="acme", id="zed", display_name="Zed", email="zed@acme.example",
                password_hash=hash_password(PASSWORD),
            )
        )  # fmt: skip
        await conn.execute(insert(UserRole).values(tenant_id="acme", user_id="zed", role="reviewer"))
    yield "zed"
    async with db_engine.begin() as conn:
        await conn.execute(delete(User).where(User.tenant_id == "acme", User.id == "zed"))


async def login(inbox: AuthInbox, password: str = PASSWORD) -> str:
    status, body, _ = await inbox.login("zed", password)
    assert status == 200, body
    return str(body["token"])


async def me(inbox: AuthInbox, token: str) -> int:
    status, _, _ = await inbox.call("GET", "/api/me", token)
    return status


# --- sessions end ---------------------------------------------------------------------------------


async def test_logout_revokes_the_session_server_side(auth_inbox: AuthInbox, zed: str) -> None:
    token, other = await login(auth_inbox), await login(auth_inbox)
    status, body, _ = await auth_inbox.call("GET", "/api/me", token)
    assert (status, body["user_id"], body["roles"]) == (200, "zed", ["reviewer"])
    status, _, headers = await auth_inbox.call("POST", "/api/logout", token, {})
    assert status == 200 and "countersign_session=" in headers.get("Set-Cookie", "")
    # the same token, kept by someone (a copied cookie, the CLI's file), no longer works anywhere
    assert await me(auth_inbox, token) == 401
    assert (await auth_inbox.call("POST", "/api/logout", token, {}))[0] == 401
    # the page does not take it either: it shows the login form
    async with aiohttp.ClientSession(cookies={"countersign_session": token}) as http:
        page = await (await http.get(auth_inbox.url + "/")).text()
    assert 'id="login"' in page and "Signed in as" not in page
    assert await me(auth_inbox, other) == 200  # another session of the same person is its own
    async with auth_inbox.engine.connect() as conn:
        revoked = await conn.scalar(
            select(InboxSession.revoked_at)
            .where(InboxSession.user_id == "zed")
            .order_by(InboxSession.created_at)
        )
    assert revoked is not None


async def test_a_password_change_ends_every_earlier_session(auth_inbox: AuthInbox, zed: str) -> None:
    token = await login(auth_inbox)
    async with auth_inbox.engine.begin() as conn:
        await conn.execute(
            update(User)
            .where(User.tenant_id == "acme", User.id == "zed")
            .values(password_hash=hash_password("new-one"))
        )
    assert await me(auth_inbox, token) == 401
    assert (await auth_inbox.login("zed", PASSWORD))[0] == 401
    assert await me(auth_inbox, await login(auth_inbox, "new-one")) == 200


async def test_removing_the_user_ends_their_sessions(auth_inbox: AuthInbox, zed: str) -> None:
    token = await login(auth_inbox)
    async with auth_inbox.engine.begin() as conn:
        await conn.execute(delete(User).where(User.tenant_id == "acme", User.id == "zed"))
        left = await conn.scalar(text("SELECT count(*) FROM inbox_sessions WHERE user_id = 'zed'"))
    assert left == 0  # ON DELETE CASCADE
    assert await me(auth_inbox, token) == 401


async def test_deactivating_the_user_ends_their_sessions_and_logins(auth_inbox: AuthInbox, zed: str) -> None:
    token = await login(auth_inbox)
    async with auth_inbox.engine.begin() as conn:
        await conn.execute(
            update(User).where(User.tenant_id == "acme", User.id == "zed").values(deactivated_at=func.now())
        )
    assert await me(auth_inbox, token) == 401
    assert (await auth_inbox.login("zed", PASSWORD))[0] == 401


async def test_an_expired_session_is_refused_though_its_token_is_not(auth_inbox: AuthInbox, zed: str) -> None:
    token = await login(auth_inbox)
    async with auth_inbox.engine.begin() as conn:
        await conn.execute(
            update(InboxSession).where(InboxSession.user_id == "zed").values(expires_at=datetime.now(UTC))
        )
    assert await me(auth_inbox, token) == 401


async def test_a_signed_token_without_its_session_row_is_refused(
    auth_inbox: AuthInbox, zed: str, proof_keys: ProofKeys
) -> None:
    """Signed with the inbox's own key, unexpired: still nothing without a live session row."""
    forged = issue_session(
        load_private_key(proof_keys.private),
        Reviewer(tenant_id="acme", user_id="zed"),
        datetime.now(UTC),
        "x",
    )
    assert await me(auth_inbox, forged) == 401
    # a live session's id under another user's name
    token = await login(auth_inbox)
    async with auth_inbox.engine.connect() as conn:
        sid = await conn.scalar(select(InboxSession.id).where(InboxSession.user_id == "zed"))
    assert sid is not None and await me(auth_inbox, token) == 200
    as_bob = issue_session(
        load_private_key(proof_keys.private),
        Reviewer(tenant_id="acme", user_id="bob"),
        datetime.now(UTC),
        sid,
    )
    assert await me(auth_inbox, as_bob) == 401


@pytest.mark.devserver
async def test_the_events_stream_closes_when_the_session_is_revoked(
    auth_dev_inbox: AuthInbox, zed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth_inbox = auth_dev_inbox
    monkeypatch.setattr(approvals_watcher, "KEEPALIVE_S", 0.3)
    token = await login(auth_inbox)
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(auth_inbox.url + "/api/events", headers=headers) as stream,
    ):
        first = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 10)
        assert first.startswith(b"event: approvals")
        assert (await auth_inbox.call("POST", "/api/logout", token, {}))[0] == 200
        rest = await asyncio.wait_for(stream.content.read(), 10)  # returns once the server closes it
    assert b"event: approvals" not in rest
    async with (
        aiohttp.ClientSession() as http,
        http.get(auth_inbox.url + "/api/events", headers=headers) as again,
    ):
        assert again.status == 401


async def test_starter_logout_revokes_the_cli_session(
    auth_inbox: AuthInbox, zed: str, tmp_path: Path
) -> None:
    session_file = tmp_path / "session.json"
    env = {**os.environ, "COUNTERSIGN_SESSION_FILE": str(session_file), "APPROVER_AUTH": "signed"}

    def starter(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(PROJECT_ROOT / "starter.py"), *args],
            cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    logged_in = await asyncio.to_thread(
        starter, "login", "--tenant", "acme", "--as", "zed", "--password", PASSWORD, "--inbox", auth_inbox.url
    )
    assert logged_in.returncode == 0, logged_in.stderr
    token = json.loads(session_file.read_text())["token"]
    assert await me(auth_inbox, token) == 200
    out = await asyncio.to_thread(starter, "logout")
    assert out.returncode == 0, out.stderr
    assert "logged out zed (acme)" in out.stdout and not session_file.exists()
    assert await me(auth_inbox, token) == 401
    again = await asyncio.to_thread(starter, "logout")
    assert again.returncode == 0 and "not logged in" in again.stdout
    # a session already ended elsewhere (the page's Log out): the CLI forgets it all the same
    relogged = await asyncio.to_thread(
        starter, "login", "--tenant", "acme", "--as", "zed", "--password", PASSWORD, "--inbox", auth_inbox.url
    )
    assert relogged.returncode == 0, relogged.stderr
    kept = json.loads(session_file.read_text())["token"]
    assert (await auth_inbox.call("POST", "/api/logout", kept, {}))[0] == 200
    # deciding with it says the session ended and how to log in again
    ended_approve = await asyncio.to_thread(starter, "approve", "conv-acme-x", "c1", "--as", "zed")
    assert ended_approve.returncode != 0
    assert "the session of zed (acme) has ended" in ended_approve.stderr
    assert "starter.py login --tenant acme --as zed" in ended_approve.stderr
    ended = await asyncio.to_thread(starter, "logout")
    assert ended.returncode == 0 and "logged out zed" in ended.stdout and not session_file.exists()


# --- failed logins are throttled ---------------------------------------------------------------------


async def attempts(engine: AsyncEngine, user: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.scalars(
            select(LoginAttempt.outcome).where(LoginAttempt.user_id == user).order_by(LoginAttempt.id)
        )
        return list(rows)


async def age_attempts(engine: AsyncEngine, by: object = WINDOW) -> None:
    """As if WINDOW had passed since every attempt so far."""
    async with engine.begin() as conn:
        await conn.execute(update(LoginAttempt).values(created_at=LoginAttempt.created_at - by))


async def test_repeated_wrong_passwords_lock_the_account_for_a_bounded_window(
    auth_inbox: AuthInbox, zed: str
) -> None:
    for _ in range(ACCOUNT_FAILURES):
        status, body, _ = await auth_inbox.login("zed", "guess")
        assert status == 401, body
    # now even the right password is not checked: 429 with when to come back
    status, body, headers = await auth_inbox.login("zed", PASSWORD)
    assert status == 429 and "too many failed logins for this account" in body["error"]
    first_wait = int(headers["Retry-After"])
    assert 0 < first_wait <= WINDOW.total_seconds()
    # hammering the locked account does not extend the lock
    for _ in range(3):
        status, _, headers = await auth_inbox.login("zed", "guess")
        assert status == 429 and int(headers["Retry-After"]) <= first_wait
    assert (
        await attempts(auth_inbox.engine, "zed") == ["bad_credentials"] * ACCOUNT_FAILURES + ["throttled"] * 4
    )
    # once the failures leave the window, the right password works again
    await age_attempts(auth_inbox.engine)
    await login(auth_inbox)


async def test_a_login_stuck_holding_the_account_does_not_hang_the_next(
    auth_inbox: AuthInbox, zed: str
) -> None:
    """Logins to one account are serialised; one that never finishes (here: a transaction holding
    the account's lock) makes the next answer 429 after a bounded wait, recorded, not hang."""
    async with auth_inbox.engine.connect() as stuck, stuck.begin():
        await stuck.execute(text("SELECT pg_advisory_xact_lock(hashtext('login:acme/zed'))"))
        status, body, headers = await asyncio.wait_for(auth_inbox.login("zed", PASSWORD), LOCK_WAIT_S * 4)
        assert status == 429 and "another login to it is under way" in body["error"], body
        assert int(headers["Retry-After"]) == LOCK_WAIT_S
    assert await attempts(auth_inbox.engine, "zed") == ["throttled"]
    await login(auth_inbox)  # the lock gone, the right password works


async def test_an_address_the_user_logged_in_from_is_not_locked_out_by_guesses(
    auth_inbox: AuthInbox, zed: str
) -> None:
    """Someone else guessing zed's password does not lock zed out of the machine zed uses."""
    await login(auth_inbox)
    for _ in range(ACCOUNT_FAILURES + 2):
        assert (await auth_inbox.login("zed", "guess"))[0] == 401
    await login(auth_inbox)


async def test_repeated_failures_from_one_address_are_throttled_across_accounts(
    auth_inbox: AuthInbox, zed: str
) -> None:
    for n in range(CLIENT_FAILURES):
        status, _, _ = await auth_inbox.login(f"nobody{n}", "guess")
        assert status == 401
    status, body, headers = await auth_inbox.login("zed", PASSWORD)
    assert status == 429 and "for this address" in body["error"] and int(headers["Retry-After"]) > 0
    async with auth_inbox.engine.connect() as conn:
        recorded = await conn.scalar(
            select(LoginAttempt.reason).where(
                LoginAttempt.user_id == "zed", LoginAttempt.outcome == "throttled"
            )
        )
    assert recorded is not None and "address" in recorded
    await age_attempts(auth_inbox.engine)
    await login(auth_inbox)


async def test_behind_a_trusted_proxy_the_forwarded_address_is_counted(
    temporal_env: WorkflowEnvironment, database_url: str, db_engine: AsyncEngine, proof_keys: ProofKeys,
    auth_inbox: AuthInbox, zed: str,
) -> None:  # fmt: skip
    """One guessing client behind the proxy does not lock out everyone else behind it; a client
    talking to the inbox directly cannot pick its address with the header."""
    guesser, colleague = {"X-Forwarded-For": "203.0.113.7"}, {"X-Forwarded-For": "203.0.113.8, 127.0.0.1"}
    async with auth_inbox_serving(
        temporal_env.client, database_url, db_engine, proof_keys, trusted_proxies=frozenset({"127.0.0.1"})
    ) as proxied:
        for n in range(CLIENT_FAILURES):
            assert (await proxied.login(f"nobody{n}", "guess", headers=guesser))[0] == 401
        assert (await proxied.login("zed", PASSWORD, headers=guesser))[0] == 429
        assert (await proxied.login("zed", PASSWORD, headers=colleague))[0] == 200
        async with db_engine.connect() as conn:
            clients = set(
                await conn.scalars(select(LoginAttempt.client).where(LoginAttempt.user_id == "zed"))
            )
        assert clients == {"203.0.113.7", "203.0.113.8"}
    # not trusted: the header is ignored, every failure counts against the TCP peer
    for n in range(CLIENT_FAILURES):
        spoofed = {"X-Forwarded-For": f"198.51.100.{n}"}
        assert (await auth_inbox.login(f"nobody{n}", "guess", headers=spoofed))[0] == 401
    assert (await auth_inbox.login("zed", PASSWORD, headers={"X-Forwarded-For": "198.51.100.200"}))[0] == 429


def inbox_command(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "starter.py"), "inbox", *args],
        cwd=PROJECT_ROOT, env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


async def test_inbox_password_sets_it_and_ends_earlier_sessions(
    auth_inbox: AuthInbox, zed: str, database_url: str
) -> None:
    token = await login(auth_inbox)

    def starter(*args: str) -> subprocess.CompletedProcess[str]:
        return inbox_command(database_url, "password", *args)

    short = await asyncio.to_thread(starter, "--tenant", "acme", "--as", "zed", "--password", "short")
    assert short.returncode != 0 and "8 to 1000 characters" in short.stderr
    nobody = await asyncio.to_thread(
        starter, "--tenant", "globex", "--as", "zed", "--password", "long enough"
    )
    assert nobody.returncode != 0 and "no user 'zed' in tenant 'globex'" in nobody.stderr
    assert await me(auth_inbox, token) == 200
    done = await asyncio.to_thread(starter, "--tenant", "acme", "--as", "zed", "--password", "long enough")
    assert done.returncode == 0, done.stderr
    assert await me(auth_inbox, token) == 401
    assert await me(auth_inbox, await login(auth_inbox, "long enough")) == 200


async def test_inbox_webhook_sets_and_clears_the_tenants_url(
    database_url: str, db_engine: AsyncEngine
) -> None:
    """The UPDATE helper `inbox password` shares with `inbox webhook`."""
    url = "https://hooks.example.com/T1"
    try:
        done = await asyncio.to_thread(inbox_command, database_url, "webhook", "--tenant", "globex", url)
        assert done.returncode == 0 and "globex: webhook set" in done.stdout, done.stderr
        assert url not in done.stdout + done.stderr  # the URL is the secret: never printed back
        async with db_engine.connect() as conn:  # stored sealed, like the chat channels' secrets
            stored = await conn.scalar(text("SELECT webhook_url FROM tenants WHERE id = 'globex'"))
            assert stored.startswith("gAAAAA") and url not in stored, stored
            assert await conn.scalar(select(Tenant.webhook_url).where(Tenant.id == "globex")) == url
        missing = await asyncio.to_thread(inbox_command, database_url, "webhook", "--tenant", "nope", url)
        assert missing.returncode != 0 and "no tenant 'nope'" in missing.stderr
    finally:
        cleared = await asyncio.to_thread(
            inbox_command, database_url, "webhook", "--tenant", "globex", "--clear"
        )
    assert cleared.returncode == 0 and "globex: webhook cleared" in cleared.stdout
