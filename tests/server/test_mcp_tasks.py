"""Issue 50 item 4: every MCP client gets the result of a call that waits for a reviewer, whatever
it can do (countersign/server/mcp_tasks.py), with the real `mcp` client (or raw JSON-RPC where the
client has no API for it) over HTTP against the real server, a signed-mode worker, Temporal and
PostgreSQL:

- the SDK's client with its defaults (2026-07-28, no elicitation, no tasks) and one on 2025-11-25
  are held for the decision and get the tool's result;
- past the hold, a client is told the call still waits and gets the result from
  `countersign_outcome` by the call's id; at the person's bound of open streams, nothing is held;
- a client with the 2026-07-28 tasks extension gets a task, polls `tasks/get` and gets the result;
- a 2025-11-25 client asks for a task, polls it, gets the result from `tasks/result`, cancels
  another; a task id is its caller's only."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import aiohttp
import mcp_types as types
import pytest
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.continuation import TASK_TTL
from countersign.db.schema import RequesterAction
from countersign.runtime.config import PROJECT_ROOT
from countersign.server import mcp_face
from countersign.server.conversation_events import MAX_STREAMS_PER_PERSON
from countersign.server.mcp_tasks import OUTCOME_TOOL, TASK_POLL_MS, TASKS_EXTENSION, waiting_path
from tests.fixtures.approvals import lead_status
from tests.fixtures.inbox import SignedStack
from tests.server.test_front_door import token_for
from tests.server.test_mcp_face import QUALIFY, approvals_of, client, executions, waiting_card


@pytest.fixture
async def alice_token(signed_agent: SignedStack, db_engine: AsyncEngine) -> AsyncIterator[str]:
    async with token_for(db_engine, "acme", "mcp-alice", "alice") as secret:
        yield secret


async def decide(stack: SignedStack, call_id: str, decision: str = "approve") -> None:
    bob = await stack.login("bob")
    card = await waiting_card(stack, bob, call_id)
    assert card["requested_by"] == "alice"
    # a reviewer's reason that reads like a withdrawal: still a reviewer's rejection
    body = {
        "decision": decision,
        **({"reason": "withdrawn by the requester? no: by bob"} if decision == "reject" else {}),
    }
    code, answer = await stack.call("POST", f"/api/approvals/{card['workflow_id']}/{call_id}", bob, body)
    assert code == 200, answer


async def approve_the_new_card(stack: SignedStack, before: set[str]) -> str:
    """Approve the first card of alice's update_lead_status that was not in bob's inbox `before`."""
    bob = await stack.login("bob")
    for _ in range(400):
        fresh = [
            c for c in await approvals_of(stack, bob, "update_lead_status") if c["call_id"] not in before
        ]
        if fresh:
            await decide(stack, fresh[0]["call_id"])
            return str(fresh[0]["call_id"])
        await asyncio.sleep(0.05)
    raise AssertionError("no new card in bob's inbox")


async def cards(stack: SignedStack) -> set[str]:
    return {c["call_id"] for c in await approvals_of(stack, await stack.login("bob"), "update_lead_status")}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_client_without_elicitation_or_tasks_is_held_and_gets_the_approved_result(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None, mode: str
) -> None:
    """The SDK's client as the how-to shows it (its defaults: 2026-07-28, no elicitation callback)
    and one on 2025-11-25: the call is held while bob decides, and its result comes."""
    before = await cards(signed_agent)
    async with client(signed_agent, alice_token, mode=mode) as mcp:
        assert (mcp.protocol_version in MODERN_PROTOCOL_VERSIONS) == (mode == "auto")
        approving = asyncio.create_task(approve_the_new_card(signed_agent, before))
        result = await mcp.call_tool("update_lead_status", QUALIFY)
    call_id = await approving
    assert not result.is_error, result
    assert (result.meta or {})["countersign"]["call_id"] == call_id
    assert await lead_status(db_engine, "acme") == "qualified"
    (ran,) = await executions(db_engine, call_id)
    assert ran.approved_by == "bob" and ran.user_id == "alice"


async def test_past_the_hold_the_client_is_told_to_ask_countersign_outcome_which_gives_the_result(
    signed_agent: SignedStack,
    alice_token: str,
    db_engine: AsyncEngine,
    jane_is_new: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp_face, "WAIT_S", 1.0)
    async with client(signed_agent, alice_token) as mcp:
        assert OUTCOME_TOOL in {t.name for t in (await mcp.list_tools()).tools}
        waiting = await mcp.call_tool("update_lead_status", QUALIFY)
        assert waiting.is_error
        call_id = (waiting.meta or {})["countersign"]["call_id"]
        text = waiting.content[0].text  # type: ignore[union-attr]
        assert "waits for a reviewer" in text and OUTCOME_TOOL in text and call_id in text, text
        assert "/#conv-acme-key-mcp:" in text and "Do not call update_lead_status again" in text, text
        still = await mcp.call_tool(OUTCOME_TOOL, {"call_id": call_id})
        assert still.is_error and "waits for a reviewer" in still.content[0].text  # type: ignore[union-attr]
        await decide(signed_agent, call_id)
        monkeypatch.setattr(mcp_face, "WAIT_S", 30.0)
        result = await mcp.call_tool(OUTCOME_TOOL, {"call_id": call_id})
        assert not result.is_error, result
        assert (result.meta or {})["countersign"]["call_id"] == call_id
        assert json.loads(result.content[0].text)["ok"] is True  # type: ignore[union-attr]
        with pytest.raises(MCPError, match="no call mcp-nope waited in this conversation"):
            await mcp.call_tool(OUTCOME_TOOL, {"call_id": "mcp-nope"})
    assert await lead_status(db_engine, "acme") == "qualified"
    assert len(await executions(db_engine, call_id)) == 1


class CreatedTask(types.Result):
    """2026-07-28's `CreateTaskResult` as the tasks extension spells it."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None


