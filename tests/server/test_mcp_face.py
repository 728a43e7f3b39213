"""Countersign as an MCP server, with the real `mcp` client over HTTP against the real server, a
signed-mode worker, Temporal and PostgreSQL: tools are listed with their hints, a read runs at
once, a high-risk call waits in bob's inbox and its result reaches the client after bob approves
(run once, audited), a rejection is an error result, a forged or replayed request state is refused
and recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import mcp_types as types
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowUpdateFailedError

from countersign.core.contract import ServedCall, ServedOutcome
from countersign.db.engine import session_factory
from countersign.db.schema import InputAudit, RequesterAction, ToolExecution, User, UserRole
from countersign.identity import tokens
from countersign.runtime.config import PROJECT_ROOT
from countersign.server import mcp_face
from tests.fixtures.approvals import lead_status
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE
from tests.server.test_front_door import token_for, until

QUALIFY = {"lead": JANE, "new_status": "qualified", "reason": "budget confirmed"}


def client(stack: SignedStack, token: str, agent: str = "lead-qualifier", **kwargs: Any) -> Client:
    """The real client, as docs/how-to/mcp-face.md connects it."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(f"{stack.url}/mcp/{agent}", http_client=http), **kwargs)


async def unopened(context: Any, params: Any) -> types.ElicitResult:
    raise AssertionError("this test answers input_required itself")


def eliciting(stack: SignedStack, token: str) -> Client:
    """A client that declares URL elicitation (so a waiting call answers it `input_required`) and
    drives the rounds itself (`session.call_tool(..., allow_input_required=True)`)."""
    return client(stack, token, elicitation_callback=unopened)


async def approvals_of(stack: SignedStack, reviewer: str, tool: str) -> list[dict[str, Any]]:
    code, items = await stack.call("GET", "/api/approvals", reviewer)
    assert code == 200, items
    return [i for i in items if i["tool"] == tool]


async def waiting_card(stack: SignedStack, bob: str, call_id: str) -> dict[str, Any]:
    for _ in range(200):
        for card in await approvals_of(stack, bob, "update_lead_status"):
            if card["call_id"] == call_id:
                return card
        await asyncio.sleep(0.05)
    raise AssertionError(f"no card of {call_id} in bob's inbox")


async def mcp_rows(engine: AsyncEngine) -> list[RequesterAction]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(RequesterAction).where(RequesterAction.via == "mcp"))
        return list(rows)  # type: ignore[arg-type]


async def executions(engine: AsyncEngine, call_id: str) -> list[Any]:
    async with engine.connect() as conn:
        return list(await conn.execute(select(ToolExecution).where(ToolExecution.call_id == call_id)))


@pytest.fixture
async def alice_token(signed_agent: SignedStack, db_engine: AsyncEngine) -> AsyncIterator[str]:
    async with token_for(db_engine, "acme", "mcp-alice", "alice") as secret:
        yield secret


async def test_tools_are_listed_with_hints_and_a_read_runs_at_once(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine
) -> None:
    async with client(signed_agent, alice_token) as mcp:
        listed = {t.name: t for t in (await mcp.list_tools()).tools}
        assert {"search_leads", "get_lead", "update_lead_status"} <= set(listed), sorted(listed)
        search, update = listed["search_leads"], listed["update_lead_status"]
        assert search.annotations and search.annotations.read_only_hint and search.annotations.idempotent_hint
        assert update.annotations and not update.annotations.read_only_hint
        assert update.annotations.destructive_hint  # high risk
        assert update.input_schema["properties"]["new_status"]
        result = await mcp.call_tool("search_leads", {"query": "jane"})
        assert not result.is_error, result
        assert JANE in result.content[0].text  # type: ignore[union-attr]
        meta = (result.meta or {})["countersign"]
        assert meta["workflow_id"].startswith("conv-acme-key-mcp:")
    rows = await mcp_rows(db_engine)
    assert any("tools/list" in (r.reason or "") for r in rows)
    assert any("tools/call search_leads" in (r.reason or "") and r.status == 200 for r in rows)


