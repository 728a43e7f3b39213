"""What a reviewer sees is what runs; nothing from outside fails a workflow task; a tool has one
identity; the smaller residue (issue 26, classes 3, 4, 6 and 7; docs/explanation/security.md).

Property tests generate each class against the real parts (the time-skipping Temporal server, the
real worker, PostgreSQL, the scripted model over HTTP, the MCP test server over HTTP):

3. A key twice in one JSON object — in the model's arguments of any tool, in an approver's edit, in
   any payload — is refused before anyone is asked; reviewers read the parsed arguments one key per
   line, hidden characters written out, look-alike addresses and bidi flagged.
4. Lone surrogates, NUL and other text in every tool's arguments (and in its name): no workflow
   task fails, every call is audited, nothing unencodable is run or sent for approval.
6. Two servers whose tools would share a flat name: neither is offered, `mcp add` refuses it.
7. Limits of 0, a model reply over the bound.

    WHAT_RUNS_EXAMPLES=200 .venv/bin/python -m pytest tests/e2e/test_what_runs.py -q --timeout=0
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import delete
from sqlalchemy import text as sql
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.common import RawValue

from activities.model import MAX_REPLY_BYTES
from activities.notifications import wording
from countersign.core.approvals import ApprovalNotice, Decision
from countersign.core.bounds import Unreadable, loads_bounded
from countersign.core.contract import EndConversation, Limits
from countersign.core.saga import RollbackRequest
from countersign.core.shown import argument_lines, argument_warnings, is_hidden
from countersign.db.engine import session_factory
from countersign.db.schema import McpServer
from countersign.identity.proofs import args_digest
from countersign.mcp.servers import SERVER_NAME, ServerConfig, clashes, server_of, tool_name
from countersign.mcp.snapshot import mcp_specs
from countersign.runtime.payloads import data_converter
from countersign.server.http import HttpRefusal
from countersign.server.inbox import Decidable, Page
from countersign.server.watcher import MAX_STREAMS_PER_SESSION, Watcher
from tests.e2e.test_compromised_model import (  # noqa: F401 (a fixture)
    acme_restored,
    audit_rows,
    script_turn,
)
from tests.e2e.test_hostile_input import AGENT_OF, MCP_FIELDS, eventually
from tests.fixtures.agent import AgentHarness
from tests.fixtures.mcp import (
    TOKEN,
    HttpServer,
    McpSuite,
    check_ledger,
    http_config,
    make_pool,
    register,
    unregister,
)
from tests.fixtures.temporal import failed_tasks
from tests.fixtures.updates import execute_update
from tests.workflows.test_saga import WRITES, clean, make_agent  # noqa: F401 (a fixture)
from tools.arguments import load_arguments
from tools.registry import REGISTRY, ToolFailure
from workflows.agent import AgentWorkflow

EXAMPLES = int(os.environ.get("WHAT_RUNS_EXAMPLES", "4"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PURE = settings(max_examples=max(EXAMPLES * 25, 200), deadline=None, database=None)
LIMITS = Limits(max_tool_calls=4, approval_timeout_s=60, answer_timeout_s=60)
FIELDS = {name: sorted(tool.args_model.model_fields) or ["x"] for name, tool in REGISTRY.items()} | MCP_FIELDS


def raw(json_text: str) -> RawValue:
    """A payload of exactly these bytes (ASCII escapes kept): what a hostile client can send."""
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=json_text.encode()))


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=12))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def with_key_twice(draw: st.DrawFn, keys: list[str] | None = None) -> str:
    """JSON object text in which one object (the top, or one nested in it) names a key twice."""
    key = draw(st.sampled_from(keys) if keys else st.text(max_size=8))
    first, last = draw(json_value), draw(json_value)
    others = draw(st.dictionaries(st.text(max_size=6).filter(lambda k: k != key), json_value, max_size=3))
    members = [json.dumps(key) + ": " + json.dumps(first)]
    members += [json.dumps(k) + ": " + json.dumps(v) for k, v in others.items()]
    members.insert(draw(st.integers(1, len(members))), json.dumps(key) + ": " + json.dumps(last))
    obj = "{" + ", ".join(members) + "}"
    if draw(st.booleans()):  # nested one level down, under a key of the tool's
        outer = draw(st.sampled_from(keys) if keys else st.text(max_size=6))
        return "{" + json.dumps(outer) + ": " + obj + "}"
    return obj


# --- class 3: what the reviewer sees is what runs -----------------------------------------------


@PURE
@given(text=with_key_twice())
@example(
    text='{"to": "jane.doe@example.com", "subject": "s", "body": "' + "b" * 1500 + '", '
    '"to": "attacker@evil.example"}'
)
def test_a_key_twice_is_refused_by_every_parse_of_outside_json(text: str) -> None:
    """The bounded parse (model arguments, MCP arguments), the payload converter (edits and every
    signal or update), and the digest a proof binds (never the digest of either reading)."""
    value, refusal = loads_bounded(text)
    assert value is None and refusal is not None and "more than once" in refusal
    with pytest.raises(ToolFailure, match="more than once"):
        load_arguments(text)
    payload = '{"call_id": "c1", "decision": "approve", "approver": "bob", "args": ' + text + "}"
    (decoded,) = data_converter.payload_converter.from_payloads(
        [raw(payload).payload],
        [Decision | Unreadable],  # type: ignore[list-item]
    )
    assert isinstance(decoded, Unreadable) and "more than once" in decoded.unreadable
    last_wins = json.loads(text)
    assert args_digest(text) != args_digest(last_wins)


@pytest.mark.security
@pytest.mark.usefixtures("acme_restored")
@PROPERTY
@given(
    tool=st.sampled_from(sorted(REGISTRY) + sorted(MCP_FIELDS)),
    data=st.data(),
)
@example(tool="send_email", data=None)
async def test_a_model_call_with_a_key_twice_is_refused_before_any_reviewer_sees_it(
    agent_with_mcp: AgentHarness, db_engine: AsyncEngine, mcp_suite: McpSuite, tool: str, data: Any
) -> None:
    agent = agent_with_mcp
    mcp_suite.reset()
    if data is None:  # the email: Jane's address shown first, the attacker's last
        text = (
            '{"lead": "Jane Doe", "to": "jane.doe@example.com", "subject": "Hello", "body": "'
            + "b" * 1500
            + '", "to": "attacker@evil.example"}'
        )
    else:
        text = data.draw(with_key_twice(FIELDS[tool]))
    script_turn(agent, [(tool, text)])
    handle = await agent.start("Do it.", agent=AGENT_OF[tool], single_turn=True, limits=LIMITS)
    await asyncio.wait_for(handle.result(), timeout=120)
    assert await failed_tasks(handle) == []
    (row,) = await audit_rows(db_engine, handle.id)
    assert row.outcome in ("invalid", "blocked"), row  # never "expired": no reviewer was asked
    if row.outcome == "invalid":
        assert "more than once" in row.result["error"]["message"], row.result
    check_ledger(mcp_suite, handle.id, [row])
    assert mcp_suite.calls_of(handle.id) == []


@pytest.mark.security
async def test_an_approvers_edit_with_a_key_twice_or_a_lone_surrogate_is_refused_on_the_record(
    agent_with_mcp: AgentHarness, db_engine: AsyncEngine, mcp_suite: McpSuite
) -> None:
    """The edit that would run the last `key` while its sender's parser read the first, and one
    holding text no server can receive: each refused with a record, the call still waits."""
    agent = agent_with_mcp
    mcp_suite.reset()
    agent.script(
        {
            "reply": {
                "tool_calls": [{"name": "mcp__web__write", "arguments": {"key": "k\u202e", "value": "v"}}]
            }
        },
        {"when": {"after_tool": "mcp__web__write"}, "reply": {"content": "done"}},
    )
    handle = await agent.start("Store it.", agent="lead-qualifier", single_turn=True, limits=LIMITS)
    deadline = asyncio.get_running_loop().time() + 60
    while not (status := await handle.query("status"))["pending_approvals"]:
        assert asyncio.get_running_loop().time() < deadline, status
        await asyncio.sleep(0.05)
    edits = ['{"key": "shown", "value": "v", "key": "runs"}', '{"key": "\\ud800", "value": "v"}']
    for edit in edits:
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                "decide",
                raw(f'{{"call_id": "c1", "decision": "approve", "approver": "bob", "args": {edit}}}'),
            )
    assert await eventually(db_engine, handle.id, len(edits)) == len(edits)
    assert (await handle.query("status"))["pending_approvals"], "a refused edit decides nothing"
    await handle.execute_update("decide", {"call_id": "c1", "decision": "reject", "approver": "bob"})
    await asyncio.wait_for(handle.result(), timeout=120)
    assert await failed_tasks(handle) == []
    assert mcp_suite.calls_of(handle.id) == []


# Look-alikes and hidden characters a model (or an injection) can put in an address or a name.
HIDDEN = ["\u202e", "\u202d", "\u2066", "\u2067", "\u2069", "\u200b", "\u200d", "\ufeff", "\u00ad", "\u061c"]
LOOK_ALIKES = ["\u0430", "\u0435", "\u043e", "\u0440", "\u0441", "\u0455", "\u03bf", "\u0391", "\uff45"]


@st.composite
def deceptive_arguments(draw: st.DrawFn) -> tuple[dict[str, Any], set[str], set[str]]:
    """(arguments, keys holding a hidden character, keys holding an address with a look-alike)."""
    args: dict[str, Any] = {}
    hidden: set[str] = set()
    looks: set[str] = set()
    for i in range(draw(st.integers(1, 5))):
        key = f"k{i}"
        local, domain = (
            draw(st.sampled_from(["jane.doe", "bob", "x"])),
            draw(st.sampled_from(["example.com", "evil.example"])),
        )
        value = draw(
            st.sampled_from([f"{local}@{domain}", f"https://{domain}/p", f"{domain}", "plain words here"])
        )
        if value != "plain words here" and draw(st.booleans()):
            at = draw(st.sampled_from([i for i, c in enumerate(value) if c in "aeopcs"]))
            value = value[:at] + draw(st.sampled_from(LOOK_ALIKES)) + value[at + 1 :]
            looks.add(key)
        if draw(st.booleans()):
            at = draw(st.integers(0, len(value)))
            value = value[:at] + draw(st.sampled_from(HIDDEN)) + value[at:]
            hidden.add(key)
        args[key] = value
    if draw(st.booleans()):
        args["n"] = draw(st.integers())
    return args, hidden, looks


@PURE
@given(case=deceptive_arguments())
@example(case=({"to": "jane.doe@ex\u0430mple.com", "subject": "hi \u202eevil"}, {"subject"}, {"to"}))
def test_a_reviewer_reads_one_key_per_line_with_every_deception_flagged(
    case: tuple[dict[str, Any], set[str], set[str]],
) -> None:
    """The lines are the parsed arguments, one per key, with no character that hides itself; each
    hidden character and each non-ASCII address is named in a warning; notices say the same."""
    args, hidden, looks = case
    text = json.dumps(args, ensure_ascii=bool(len(args) % 2))
    lines = argument_lines(text)
    assert [line.split(": ", 1)[0] for line in lines] == list(args)
    assert not any(is_hidden(c) for line in lines for c in line)
    for key, line in zip(args, lines, strict=True):
        assert json.loads(line.split(": ", 1)[1].replace("⟨U+", "\\u").replace("⟩", "")) == args[key] or (
            key in hidden
        )
    warnings = argument_warnings(text)
    for key in hidden:
        assert any(w.startswith(f"{key}: invisible") for w in warnings), (key, warnings)
    for key in looks:
        assert any(w.startswith(f"{key}: non-ASCII") or "mixes scripts" in w for w in warnings), (
            key,
            warnings,
        )
    assert not any(w.split(":")[0] not in hidden | looks for w in warnings), warnings
    notice = ApprovalNotice(
        tenant_id="acme",
        workflow_id="wf",
        call_id="c1",
        tool="send_email",
        args=text,
        risk="high",
        requested_by="alice",
        expires_at=datetime.now(UTC),
        kind="request",
    )
    _, body = wording(notice, "http://inbox", None)
    assert all(line[:500] in body for line in lines) and all(w in body for w in warnings)
    assert not any(is_hidden(c) for c in body if c != "\n")


# --- class 4: nothing from outside fails a workflow task ---------------------------------------

UNENCODABLE = st.sampled_from(
    ["\ud800", "\udfff", "\udc00x", "a\ud83d", "\x00", "x\x00\ud800", "\ufffe", "\u202e"]
)
hostile_text = st.builds(lambda a, b, c: a + b + c, st.text(max_size=4), UNENCODABLE, st.text(max_size=4))


@st.composite
def unencodable_turn(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    """(agent, its model's calls): every argument of 1-3 calls of one tool holds a lone surrogate, a
    NUL or another odd character (ASCII-escaped on the wire, as a model sends them); sometimes a key
    too, sometimes the tool's name."""
    tool = draw(st.sampled_from(sorted(REGISTRY) + sorted(MCP_FIELDS)))
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        args: dict[str, Any] = {f: draw(hostile_text) for f in FIELDS[tool] if draw(st.booleans())}
        if draw(st.integers(0, 4)) == 0:
            args[draw(hostile_text)] = "v"
        # a name holding NUL or bidi (the model activity makes a name's lone surrogates U+FFFD)
        name = tool if draw(st.integers(0, 5)) else tool + draw(st.sampled_from(["\x00", "\u202e", "\ufffe"]))
        calls.append((name, json.dumps(args)))
    return AGENT_OF[tool], calls


def unencodable(text: str) -> bool:
    value = json.loads(text)
    strings = [*value.keys(), *(v for v in value.values() if isinstance(v, str))]
    return any("\x00" in s or any(0xD800 <= ord(c) <= 0xDFFF for c in s) for s in strings)


@pytest.mark.security
@pytest.mark.usefixtures("acme_restored")
@PROPERTY
@given(turn=unencodable_turn())
@example(turn=("lead-qualifier", [("get_lead", '{"lead": "\\ud800"}')]))
@example(turn=("operations", [("create_task", '{"title": "\\ud800 t"}')]))
@example(
    turn=(
        "lead-qualifier",
        [("mcp__web__echo", '{"text": "\\udfff"}'), ("mcp__web__write", '{"key": "\\ud800", "value": "v"}')],
    )
)
@example(turn=("lead-qualifier", [("get_lead\x00", '{"lead": "Jane"}')]))
async def test_unencodable_text_in_any_tools_arguments_fails_no_workflow_task(
    agent_with_mcp: AgentHarness,
    db_engine: AsyncEngine,
    mcp_suite: McpSuite,
    turn: tuple[str, list[tuple[str, str]]],
) -> None:
    """Always-allowed calls go to the activity summary and the tool; the others to the argument
    check and, valid, to a reviewer: either way the conversation completes, its queries answer,
    each call has its audit row, and nothing holding a lone surrogate or a NUL ran or waited."""
    agent, (agent_name, calls) = agent_with_mcp, turn
    mcp_suite.reset()
    script_turn(agent, calls)  # type: ignore[arg-type]
    handle = await agent.start("Do it.", agent=agent_name, single_turn=True, limits=LIMITS)
    await asyncio.wait_for(handle.result(), timeout=120)
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert await failed_tasks(handle) == []
    assert (await handle.query("status"))["state"] is not None
    rows = await audit_rows(db_engine, handle.id)
    assert sorted(r.call_id for r in rows) == [f"c{i}" for i in range(1, len(calls) + 1)], rows
    for row, (name, text) in zip(sorted(rows, key=lambda r: r.call_id), calls, strict=True):
        if unencodable(text) or name not in FIELDS:
            assert row.outcome in ("invalid", "blocked"), (row, text)
    check_ledger(mcp_suite, handle.id, rows)


@PURE
@given(arguments=st.dictionaries(hostile_text, hostile_text | json_value, max_size=4))
def test_every_value_workflow_code_hands_to_temporal_encodes(arguments: dict[str, Any]) -> None:
    """The converter (summaries, details, query and update results, markers, activity inputs and
    results) and the failure converter (errors quoting outside text) encode anything, and a digest
    of such arguments is a digest, not an exception."""
    converter = data_converter.payload_converter
    (payload,) = converter.to_payloads([{"summary": f"get_lead {arguments}", "args": arguments}])
    assert payload.data
    args_digest(arguments)
    args_digest(json.dumps(arguments))
    from temporalio.api.failure.v1 import Failure
    from temporalio.exceptions import ApplicationError

    failure = Failure()
    data_converter.failure_converter.to_failure(
        ApplicationError(f"decision refused: {arguments}", type="Refused", non_retryable=True),
        converter,
        failure,
    )
    assert failure.application_failure_info.non_retryable and failure.SerializeToString()


# --- class 6: a tool has one name and one identity ---------------------------------------------

server_names = st.from_regex(SERVER_NAME, fullmatch=True)
listed_names = st.from_regex(r"[a-zA-Z0-9_-]{1,20}", fullmatch=True)


@PURE
@given(tools=st.lists(st.tuples(server_names, listed_names), min_size=2, max_size=6, unique=True))
@example(tools=[("x", "_foo"), ("x_", "foo")])
def test_registrable_servers_give_every_tool_its_own_name(tools: list[tuple[str, str]]) -> None:
    """A server `mcp add` accepts never shares a flat name with another's tool, and the name
    gives its server back; a pair that would share one is found by `clashes` (never offered)."""
    registrable = []
    for server, tool in tools:
        try:
            ServerConfig.of_command_line(server, None, "http://h/mcp", ("a",), None, (), ())
        except (ValueError, ValidationError):
            assert server.endswith("_")
            continue
        registrable.append((server, tool))
        name = tool_name(server, tool)
        assert name is None or server_of(name) == server
    assert clashes(registrable) == {}
    names = [f"mcp__{s}__{t}" for s, t in tools]
    shared = clashes(tools)
    assert set(shared) == {n for n in names if names.count(n) > 1}


@pytest.fixture
def underscore_server() -> Any:
    server = HttpServer()
    server.start("underscore")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.security
async def test_two_servers_sharing_a_tool_name_offer_neither_and_mcp_add_refuses(
    mcp_agent: tuple[AgentHarness, str],
    db_engine: AsyncEngine,
    database_url: str,
    underscore_server: HttpServer,
) -> None:
    """The issue's pair, on a real server: `x` lists `_wipe`, `x_` (registered before the name
    rule, straight into the table) lists `wipe`; both are `mcp__x___wipe`, which an operator set
    to always_allow. The conversation is not offered it, the model's call of it is refused, the
    server receives nothing; `mcp add` refuses `x_` and, with `x_` there, `x`."""
    agent, name = mcp_agent
    x = http_config(name, underscore_server, "x")
    legacy = x.model_copy(update={"name": "x_"})
    try:
        await register(db_engine, x)
        await register(db_engine, legacy, wipe="always_allow")  # the tier is mcp__x___wipe's
        pool = make_pool()
        try:
            tiers: dict[str, str | None] = {"mcp__x___wipe": "always_allow"}
            specs = await mcp_specs(session_factory(db_engine), pool, name, "acme", tiers)
        finally:
            await pool.close()
        offered = {s.name for s in specs}
        assert "mcp__x___wipe" not in offered and {"mcp__x__echo", "mcp__x___echo"} <= offered, offered
        agent.script(
            {"reply": {"tool_calls": [{"name": "mcp__x___wipe", "arguments": {}}]}},
            {"when": {"after_tool": "mcp__x___wipe"}, "reply": {"content": "done"}},
        )
        handle = await agent.start("Wipe.", agent=name, single_turn=True, limits=LIMITS)
        await asyncio.wait_for(handle.result(), timeout=120)
        (row,) = await audit_rows(db_engine, handle.id)
        assert row.outcome in ("invalid", "blocked") and row.approved_by is None, row
        env = {**os.environ, "DATABASE_URL": database_url, "MCP_TEST_TOKEN": TOKEN}

        def add(server: str) -> subprocess.CompletedProcess[str]:
            url = f"{underscore_server.url}?as={server}"
            return subprocess.run(
                [sys.executable, "starter.py", "mcp", "add", server, "--url", url,
                 "--agent", name, "--header", "Authorization=env:MCP_TEST_TOKEN"],
                capture_output=True, text=True, env=env, timeout=120,
            )  # fmt: skip

        refused = add("y_")
        assert refused.returncode != 0 and "may not end with '_'" in refused.stderr, refused
        async with db_engine.begin() as conn:  # x_'s remembered listing, as `mcp add` left it
            await conn.execute(delete(McpServer).where(McpServer.name == "x"))
        clash = add("x")
        assert clash.returncode != 0 and "mcp__x___wipe (x/_wipe, x_/wipe)" in clash.stderr, clash
    finally:
        await unregister(db_engine, ["x", "x_", "y_"])


# --- class 7: smaller residue ------------------------------------------------------------------


@PURE
@given(field=st.sampled_from(["max_iterations", "max_turns_per_run"]), value=st.integers(-5, 0))
def test_counts_that_must_be_at_least_one_refuse_zero(field: str, value: int) -> None:
    with pytest.raises(ValidationError):
        Limits(**{field: value})
    assert getattr(Limits(**{field: 1}), field) == 1


@pytest.mark.security
@PROPERTY
@given(calls=st.integers(20, 40), size=st.integers(55_000, 63_000))
@example(calls=40, size=63_000)  # about 2.5 MB: the reply
async def test_a_model_reply_over_the_bound_ends_the_turn_with_the_reason_and_its_usage(
    agent: AgentHarness, calls: int, size: int
) -> None:
    script_turn(agent, [("get_lead", {"lead": "x" * size})] * calls)
    handle = await agent.start("Do it.", agent="lead-qualifier", single_turn=True, limits=LIMITS)
    result = await asyncio.wait_for(handle.result(), timeout=120)
    assert await failed_tasks(handle) == []
    assert f"over the {MAX_REPLY_BYTES}-byte bound" in (result.last_reply or ""), result
    assert result.usage.model_calls >= 1 and result.usage.completion_tokens > 0, result.usage


class CountingInbox:
    """The part of the inbox service the watcher uses, counting the listings it is asked for."""

    def __init__(self) -> None:
        self.listings = 0

    async def page(
        self, tenant_id: str, decidable: Decidable, limit: int | None, known: object = None
    ) -> Page:
        self.listings += 1
        await asyncio.sleep(0.01)  # a visibility list and queries take a while
        return Page(items=[], more=0)


@settings(max_examples=max(EXAMPLES * 5, 40), deadline=None, database=None)
@given(tenants=st.lists(st.sampled_from(["acme", "globex", "initech"]), min_size=1, max_size=20))
@example(tenants=["acme"] * 10)  # the ten streams: nine loops ran forever
def test_streams_opened_together_share_one_poll_loop_per_tenant(tenants: list[str]) -> None:
    async def scenario() -> None:
        watcher = Watcher(CountingInbox())  # type: ignore[arg-type]
        opened, release = asyncio.Event(), asyncio.Event()
        entered: list[str] = []
        running: list[int] = []  # poll loops running while every stream is open

        async def stream(tenant: str) -> None:
            async with watcher.listen(tenant, Decidable.of("bob", ["reviewer"]), 50):
                entered.append(tenant)
                if len(entered) == len(tenants):
                    opened.set()
                await release.wait()

        async def count() -> None:
            await opened.wait()
            await asyncio.sleep(0.05)  # the loops are started and polling
            running.append(watcher.loops)
            release.set()

        await asyncio.gather(count(), *(stream(t) for t in tenants))
        assert running == [len(set(tenants))], running
        for _ in range(100):  # the loops see their cancellation
            if not watcher.loops:
                break
            await asyncio.sleep(0.01)
        assert watcher.loops == 0

    asyncio.run(scenario())


def test_a_session_opens_a_bounded_number_of_streams() -> None:
    watcher = Watcher(CountingInbox())  # type: ignore[arg-type]
    with contextlib.ExitStack() as open_streams:
        for _ in range(MAX_STREAMS_PER_SESSION):
            open_streams.enter_context(watcher.stream_of("s1"))
        with pytest.raises(HttpRefusal) as refused:
            watcher.stream_of("s1").__enter__()
        assert refused.value.status == 429
        open_streams.enter_context(watcher.stream_of("s2"))  # another session is not counted with it
    with watcher.stream_of("s1"):  # closed streams are counted out
        pass


@pytest.mark.security
@pytest.mark.usefixtures("clean")
@PROPERTY
@given(
    call_id=st.one_of(
        st.sampled_from(["c9", "c1_", "%", "c"]), st.from_regex(r"[a-z0-9_%-]{1,12}", fullmatch=True)
    )
)
@example(call_id="c9")
async def test_a_rollback_of_a_call_the_conversation_never_wrote_is_refused_on_the_record(
    agent: AgentHarness, db_engine: AsyncEngine, call_id: str
) -> None:
    name = await make_agent(db_engine)
    agent.script(
        {"when": {"user_contains": "first"}, "reply": {"tool_calls": [WRITES[1]]}},
        {"when": {"after_tool": "create_task"}, "reply": {"content": "ok"}},
    )
    handle = await agent.start("first", agent=name)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    written = {e.call_id for e in (await handle.query(AgentWorkflow.saga)).entries}
    await handle.signal(
        AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="call", call_id=call_id)
    )
    async with db_engine.connect() as conn:
        for _ in range(100):
            refused = (
                await conn.execute(
                    sql("SELECT reason FROM input_audit WHERE workflow_id = :w AND action = 'rollback'"),
                    {"w": handle.id},
                )
            ).all()
            accepted = (
                await conn.execute(
                    sql("SELECT count(*) FROM rollback_requests WHERE workflow_id = :w AND accepted"),
                    {"w": handle.id},
                )
            ).scalar_one()
            if refused or accepted:
                break
            await asyncio.sleep(0.05)
    if call_id in written:
        assert accepted == 1 and not refused
    else:
        assert accepted == 0 and refused and "can undo" in refused[0].reason, refused
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()
    assert await failed_tasks(handle) == []


