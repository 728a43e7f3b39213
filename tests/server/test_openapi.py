"""The server's OpenAPI document (countersign/server/openapi.py), and schemathesis fuzzing the live
server from it: every operation, signed in as a requester (alice), a reviewer (bob) and an admin
(carol) of acme, each with inputs that fit the document and inputs that do not. No answer may be a
5xx, every answer must fit the document (a refusal: the `{"error": …}` envelope), and no refusal may
name an exception class, show a traceback or SQL.

The fuzz writes whatever a valid request may write (a policy set, a channel, a sender, tiers, a
conversation's end), so it runs on a database of its own, made and dropped here beside the worker's
seeded one: the files sharing the worker's database never see what it did.

Bounded for `make test` (a few examples per operation and person, seeded: the same inputs every run);
COUNTERSIGN_FUZZ_EXAMPLES=N runs N per operation and mode (docs/how-to/tests.md).
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import response_schema_conformance
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.engine import create_engine
from countersign.devstack.postgres import migrate_and_seed
from countersign.devstack.temporal import DevServerConfig
from countersign.scripted_model.server import ScriptedModelServer
from countersign.server import openapi
from tests.fixtures.inbox import AuthInbox, ProofKeys, SignedStack, signed_dev_stack
from tests.fixtures.smtp import SmtpServer

EXAMPLES = int(os.environ.get("COUNTERSIGN_FUZZ_EXAMPLES") or 2)
PEOPLE = ("alice", "bob", "carol")  # a requester, a reviewer, an admin (the seed's roles)
STREAMS = {"/api/events", "/api/conversations/{workflow_id}/events"}  # never end: not fuzzed
LAST = ("POST", "/api/logout")  # revokes the session the rest is fuzzed with: after the rest
# What a refusal may not show: an exception's class, a traceback, SQL or the database's driver.
LEAKS = re.compile(
    r"Traceback|File \"|\b[A-Z]\w*(Error|Exception)\b|sqlalchemy|asyncpg|psycopg|\bSQLSTATE\b"
    r"|\b(SELECT|INSERT|UPDATE|DELETE)\b.+\b(FROM|INTO|SET|WHERE)\b"
)


class LeakedInternals(Failure):
    """A refusal's body names the server's insides."""

    code = "CS001"
    checks = ("no_leaked_internals",)


@schemathesis.check
def no_leaked_internals(
    ctx: Any, response: schemathesis.Response, case: schemathesis.Case[Any]
) -> bool | None:
    if response.status_code >= 400 and LEAKS.search(response.text):
        raise LeakedInternals(
            operation=case.operation.label,
            title="A refusal names the server's insides",
            message=f"{response.status_code}: {response.text[:300]}",
        )
    return None


CHECKS = [not_a_server_error, response_schema_conformance, no_leaked_internals]


@pytest_asyncio.fixture
async def fuzz_stack(
    dev_server: DevServerConfig,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
    smtp_server: SmtpServer,
    proof_keys: ProofKeys,
) -> AsyncIterator[SignedStack]:
    """The signed-mode worker and server on the dev server, on a seeded database of their own."""
    name = f"fuzz_{uuid.uuid4().hex[:12]}"
    autocommit = db_engine.execution_options(isolation_level="AUTOCOMMIT")
    async with autocommit.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(database_url).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        await migrate_and_seed(url)
        with pytest.MonkeyPatch.context() as env:
            # every request of the fuzz is one caller's: the per-person rate would answer most with 429
            env.setenv("COUNTERSIGN_API_RATE_PER_S", "1000")
            env.setenv("COUNTERSIGN_API_RATE_BURST", "1000")
            async with signed_dev_stack(
                dev_server, url, engine, scripted_model, smtp_server, proof_keys
            ) as stack:
                yield stack
    finally:
        await engine.dispose()
        async with autocommit.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def bounded(case: schemathesis.Case[Any]) -> None:
    """A reply is waited for `wait` seconds (30 when not given): a fuzzed wait stays under one."""
    if not case.operation.path.endswith("/reply"):
        return
    try:
        long = float(case.query.get("wait", 30)) > 1 if case.query else True
    except (TypeError, ValueError):
        long = False
    if long:
        case.query = {**(case.query or {}), "wait": 0.5}


def fuzz_operation(
    operation: Any, mode: GenerationMode, http: requests.Session, person: str, pinned: dict[str, str]
) -> str | None:
    """Run `operation` EXAMPLES times in `mode` with `pinned` path parameters; the failure, if any.
    The inputs are the same every run, and differ between operations, modes and people (a seed of
    their names), so three people's few examples are three times as many inputs."""
    strategy = operation.as_strategy(mode, path_parameters=pinned or None)

    @settings(
        max_examples=EXAMPLES,
        derandomize=False,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )
    @seed(zlib.crc32(f"{operation.label} {mode.value} {person}".encode()))
    @given(strategy)
    def run(case: schemathesis.Case[Any]) -> None:
        bounded(case)
        response = case.call(session=http, timeout=30)
        case.validate_response(response, checks=CHECKS)

    try:
        run()
    except Unsatisfiable:  # nothing to send wrong: the operation has no parameters and no body
        return None
    except (Exception, BaseExceptionGroup) as err:  # schemathesis' failures (a group), hypothesis' own
        return f"{operation.label} ({mode.value}): {err}"
    return None