class DetailedTask(types.Result):
    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None


class GetTask(types.Request[types.GetTaskRequestParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: types.GetTaskRequestParams
    name_param = "taskId"  # SEP-2663: Mcp-Name names the task


class Tasks(ClientExtension):
    """A client side of the tasks extension, on the SDK's own extension API: a task answer is
    polled with tasks/get until it is done, and its result is the call's."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self.seen: list[DetailedTask] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, created: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
        request = GetTask(params=types.GetTaskRequestParams(task_id=created.task_id))
        while True:
            task = await ctx.session.send_request(request, DetailedTask)
            self.seen.append(task)
            if task.status not in ("working", "input_required"):
                assert task.result is not None, task
                return types.CallToolResult.model_validate(task.result, by_name=False)
            await asyncio.sleep(0.1)


async def test_a_client_with_the_tasks_extension_gets_a_task_and_polls_it_to_the_result(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    tasks = Tasks()
    before = await cards(signed_agent)
    async with client(signed_agent, alice_token, extensions=[tasks]) as mcp:
        assert TASKS_EXTENSION in (mcp.server_capabilities.extensions or {})
        read = await mcp.call_tool("search_leads", {"query": "jane"})  # done at once: no task
        assert not read.is_error and not tasks.seen
        approving = asyncio.create_task(approve_the_new_card(signed_agent, before))
        result = await mcp.call_tool("update_lead_status", QUALIFY)
    call_id = await approving
    assert not result.is_error, result
    assert (result.meta or {})["countersign"]["call_id"] == call_id
    assert tasks.seen[0].status == "working" and call_id in (tasks.seen[0].status_message or "")
    assert tasks.seen[-1].status == "completed"
    assert await lead_status(db_engine, "acme") == "qualified"
    async with client(signed_agent, alice_token) as plain:  # the extension's own error without it
        request = GetTask(params=types.GetTaskRequestParams(task_id=tasks.seen[0].task_id))
        with pytest.raises(MCPError) as missing:
            await plain.session.send_request(request, DetailedTask)
    assert missing.value.error.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY, missing.value.error


LEGACY = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}


async def rpc(stack: SignedStack, token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One JSON-RPC request at 2025-11-25, as a client the SDK has no task API for sends it."""
    frame = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = LEGACY | {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{stack.url}/mcp/lead-qualifier", json=frame, headers=headers) as response,
    ):
        answer: dict[str, Any] = await response.json(content_type=None)
    return answer


async def test_a_2025_11_25_client_asks_for_a_task_polls_it_gets_its_result_and_cancels_another(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack = signed_agent
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    init = await rpc(stack, alice_token, "initialize", hello)
    assert init["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"] == {}, init
    listed = (await rpc(stack, alice_token, "tools/list", {}))["result"]["tools"]
    update = next(t for t in listed if t["name"] == "update_lead_status")
    assert update["execution"] == {"taskSupport": "optional"}, update
    # a call to withdraw: its task is cancelled, the call never runs
    lost = dict(QUALIFY, reason="second thoughts")
    created = await rpc(
        stack, alice_token, "tools/call", {"name": "update_lead_status", "arguments": lost, "task": {}}
    )
    withdrawn = created["result"]["task"]
    assert withdrawn["status"] == "working" and withdrawn["pollInterval"] > 0, created
    cancelled = await rpc(stack, alice_token, "tasks/cancel", {"taskId": withdrawn["taskId"]})
    assert cancelled["result"]["status"] == "cancelled", cancelled
    again = await rpc(stack, alice_token, "tasks/get", {"taskId": withdrawn["taskId"]})
    assert again["result"]["status"] == "cancelled", again
    # a call bob rejects: a completed task, its result the rejection
    params = {"name": "update_lead_status", "arguments": dict(QUALIFY, reason="third"), "task": {}}
    rejected = (await rpc(stack, alice_token, "tools/call", params))["result"]["task"]
    status = (await rpc(stack, alice_token, "tasks/get", {"taskId": rejected["taskId"]}))["result"]
    await decide(stack, status["statusMessage"].rsplit("/", 1)[1], "reject")
    outcome = (await rpc(stack, alice_token, "tasks/result", {"taskId": rejected["taskId"]}))["result"]
    assert outcome["isError"] is True and "REJECTED" in outcome["content"][0]["text"], outcome
    status = (await rpc(stack, alice_token, "tasks/get", {"taskId": rejected["taskId"]}))["result"]
    assert status["status"] == "completed", status
    # the call to approve
    created = await rpc(
        stack,
        alice_token,
        "tools/call",
        {"name": "update_lead_status", "arguments": QUALIFY, "task": {"ttl": 60000}},
    )
    task = created["result"]["task"]
    polled = await rpc(stack, alice_token, "tasks/get", {"taskId": task["taskId"]})
    assert (
        polled["result"]["status"] == "working"
        and "/#conv-acme-key-mcp:" in polled["result"]["statusMessage"]
    )
    call_id = polled["result"]["statusMessage"].rsplit("/", 1)[1]
    waiting = asyncio.create_task(rpc(stack, alice_token, "tasks/result", {"taskId": task["taskId"]}))
    await decide(stack, call_id)
    result = (await waiting)["result"]
    assert result["isError"] is False and json.loads(result["content"][0]["text"])["ok"] is True, result
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    assert result["_meta"]["countersign"]["call_id"] == call_id
    done = await rpc(stack, alice_token, "tasks/get", {"taskId": task["taskId"]})
    assert done["result"]["status"] == "completed", done
    assert await lead_status(db_engine, "acme") == "qualified"
    (ran,) = await executions(db_engine, call_id)
    assert ran.approved_by == "bob"
    # a task id is its caller's only, and one this server sealed
    async with token_for(db_engine, "acme", "mcp-carol", "carol") as carol:
        other = await rpc(stack, carol, "tasks/get", {"taskId": task["taskId"]})
    assert other["error"]["code"] == types.INVALID_PARAMS and "no such task" in other["error"]["message"]
    forged = await rpc(stack, alice_token, "tasks/get", {"taskId": task["taskId"][:-2] + "AA"})
    assert "no such task" in forged["error"]["message"], forged


def test_the_path_a_client_takes_follows_what_it_declares() -> None:
    url = types.ClientCapabilities(
        elicitation=types.ElicitationCapability(url=types.UrlElicitationCapability())
    )
    form = types.ClientCapabilities(
        elicitation=types.ElicitationCapability(form=types.FormElicitationCapability())
    )
    tasks = types.ClientCapabilities(extensions={TASKS_EXTENSION: {}}, elicitation=url.elicitation)
    assert waiting_path("2026-07-28", tasks, None) == "task"
    assert waiting_path("2026-07-28", url, None) == "elicitation"
    assert waiting_path("2026-07-28", form, None) == "hold"
    assert waiting_path("2026-07-28", None, None) == "hold"
    assert waiting_path("2025-11-25", url, types.TaskMetadata()) == "task"
    assert waiting_path("2025-11-25", url, None) == "hold"
    assert waiting_path("2025-06-18", None, None) == "hold"


async def test_a_person_at_their_bound_of_open_streams_is_not_held(
    signed_agent: SignedStack, alice_token: str, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    """Held requests count with the person's event streams: at the bound, a call is told at once
    that it waits, and a tasks/result is refused (poll tasks/get instead)."""
    headers = {"Authorization": f"Bearer {alice_token}", "Accept": "text/event-stream"}
    url = f"{signed_agent.url}/mcp/lead-qualifier"
    params = {"name": "update_lead_status", "arguments": QUALIFY, "task": {}}
    created = await rpc(signed_agent, alice_token, "tools/call", params)
    task_id = created["result"]["task"]["taskId"]
    async with contextlib.AsyncExitStack() as held, aiohttp.ClientSession() as http:
        for _ in range(MAX_STREAMS_PER_PERSON):
            response = await held.enter_async_context(http.get(url, headers=headers))
            assert response.status < 400, (response.status, await response.text())
        async with client(signed_agent, alice_token) as mcp:
            waiting = await asyncio.wait_for(mcp.call_tool("update_lead_status", QUALIFY), 10)
        refused = await rpc(signed_agent, alice_token, "tasks/result", {"taskId": task_id})
    async with aiohttp.ClientSession() as http:  # the places free again (within a second)
        for _ in range(50):
            async with http.get(url, headers=headers) as response:
                if response.status < 400:
                    break
            await asyncio.sleep(0.1)
    text = waiting.content[0].text  # type: ignore[union-attr]
    assert waiting.is_error and "none came within 0 s" in text and OUTCOME_TOOL in text, text
    assert "poll tasks/get" in refused["error"]["message"], refused
    async with db_engine.connect() as conn:
        rows = list(await conn.execute(select(RequesterAction).where(RequesterAction.status == 429)))
    assert any("open event streams" in (r.reason or "") for r in rows), rows


def test_the_how_to_gives_each_paths_bounds_as_the_code_has_them() -> None:
    text = (PROJECT_ROOT / "docs" / "how-to" / "mcp-face.md").read_text()
    paths = text.split("## Which path a client takes", 1)[1]
    assert f"up to {mcp_face.WAIT_S:.0f} s" in paths and f"up to {mcp_face.HOLD_S:.0f} s" in paths
    assert f"({TASK_POLL_MS // 1000} s)" in paths and f"{TASK_TTL.total_seconds() / 3600:.0f} hours" in paths
    assert OUTCOME_TOOL in paths and TASKS_EXTENSION in paths
    assert f"open streams ({MAX_STREAMS_PER_PERSON}, with their event" in paths


async def test_a_held_request_its_client_gave_up_on_frees_its_place_at_once(
    signed_agent: SignedStack, alice_token: str, jane_is_new: None
) -> None:
    """A tasks/result is held up to the task's 24 hours: a client that stops waiting (a timeout)
    must not leave it counting against its person's bound, or a few give-ups lock them out of
    every event stream for a day."""
    headers = {"Authorization": f"Bearer {alice_token}", "Accept": "text/event-stream"}
    url = f"{signed_agent.url}/mcp/lead-qualifier"
    params = {"name": "update_lead_status", "arguments": QUALIFY, "task": {}}
    task_id = (await rpc(signed_agent, alice_token, "tools/call", params))["result"]["task"]["taskId"]
    async with contextlib.AsyncExitStack() as held, aiohttp.ClientSession() as http:
        for _ in range(MAX_STREAMS_PER_PERSON - 1):
            response = await held.enter_async_context(http.get(url, headers=headers))
            assert response.status < 400, (response.status, await response.text())
        with pytest.raises(TimeoutError):  # the last place, held by a tasks/result given up on
            await asyncio.wait_for(rpc(signed_agent, alice_token, "tasks/result", {"taskId": task_id}), 1)
        for _ in range(50):
            async with http.get(url, headers=headers) as response:
                if response.status < 400:
                    break
            await asyncio.sleep(0.1)
        assert response.status < 400, "the abandoned tasks/result still holds the last place"
    cancelled = await rpc(signed_agent, alice_token, "tasks/cancel", {"taskId": task_id})
    assert cancelled["result"]["status"] == "cancelled", cancelled