# An MCP server that answers what the SDK cannot read, or floods before its answer; "ok" answers.
RAW_MODES = ["surrogate", "deep", "garbage", "flood", "ok"]


@pytest.mark.security
@PROPERTY
@given(mode=st.sampled_from(RAW_MODES))
@example(mode="surrogate")
@example(mode="flood")
async def test_an_mcp_answer_the_sdk_drops_fails_at_once_and_is_audited_as_unknown(
    mcp_agent: tuple[AgentHarness, str], db_engine: AsyncEngine, tmp_path: Any, mode: str
) -> None:
    """The server ran the call (its ledger says so); the conversation does not wait out the call
    timeout (45 s), and the model and the audit say the outcome is unknown, not "not completed"."""
    agent, name = mcp_agent
    ledger = tmp_path / f"raw-{uuid.uuid4().hex[:6]}.jsonl"
    server = ServerConfig(
        name="raw",
        transport="stdio",
        command=[sys.executable, "-m", "tests.fixtures.mcp_raw_server", mode, str(ledger)],
        agents=[name],
    )
    try:
        await register(db_engine, server, act="always_allow")
        agent.script(
            {"reply": {"tool_calls": [{"name": "mcp__raw__act", "arguments": {}}]}},
            {"when": {"after_tool": "mcp__raw__act"}, "reply": {"content": "done"}},
        )
        started = asyncio.get_running_loop().time()
        handle = await agent.start("Act.", agent=name, single_turn=True, limits=LIMITS)
        await asyncio.wait_for(handle.result(), timeout=120)
        took = asyncio.get_running_loop().time() - started
        (row,) = await audit_rows(db_engine, handle.id)
        assert [json.loads(line)["mode"] for line in ledger.read_text().splitlines()] == [mode]
        if mode == "ok":
            assert row.outcome == "executed", row
        else:
            assert row.outcome == "unknown" and "outcome is unknown" in row.error, row
            assert "was not completed" not in row.error
            assert took < 30, f"waited {took:.1f} s for an answer the SDK had dropped"
        assert await failed_tasks(handle) == []
    finally:
        await unregister(db_engine, ["raw"])
