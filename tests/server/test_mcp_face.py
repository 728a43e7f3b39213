"""Countersign as an MCP server, with the real `mcp` client over HTTP against the real server, a
signed-mode worker, Temporal and PostgreSQL: tools are listed with their hints, a read runs at
once, a high-risk call waits in bob's inbox and its result reaches the client after bob approves
(run once, audited), a rejection is an error result, a forged or replayed request state is refused
and recorded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import RequesterAction, ToolExecution
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE
from tests.server.test_front_door import token_for
from tests.workflows.test_approvals import lead_status
from tests.workflows.test_approvals import jane_is_new as jane_is_new

QUALIFY = {"lead": JANE, "new_status": "qualified", "reason": "budget confirmed"}


def client(stack: SignedStack, token: str, agent: str = "lead-qualifier", **kwargs: Any) -> Client:
    """The real client, as README's "Countersign as an MCP server" connects it."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(f"{stack.url}/mcp/{agent}", http_client=http), **kwargs)


async def approvals_of(stack: SignedStack, reviewer: str, tool: str) -> list[dict[str, Any]]:
    code, items = await stack.call("GET", "/api/approvals", reviewer)
    assert code == 200, items
    return [i for i in items if i["tool"] == tool]


async def waiting_card(stack: SignedStack, bob: str) -> dict[str, Any]:
    for _ in range(200):
        if cards := await approvals_of(stack, bob, "update_lead_status"):
            return cards[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no card in bob's inbox")


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
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack = signed_agent
    bob = await stack.login("bob")
    elicited: list[types.ElicitRequestURLParams] = []

    async def open_card(context: Any, params: Any) -> types.ElicitResult:
        elicited.append(params)
        card = await waiting_card(stack, bob)
        assert card["requested_by"] == "alice"
        code, body = await stack.call(
            "POST", f"/api/approvals/{card['workflow_id']}/{card['call_id']}", bob, {"decision": "approve"}
        )
        assert code == 200, body
        return types.ElicitResult(action="accept")

    async with client(stack, alice_token, elicitation_callback=open_card) as mcp:
        result = await mcp.call_tool("update_lead_status", QUALIFY)
    assert not result.is_error, result
    (params,) = elicited
    assert params.mode == "url" and "/#conv-acme-key-mcp:" in params.url
    call_id = (result.meta or {})["countersign"]["call_id"]
    assert params.url.endswith(f"/{call_id}")
    assert await lead_status(db_engine, "acme") == "qualified"
    (ran,) = await executions(db_engine, call_id)
    assert ran.approved_by == "bob" and ran.user_id == "alice"


async def test_a_rejected_call_is_an_error_result_with_the_reason(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack = signed_agent
    bob = await stack.login("bob")

    async def reject(context: Any, params: Any) -> types.ElicitResult:
        card = await waiting_card(stack, bob)
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


async def test_a_forged_or_replayed_request_state_is_refused_and_recorded(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    async with client(signed_agent, alice_token) as mcp:
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
            await mcp.session.call_tool("update_lead_status", other, request_state=state, allow_input_required=True)
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
        invalid = await mcp.call_tool("update_lead_status", {"lead": JANE, "new_status": "famous"})
        assert invalid.is_error and "VALIDATION_ERROR" in invalid.content[0].text  # type: ignore[union-attr]
    code, body = await signed_agent.call("POST", "/mcp/lead-qualifier", "cst_not-a-real-token", {})
    assert code == 401 and body["error"]["message"] == "unknown or revoked API token", body
    json.dumps(body)