def fuzz(document: dict[str, Any], base_url: str, person: str, token: str, workflow_id: str) -> list[str]:
    """Every operation of `document` but the streams, fuzzed as `person` (`token`); logout last."""
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=base_url)
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):  # an operation schemathesis cannot read: the document is wrong
            raise result.err()
        operations.append(result.ok())
    operations.sort(key=lambda op: (op.method.upper(), op.path) == LAST)
    failures = []
    http = requests.Session()  # one connection for the lot
    http.headers["Authorization"] = f"Bearer {token}"
    for operation in operations:
        if operation.path in STREAMS:
            continue
        names = {p.name for p in operation.path_parameters}
        for mode, pinned in (
            (GenerationMode.POSITIVE, {"workflow_id": workflow_id} if "workflow_id" in names else {}),
            (GenerationMode.NEGATIVE, {}),
        ):
            failure = fuzz_operation(operation, mode, http, person, pinned)
            if failure is not None:
                failures.append(failure)
    return failures


async def document_of(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(url + openapi.PATH) as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def test_the_document_is_openapi_31_and_describes_every_api_route(auth_dev_inbox: AuthInbox) -> None:
    document = await document_of(auth_dev_inbox.url)  # no sign-in needed
    validate(document)  # raises on anything OpenAPI 3.1 does not allow
    assert document["openapi"] == "3.1.0"
    schemathesis.openapi.from_dict(document)  # and the fuzzer reads it
    undescribed = [
        (m, p)
        for p, ops in document["paths"].items()
        for m, op in ops.items()
        if op["tags"] == [openapi.UNDESCRIBED]
    ]
    assert undescribed == [], "routes of the server that openapi.OPERATIONS does not describe"
    assert "/api/conversations/{workflow_id}/ratings/{turn}" in document["paths"]
    start = document["paths"]["/api/conversations"]["post"]
    assert start["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/StartBody"
    }
    assert document["components"]["schemas"]["StartBody"]["additionalProperties"] is False


async def test_the_fuzz_reports_an_answer_that_does_not_fit_the_document(auth_dev_inbox: AuthInbox) -> None:
    """The fuzz can fail: a document that says `GET /api/openapi.json` answers an integer (the
    server answers an object) is reported, naming the operation, and the one that says an object
    is not (each check's failure surfaces; none is swallowed on the way)."""
    document = await document_of(auth_dev_inbox.url)
    _, signed_in, _ = await auth_dev_inbox.login("bob", "bob-dev")
    operation = document["paths"][openapi.PATH]["get"]
    answer = operation["responses"]["200"]["content"]["application/json"]
    alone = {**document, "paths": {openapi.PATH: {"get": operation}}}
    assert await asyncio.to_thread(fuzz, alone, auth_dev_inbox.url, "bob", signed_in["token"], "") == []
    answer["schema"] = {"type": "integer"}
    failures = await asyncio.to_thread(fuzz, alone, auth_dev_inbox.url, "bob", signed_in["token"], "")
    assert failures and all(f.startswith(f"GET {openapi.PATH} (") for f in failures), failures
    assert "Response violates schema" in failures[0], failures[0]


async def test_fuzzing_every_route_as_each_role_finds_no_5xx_no_misfit_and_no_leak(
    fuzz_stack: SignedStack,
) -> None:
    # all signed in first: the fuzz's failed logins soon close the address' login (429)
    tokens = {person: await fuzz_stack.login(person) for person in PEOPLE}
    status, started = await fuzz_stack.call(
        "POST", "/api/conversations", tokens["alice"], {"agent": "lead-qualifier"}
    )
    assert status == 201, started
    document = await document_of(fuzz_stack.url)
    failures = []
    for person, token in tokens.items():
        failures += await asyncio.to_thread(
            fuzz, document, fuzz_stack.url, person, token, started["workflow_id"]
        )
    assert not failures, "\n\n".join(failures)
