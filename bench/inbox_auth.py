"""The inbox's logins and sessions, measured on parts this script starts (a temporary PostgreSQL,
the inbox on a free port; Temporal is not involved, the client never connects):

    .venv/bin/python -m bench.inbox_auth [--samples N] [--markdown docs/benchmark.md]

- an authenticated request: `GET /api/me` with a bearer token, which costs the signature check plus
  the session row lookup (revocation, expiry, password change), the caller's rate-limit bucket
  (taken, at a rate this script sets beyond what it sends) and the roles query;
- a password login: the rate limit's queries, argon2id, the attempt and session rows;
- a wrong password, and a throttled attempt (refused before argon2).

It writes the `bench.inbox_auth` section of docs/benchmark.md (bench/sections.py).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from temporalio.client import Client

from bench import stack
from bench.sections import put_section, run_to_the_end
from bench.stats import Summary
from countersign.identity.proofs import pem_pair
from countersign.runtime.config import Settings
from countersign.server.app import running_server
from countersign.server.requesters import ApiRate
from countersign.server.throttle import ACCOUNT_FAILURES

# Every request takes from bob's bucket; past the default burst the measured requests would be 429s.
UNTHROTTLED = ApiRate(per_s=1e6, burst=1e6)


async def timed(http: aiohttp.ClientSession, method: str, url: str, expect: int, **kwargs: Any) -> float:
    """Milliseconds for one request, which must answer `expect`."""
    started = time.perf_counter()
    async with http.request(method, url, **kwargs) as response:
        await response.read()
        assert response.status == expect, (url, response.status)
    return (time.perf_counter() - started) * 1000


async def measure(samples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-inbox-auth-") as tmp:
        async with stack.postgres(Path(tmp)) as database_url:
            settings = Settings(
                database_url=database_url, approver_auth="signed", proof_private_key=pem_pair()[0]
            )
            client = await Client.connect("127.0.0.1:1", lazy=True)  # logins never ask Temporal
            async with (
                running_server(settings, "127.0.0.1", 0, client=client, rate=UNTHROTTLED) as url,
                aiohttp.ClientSession() as http,
            ):
                login = url + "/api/login"
                good = {"tenant_id": "acme", "user_id": "bob", "password": "bob-dev"}
                logins = [await timed(http, "POST", login, 200, json=good) for _ in range(samples)]
                async with http.post(login, json=good) as response:
                    token = (await response.json())["token"]
                bearer = {"Authorization": f"Bearer {token}"}
                await timed(http, "GET", url + "/api/me", 200, headers=bearer)  # warm the pool
                requests = [
                    await timed(http, "GET", url + "/api/me", 200, headers=bearer)
                    for _ in range(samples * 10)
                ]
                # carol has never logged in from here: her account locks after ACCOUNT_FAILURES
                bad = {"tenant_id": "acme", "user_id": "carol", "password": "guess"}
                wrong = [await timed(http, "POST", login, 401, json=bad) for _ in range(ACCOUNT_FAILURES)]
                throttled = [await timed(http, "POST", login, 429, json=bad) for _ in range(samples)]
    return {
        "samples": samples,
        "authenticated_request_ms": Summary.of(requests).__dict__,
        "password_login_ms": Summary.of(logins).__dict__,
        "wrong_password_ms": Summary.of(wrong).__dict__,
        "throttled_ms": Summary.of(throttled).__dict__,
    }


def markdown(result: dict[str, Any]) -> str:
    rows = [
        (
            "an authenticated request (`GET /api/me`: token, live session row, rate-limit bucket, roles)",
            "authenticated_request_ms",
        ),
        ("a password login (rate limit, argon2id, attempt and session rows)", "password_login_ms"),
        ("a wrong password (recorded, counted)", "wrong_password_ms"),
        ("a throttled attempt (429 before argon2)", "throttled_ms"),
    ]
    lines = [
        "## Inbox logins and sessions (`python -m bench.inbox_auth`)",
        "",
        "Over HTTP on one machine, PostgreSQL embedded; one request at a time.",
        "",
        "| | p50 ms | p95 ms | n |",
        "|---|---|---|---|",
    ]
    for label, key in rows:
        s = result[key]
        lines.append(f"| {label} | {s['p50']} | {s['p95']} | {s['n']} |")
    lines += [
        "",
        "Every authenticated request looks its session up in PostgreSQL (one primary-key join), so",
        "logging out, a password change or removing the user ends a session at once, in every inbox",
        "process; and takes a token from its caller's rate-limit bucket (one locked row), so a flood",
        "of requests from one person or token is refused before it does anything else. Login time is",
        "argon2id's by design; a throttled attempt skips it.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmark.md"))
    args = parser.parse_args()
    result = run_to_the_end(measure(args.samples))
    print(json.dumps(result, indent=2))
    put_section(args.markdown, "bench.inbox_auth", markdown(result))


if __name__ == "__main__":
    main()