async def test_a_high_risk_call_waits_for_bob_and_its_result_comes_once_approved(
    signed_agent: SignedStack,
    alice_token: str,
    db_engine: AsyncEngine,
    jane_is_new: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client asks again with its request state: held a second, then told to ask once more
    (a fresh state), until bob's approval lets the held request answer with the result; the same
    token undoes the call."""
    monkeypatch.setattr(mcp_face, "HOLD_S", 1.0)
    stack = signed_agent
    bob = await stack.login("bob")
    elicited: list[types.ElicitRequestURLParams] = []
    decided: list[asyncio.Task[None]] = []

    async def approve_later(call_id: str) -> None:
        card = await waiting_card(stack, bob, call_id)
        assert card["requested_by"] == "alice"
        await asyncio.sleep(3)  # the client has asked again by now: its request is held
        code, body = await stack.call(
            "POST", f"/api/approvals/{card['workflow_id']}/{card['call_id']}", bob, {"decision": "approve"}
        )
        assert code == 200, body

    async def open_card(context: Any, params: Any) -> types.ElicitResult:
        elicited.append(params)
        decided.append(asyncio.create_task(approve_later(params.url.rsplit("/", 1)[1])))
        return types.ElicitResult(action="accept")

    async with client(stack, alice_token, elicitation_callback=open_card) as mcp:
        result = await mcp.call_tool("update_lead_status", QUALIFY)
    await decided[0]
    assert not result.is_error, result
    (params,) = elicited
    assert params.mode == "url" and "/#conv-acme-key-mcp:" in params.url
    call_id = (result.meta or {})["countersign"]["call_id"]
    assert params.url.endswith(f"/{call_id}")
    assert await lead_status(db_engine, "acme") == "qualified"
    (ran,) = await executions(db_engine, call_id)
    assert ran.approved_by == "bob" and ran.user_id == "alice"
    # the same token undoes it: the conversation's saga holds the call
    workflow_id = (result.meta or {})["countersign"]["workflow_id"]
    undo = {"scope": "call", "call_id": call_id, "reason": "asked by mistake"}
    code, body = await stack.call("POST", f"/api/conversations/{workflow_id}/rollback", alice_token, undo)
    assert code == 202, body

    async def undone() -> bool:
        return await lead_status(db_engine, "acme") == "new"

    await until(undone, "the call is compensated")


async def test_a_rejected_call_is_an_error_result_with_the_reason(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack = signed_agent
    bob = await stack.login("bob")

    async def reject(context: Any, params: Any) -> types.ElicitResult:
        card = await waiting_card(stack, bob, params.url.rsplit("/", 1)[1])
        code, body = await stack.call(
            "POST",
            f"/api/approvals/{card['workflow_id']}/{card['call_id']}",
            bob,
            {"decision": "reject", "reason": "not this quarter"},
        )
        assert code == 200, body
        return types.ElicitResult(action="accept")

    async with client(stack, alice_token, elicitation_callback=reject) as mcp:
        result = await mcp.call_tool("update_lead_status", QUALIFY)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "REJECTED" in text and "not this quarter" in text, text
    assert await lead_status(db_engine, "acme") == "new"


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_a_client_that_declines_the_card_withdraws_the_call(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None, action: str
) -> None:
    """The client declines (or cancels) the URL elicitation: the call is withdrawn by its requester
    (a recorded rejection, never run), bob's card goes, and the client gets an error result."""
    stack = signed_agent
    bob = await stack.login("bob")
    shown: list[str] = []

    async def decline(context: Any, params: Any) -> types.ElicitResult:
        call_id = params.url.rsplit("/", 1)[1]
        await waiting_card(stack, bob, call_id)
        shown.append(call_id)
        return types.ElicitResult(action=action)

    async with client(stack, alice_token, elicitation_callback=decline) as mcp:
        result = await mcp.call_tool("update_lead_status", QUALIFY)
    (call_id,) = shown
    assert result.is_error, result
    text = result.content[0].text  # type: ignore[union-attr]
    assert "REJECTED" in text and "withdrawn by the requester" in text, text
    assert call_id not in [c["call_id"] for c in await approvals_of(stack, bob, "update_lead_status")]
    assert await lead_status(db_engine, "acme") == "new"
    (row,) = await executions(db_engine, call_id)
    assert row.outcome == "rejected" and row.user_id == "alice", row
    reasons = [r.reason or "" for r in await mcp_rows(db_engine) if r.status == 200]
    assert any(call_id in r and "withdrawn" in r for r in reasons), reasons


async def test_a_call_decided_before_its_conversation_ended_still_answers_its_client_once(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    """Bob approves, the conversation ends, then the client asks again with its request state: the
    result comes from the store by (conversation, call id), not "no call in this run"; the state
    answers once."""
    stack = signed_agent
    bob = await stack.login("bob")
    async with eliciting(stack, alice_token) as mcp:
        first = await mcp.session.call_tool("update_lead_status", QUALIFY, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.request_state, first
        (elicitation,) = (first.input_requests or {}).values()
        call_id = elicitation.params.url.rsplit("/", 1)[1]  # type: ignore[union-attr]
        card = await waiting_card(stack, bob, call_id)
        workflow_id = card["workflow_id"]
        code, body = await stack.call(
            "POST", f"/api/approvals/{workflow_id}/{call_id}", bob, {"decision": "approve"}
        )
        assert code == 200, body
        code, body = await stack.call("POST", f"/api/conversations/{workflow_id}/end", alice_token)
        assert code == 202, body
        await stack.agent.client.get_workflow_handle(workflow_id).result()
        result = await mcp.session.call_tool(
            "update_lead_status", QUALIFY, request_state=first.request_state, allow_input_required=True
        )
        assert isinstance(result, types.CallToolResult) and not result.is_error, result
        assert (result.meta or {})["countersign"] == {"workflow_id": workflow_id, "call_id": call_id}
        with pytest.raises(MCPError, match="replay"):
            await mcp.session.call_tool(
                "update_lead_status", QUALIFY, request_state=first.request_state, allow_input_required=True
            )
    stack.agent.track(workflow_id)
    assert await lead_status(db_engine, "acme") == "qualified"
    (ran,) = await executions(db_engine, call_id)
    assert ran.approved_by == "bob"
    answered = [r for r in await mcp_rows(db_engine) if f"{call_id}" in (r.reason or "") and r.status == 200]
    assert len(answered) == 1, answered


async def test_a_forged_or_replayed_request_state_is_refused_and_recorded(
    signed_agent: SignedStack,
    alice_token: str,
    db_engine: AsyncEngine,
    jane_is_new: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp_face, "HOLD_S", 1.0)  # the valid resume below is held, then told to ask again
    async with eliciting(signed_agent, alice_token) as mcp:
        first = await mcp.session.call_tool("update_lead_status", QUALIFY, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.request_state, first
        state = first.request_state
        body, tag = state.split(".")
        forged = f"{body}.{tag[:-2]}AA"
        with pytest.raises(MCPError, match="altered or forged"):
            await mcp.session.call_tool(
                "update_lead_status", QUALIFY, request_state=forged, allow_input_required=True
            )
        other = dict(QUALIFY, new_status="lost")
        with pytest.raises(MCPError, match="another caller, tool or arguments"):
            await mcp.session.call_tool(
                "update_lead_status", other, request_state=state, allow_input_required=True
            )
        again = await mcp.session.call_tool(
            "update_lead_status", QUALIFY, request_state=state, allow_input_required=True
        )
        assert isinstance(again, types.InputRequiredResult)  # still waiting: a fresh state
        with pytest.raises(MCPError, match="replay"):
            await mcp.session.call_tool(
                "update_lead_status", QUALIFY, request_state=state, allow_input_required=True
            )
    reasons = [r.reason or "" for r in await mcp_rows(db_engine) if r.status == 403]
    assert any("forged" in r for r in reasons) and any("replay" in r for r in reasons), reasons
    assert await lead_status(db_engine, "acme") == "new"


async def test_an_unknown_tool_is_a_jsonrpc_error_and_other_tenants_tokens_are_refused(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine
) -> None:
    async with client(signed_agent, alice_token) as mcp:
        with pytest.raises(MCPError, match="no tool named"):
            await mcp.call_tool("drop_database", {})
        with pytest.raises(MCPError, match="no tool named"):
            await mcp.call_tool("x" * 65, {})
        with pytest.raises(MCPError, match="over the limit of 64000"):
            await mcp.call_tool("search_leads", {"query": "x" * 70_000})
        invalid = await mcp.call_tool("update_lead_status", {"lead": JANE, "new_status": "famous"})
        assert invalid.is_error and "VALIDATION_ERROR" in invalid.content[0].text  # type: ignore[union-attr]
    code, body = await signed_agent.call("POST", "/mcp/lead-qualifier", "cst_not-a-real-token", {})
    assert code == 401 and body["error"]["message"] == "unknown or revoked API token", body
    json.dumps(body)


async def test_a_revoked_token_or_a_deactivated_user_is_refused_at_the_next_request(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    async with (
        token_for(db_engine, "acme", "mcp-carol", "carol") as secret,
        client(signed_agent, secret) as mcp,
    ):
        assert not (await mcp.call_tool("search_leads", {"query": "jane"})).is_error
        async with db_engine.begin() as conn:
            await conn.execute(
                update(User)
                .where(User.tenant_id == "acme", User.id == "carol")
                .values(deactivated_at=func.now())
            )
        try:
            with pytest.raises(MCPError, match="acts for no active user"):
                await mcp.call_tool("search_leads", {"query": "jane"})
        finally:
            async with db_engine.begin() as conn:
                await conn.execute(
                    update(User)
                    .where(User.tenant_id == "acme", User.id == "carol")
                    .values(deactivated_at=None)
                )
        assert not (await mcp.call_tool("search_leads", {"query": "jane"})).is_error
        async with session_factory(db_engine).begin() as session:
            await tokens.revoke(session, "mcp-carol", "acme", datetime.now(UTC))
        with pytest.raises(MCPError, match="unknown or revoked API token"):
            await mcp.call_tool("search_leads", {"query": "jane"})


async def test_an_ended_conversation_is_followed_by_a_new_one_and_calls_undo_through_the_same_token(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    """The token's user ends or undoes its MCP conversation with the conversation API; the next
    call starts the next conversation under the same key."""
    stack = signed_agent
    async with client(stack, alice_token) as mcp:
        first = await mcp.call_tool("search_leads", {"query": "jane"})
        workflow_id = (first.meta or {})["countersign"]["workflow_id"]
        code, body = await stack.call("POST", f"/api/conversations/{workflow_id}/end", alice_token)
        assert code == 202, body
        handle = stack.agent.client.get_workflow_handle(workflow_id)
        await handle.result()
        again = await mcp.call_tool("search_leads", {"query": "jane"})
        assert not again.is_error and (again.meta or {})["countersign"]["workflow_id"] == workflow_id
    stack.agent.track(workflow_id)


async def test_an_oversized_body_is_refused_at_the_edge_and_recorded(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine
) -> None:
    big = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "search_leads", "arguments": {"query": "x" * 300_000}},
    }
    code, body = await signed_agent.call("POST", "/mcp/lead-qualifier", alice_token, big)
    assert code == 413 and "larger than" in body["error"]["message"], body
    assert any(r.status == 413 for r in await mcp_rows(db_engine))


async def test_another_tenants_token_has_its_own_conversation_and_cannot_use_acmes_state(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    async with eliciting(signed_agent, alice_token) as mcp:
        waiting = await mcp.session.call_tool("update_lead_status", QUALIFY, allow_input_required=True)
        assert isinstance(waiting, types.InputRequiredResult) and waiting.request_state
    async with (
        token_for(db_engine, "globex", "mcp-dave", "dave") as secret,
        client(signed_agent, secret) as mcp,
    ):
        with pytest.raises(MCPError, match="another caller"):
            await mcp.session.call_tool(
                "update_lead_status", QUALIFY, request_state=waiting.request_state, allow_input_required=True
            )
        found = await mcp.call_tool("search_leads", {"query": "jane"})  # globex's own jane
        assert '"owner":"dave"' in found.content[0].text  # type: ignore[union-attr]
        assert (found.meta or {})["countersign"]["workflow_id"].startswith("conv-globex-key-mcp:")


JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
TOOL_NAMES = st.sampled_from(["search_leads", "get_lead", "update_lead_status", "nope", "", "x" * 80])
ENVELOPE = {PROTOCOL_VERSION_META_KEY: "2026-07-28", CLIENT_CAPABILITIES_META_KEY: {}}


@st.composite
def frames(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A body and its headers: bytes, any JSON, or a 2026-07-28 call (headers as the protocol
    wants them, so it reaches the handler) of any tool with any arguments and request state."""
    kind = draw(st.sampled_from(["bytes", "json", "call", "list"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200)), {}
    if kind == "json":
        return json.dumps(draw(JUNK)).encode(), {}
    method = "tools/call" if kind == "call" else "tools/list"
    params: dict[str, Any] = {"_meta": ENVELOPE}
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if kind == "call":
        params |= {"name": draw(TOOL_NAMES), "arguments": draw(st.dictionaries(st.text(max_size=8), JUNK))}
        headers["Mcp-Name"] = params["name"]
        if draw(st.booleans()):
            params["requestState"] = draw(st.text(max_size=40))
    frame = {"jsonrpc": "2.0", "id": draw(st.integers(0, 99)), "method": method, "params": params}
    return json.dumps(frame).encode(), headers


CALL_NOPE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"_meta": ENVELOPE, "name": "search_leads", "arguments": {"query": 5}},
}
ROUTED = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call"}


@pytest.mark.security
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(sent=st.lists(frames(), min_size=1, max_size=5))
@example(sent=[(json.dumps(CALL_NOPE).encode(), {**ROUTED, "Mcp-Name": "search_leads"})])
async def test_hostile_frames_never_leave_a_call_unrecorded_or_the_conversation_stuck(
    signed_agent: SignedStack,
    alice_token: str,
    db_engine: AsyncEngine,
    sent: list[tuple[bytes, dict[str, str]]],
) -> None:
    headers = {
        "Authorization": f"Bearer {alice_token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    calls: list[str] = []
    async with aiohttp.ClientSession() as http:
        for frame, routing in sent:
            async with http.post(
                f"{signed_agent.url}/mcp/lead-qualifier", data=frame, headers=headers | routing
            ) as response:
                assert response.status < 500, (frame, response.status, await response.text())
                text = await response.text()
            with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
                calls.append(json.loads(text)["result"]["_meta"]["countersign"]["call_id"])
    print("CALLS", len(calls), [r for r in sent][:1])
    for call_id in calls:  # every call that reached the conversation has its one audit row
        assert len(await executions(db_engine, call_id)) == 1, call_id
    async with client(signed_agent, alice_token) as mcp:  # and the conversation still answers
        assert not (await mcp.call_tool("search_leads", {"query": "jane"})).is_error


async def test_a_raw_serve_call_without_the_servers_proof_or_for_another_user_is_refused_and_recorded(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine
) -> None:
    """Anyone with Temporal access could send the update: in signed mode it needs the server's
    proof for exactly that call, and only the conversation's user may call tools in it."""
    async with client(signed_agent, alice_token) as mcp:
        first = await mcp.call_tool("search_leads", {"query": "jane"})
    workflow_id = (first.meta or {})["countersign"]["workflow_id"]
    handle = signed_agent.agent.client.get_workflow_handle(workflow_id)
    for user, why in (("alice", "proof"), ("bob", "may not call tools in alice's conversation")):
        call = ServedCall(
            user_id=user, call_id=f"raw-{user}", tool="search_leads", arguments='{"query":"jane"}'
        )
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("serve_call", call, result_type=ServedOutcome)
        assert why in str(refused.value.cause), refused.value.cause
        assert await executions(db_engine, call.call_id) == []
    async with db_engine.connect() as conn:
        audited = list(await conn.execute(select(InputAudit).where(InputAudit.workflow_id == workflow_id)))
    assert any(r.action == "serve_call" and r.actor == "bob" for r in audited), audited


async def test_a_client_on_an_earlier_protocol_lists_and_calls_and_is_told_where_a_call_waits(
    signed_agent: SignedStack, alice_token: str, jane_is_new: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held for the decision a while (tests/server/test_mcp_tasks.py: its result when it comes),
    then told where the call waits and how to get its result."""
    monkeypatch.setattr(mcp_face, "WAIT_S", 1.0)
    async with client(signed_agent, alice_token, mode="legacy") as mcp:
        assert mcp.protocol_version not in MODERN_PROTOCOL_VERSIONS
        assert "search_leads" in {t.name for t in (await mcp.list_tools()).tools}
        assert not (await mcp.call_tool("search_leads", {"query": "jane"})).is_error
        waiting = await mcp.call_tool("update_lead_status", QUALIFY)
    assert waiting.is_error
    text = waiting.content[0].text  # type: ignore[union-attr]
    assert (
        "waits for a reviewer" in text and "countersign_outcome" in text and "/#conv-acme-key-mcp:" in text
    ), text


def readme_blocks(language: str) -> list[str]:
    """The ```LANGUAGE blocks of docs/how-to/mcp-face.md ("Countersign as an MCP server"), as typed there."""
    section = (PROJECT_ROOT / "docs" / "how-to" / "mcp-face.md").read_text().split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


async def test_the_readmes_client_runs_as_typed_and_its_desktop_block_is_json(
    signed_agent: SignedStack, alice_token: str
) -> None:
    """docs/how-to/mcp-face.md's few lines, with only the demo stack's address and the token put
    in, against the real server; the desktop client's block names the same endpoint and header."""
    (code,) = readme_blocks("python")
    assert code.count("http://127.0.0.1:8300") == 1 and code.count("cst_…") == 1
    code = code.replace("http://127.0.0.1:8300", signed_agent.url).replace("cst_…", alice_token)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    assert "'search_leads'" in out.decode() and JANE in out.decode(), out.decode()
    (config,) = readme_blocks("json")
    server = json.loads(config)["mcpServers"]["countersign"]
    assert server == {
        "url": "http://127.0.0.1:8300/mcp/lead-qualifier",
        "headers": {"Authorization": "Bearer cst_…"},
    }


def test_a_stored_results_text_is_read_as_success_or_failure_with_its_code() -> None:
    assert mcp_face.envelope_of('{"ok":true,"data":{"n":1}}') == (True, None)
    failed = '{"ok":false,"error":{"code":"REJECTED","message":"bob: no"}}'
    assert mcp_face.envelope_of(failed) == (False, "REJECTED")
    assert mcp_face.envelope_of('{"ok":false,"error":{"code":7}}') == (False, None)
    assert mcp_face.envelope_of("not json") == (False, None)
    assert mcp_face.envelope_of("[true]") == (False, None)


def test_only_a_declined_or_cancelled_card_withdraws() -> None:
    def answered(action: str) -> dict[str, types.InputResponse]:
        return {"approval": types.ElicitResult(action=action)}

    assert mcp_face.declined_by(answered("decline")) == "declined"
    assert mcp_face.declined_by(answered("cancel")) == "cancelled"
    assert mcp_face.declined_by(answered("accept")) is None
    assert mcp_face.declined_by({"other": types.ElicitResult(action="decline")}) is None
    assert mcp_face.declined_by(None) is None


async def test_an_admin_demoted_mid_conversation_no_longer_sees_or_runs_admin_tools(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """Issue 48 item 9: tools/list and tools/call read the user's roles from the database, not from
    the conversation's start (which keeps carol's admin role for as long as it runs)."""
    admin = {"tenant_id": "acme", "user_id": "carol", "role": "admin"}
    async with (
        token_for(db_engine, "acme", "mcp-carol-admin", "carol") as secret,
        client(signed_agent, secret, agent="admin-assistant") as mcp,
    ):
        assert "write_record" in {t.name for t in (await mcp.list_tools()).tools}
        async with db_engine.begin() as conn:
            await conn.execute(delete(UserRole).filter_by(**admin))
        try:
            listed = {t.name for t in (await mcp.list_tools()).tools}
            assert "write_record" not in listed and "query_records" in listed, sorted(listed)
            with pytest.raises(MCPError, match="write_record needs the role admin"):
                await mcp.call_tool(
                    "write_record", {"collection": "tasks", "id": 1, "values": {"title": "x"}}
                )
        finally:
            async with db_engine.begin() as conn:
                await conn.execute(insert(UserRole).values(**admin).on_conflict_do_nothing())
        assert "write_record" in {t.name for t in (await mcp.list_tools()).tools}
    refused = [
        r for r in await mcp_rows(db_engine) if "write_record needs the role admin" in (r.reason or "")
    ]
    assert refused and refused[-1].status == 403
