"""Records the replay fixtures in tests/workflows/histories/ from real runs of the current workflow code.

Not collected by `make test` (the name does not start with `test_`); run it when the workflow's
commands change on purpose (before 1.0, or for a new build's fixtures, see
docs/how-to/deploy-a-new-build.md):

    .venv/bin/python -m pytest tests/workflows/record_histories.py -q

Each scenario runs a conversation through the real parts (time-skipping server, PostgreSQL, the
scripted model over HTTP) and writes the histories of its runs; tests/workflows/test_replay.py replays them
and checks what each covers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client

from countersign.client.handles import wait_reply
from countersign.core.approvals import Decision, RejectSignal
from countersign.core.contract import (
    AnswerSignal,
    EndConversation,
    Limits,
    ServedCall,
    SubmitMessage,
    TurnResult,
)
from countersign.core.saga import RollbackRequest
from tests.e2e.test_hostile_input import raw
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import ECHO_RESULT, pending, qualify
from tests.fixtures.mcp import register, time_server
from tests.fixtures.postgres import reset_jane
from tests.fixtures.updates import execute_update
from tests.workflows.test_agent_workflow import FIND_JANE
from tests.workflows.test_saga import make_agent
from workflows.agent import AgentWorkflow

HISTORIES = Path(__file__).parent / "histories"
JANE = "jane.doe@example.com"


async def write(client: Client, name: str, workflow_id: str, run_id: str | None = None) -> None:
    """Write the history of one run (the latest when `run_id` is None) as
    tests/workflows/histories/NAME.json."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    (HISTORIES / f"{name}.json").write_text(history.to_json() + "\n")


async def reply_to(client: Client, workflow_id: str, message: SubmitMessage) -> TurnResult | None:
    """Send a message and wait for its reply (from whichever run answers it)."""
    await client.get_workflow_handle(workflow_id).signal(AgentWorkflow.submit_message, message)
    return await wait_reply(client, workflow_id, message.message_id or "")


async def next_run(client: Client, workflow_id: str, previous: str | None) -> str:
    """The run id of the run that continued `previous` as new, once it runs."""
    for _ in range(200):
        described = await client.get_workflow_handle(workflow_id).describe()
        if described.run_id != previous:
            return described.run_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"{workflow_id} did not continue as new")


async def test_lead_lookup_local_reads(agent: AgentHarness) -> None:
    """One turn: two local reads (search, get), three model calls."""
    agent.script(*FIND_JANE)
    handle = await agent.start("Find Jane Doe and tell me about her", single_turn=True)
    await handle.result()
    await write(agent.client, "lead_lookup_local_reads", handle.id)


async def test_direct_mode_asks_again_with_tools(agent: AgentHarness) -> None:
    """Direct mode: small talk goes without tools; the model calls one anyway, so the turn asks
    again with the tools (the marker stays out of the window), runs the read and answers."""
    agent.script(
        {"when": {"after_tool": "search_leads"}, "reply": {"content": "Jane is new."}},
        {
            "when": {"user_contains": "hello"},
            "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "jane"}}]},
        },
    )
    handle = await agent.start("hello there", single_turn=True)
    await handle.result()
    await write(agent.client, "direct_mode_asks_again", handle.id)


async def test_approved_status_change(agent: AgentHarness, db_engine: AsyncEngine) -> None:
    """A high-risk write waits for a reviewer (notice sent), is approved by `decide`, then runs."""
    await reset_jane(db_engine)
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    await pending(handle)
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id="c1", decision="approve", approver="bob")
    )
    await handle.result()
    await reset_jane(db_engine)
    await write(agent.client, "approved_status_change", handle.id)


async def test_rejected_and_expired_approvals(agent: AgentHarness) -> None:
    """Two writes in one batch: one rejected by signal, the other expires (an escalation notice)."""
    args = {"lead": JANE, "new_status": "qualified", "reason": "budget"}
    email = {"to": JANE, "subject": "Hi", "body": "Hello"}
    agent.script(
        {
            "when": {"user_contains": "both"},
            "reply": {
                "tool_calls": [
                    {"name": "update_lead_status", "arguments": args},
                    {"name": "send_email", "arguments": email},
                ]
            },
        },
        {"when": {"after_tool": "send_email"}, "reply": {"content": "neither ran"}},
    )
    handle = await agent.start("do both", single_turn=True, limits=Limits(approval_timeout_s=3600))
    await pending(handle, 2)
    await handle.signal(AgentWorkflow.reject, RejectSignal(call_id="c1", approver="bob"))
    await handle.result()  # time skips to the other's reminder and expiry
    await write(agent.client, "rejected_and_expired_approvals", handle.id)


async def test_question_answered(agent: AgentHarness) -> None:
    """`ask_human`: the user's answer arrives by signal, is proven and stored as the tool result."""
    agent.script(
        {
            "when": {"user_contains": "ask"},
            "reply": {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which Jane?"}}]},
        },
        {"when": {"after_tool": "ask_human"}, "reply": {"content": "Thanks."}},
    )
    handle = await agent.start("ask me", single_turn=True)
    for _ in range(200):
        if (await handle.query(AgentWorkflow.status)).pending_questions:
            break
        await asyncio.sleep(0.05)
    await handle.signal(
        AgentWorkflow.answer, AnswerSignal(call_id="c1", user_id="alice", text="the acme one")
    )
    await handle.result()
    await write(agent.client, "question_answered", handle.id)


async def test_rollback_of_a_turn(agent: AgentHarness, db_engine: AsyncEngine) -> None:
    """A write registered in the saga, undone by an authorized `rollback`, then `end`."""
    name = await make_agent(db_engine)
    task = {"name": "create_task", "arguments": {"title": "Replay follow-up"}}
    agent.script(
        {"when": {"user_contains": "please"}, "reply": {"tool_calls": [task]}},
        {"when": {"after_tool": "create_task"}, "reply": {"content": "ok"}},
    )
    handle = await agent.start("please", agent=name)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="turn"))
    for _ in range(200):
        if (await handle.query(AgentWorkflow.saga)).entries[0].state != "done":
            break
        await asyncio.sleep(0.05)
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()
    await write(agent.client, "rollback_of_a_turn", handle.id)


async def test_mcp_time_read(mcp_agent: tuple[AgentHarness, str], db_engine: AsyncEngine) -> None:
    """An MCP tool call (`execute_mcp_tool`, the snapshot's `mcp` field)."""
    harness, name = mcp_agent
    await register(db_engine, time_server(name), get_current_time="always_allow")
    call = {"name": "mcp__time__get_current_time", "arguments": {"timezone": "Europe/Paris"}}
    harness.script(
        {"when": {"user_contains": "time"}, "reply": {"tool_calls": [call]}},
        {"when": {"after_tool": "mcp__time__get_current_time"}, "reply": {"content": "done"}},
    )
    handle = await harness.start("what time is it in Paris?", agent=name, single_turn=True)
    await handle.result()
    await write(harness.client, "mcp_time_read", handle.id)


async def test_message_store_two_turns(agent: AgentHarness) -> None:
    """Two turns, a message delivered twice (answered once), then `end` by the user."""
    agent.script(*FIND_JANE)
    handle = await agent.start("Find Jane Doe and tell me about her")
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    again = SubmitMessage(user_id="alice", text="Find Jane Doe again", message_id="m2")
    await reply_to(agent.client, handle.id, again)
    await handle.signal(AgentWorkflow.submit_message, again)
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()
    await write(agent.client, "message_store_two_turns", handle.id)


async def test_refused_signals_sealed_carry(agent: AgentHarness) -> None:
    """Refused signals (unreadable, another tenant's user, a question nobody asked, a stranger's
    message) on the record; a sealed continue-as-new; the next run verifies it and a tenant admin
    ends the conversation."""
    agent.script(*FIND_JANE)
    handle = await agent.start("Find Jane Doe", limits=Limits(max_turns_per_run=2))
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    await handle.signal("approve", raw('{"call_id": "c1", "approver": "b\\u0000ob"}'))
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="dave"))
    await handle.signal(AgentWorkflow.answer, AnswerSignal(call_id="c9", user_id="bob", text="x"))
    await handle.signal(AgentWorkflow.submit_message, SubmitMessage(user_id="mallory", text="let me in"))
    await reply_to(
        agent.client, handle.id, SubmitMessage(user_id="alice", text="Find Jane Doe again", message_id="m2")
    )
    second_run = await next_run(agent.client, handle.id, handle.result_run_id)
    latest = agent.client.get_workflow_handle(handle.id, run_id=second_run)
    await latest.signal(AgentWorkflow.end, EndConversation(requested_by="carol"))
    await latest.result()
    await write(agent.client, "refused_signals_sealed_carry", handle.id, handle.result_run_id)
    await write(agent.client, "verified_carry_admin_end", handle.id, second_run)


async def test_tool_results_stored(agent: AgentHarness) -> None:
    """A stored result and a stored refusal (an unknown tool), carried by continue-as-new; the next
    run answers `wait_reply` for the earlier message from the store (`load_turn_reply`)."""
    calls = [
        {"name": "get_lead", "arguments": {"lead": JANE}},
        {"name": "no_such_tool", "arguments": {}},
    ]
    agent.script(
        {"when": {"user_contains": "first"}, "reply": {"tool_calls": calls}},
        {"when": {"user_contains": "second"}, "reply": {"tool_calls": calls[:1]}},
        {"when": {"after_tool": "get_lead"}, "reply": {"content": "read"}},
        {"when": {"after_tool": "no_such_tool"}, "reply": {"content": "refused"}},
    )
    handle = await agent.start(None, limits=Limits(max_turns_per_run=1))
    await reply_to(agent.client, handle.id, SubmitMessage(user_id="alice", text="first", message_id="m1"))
    second_run = await next_run(agent.client, handle.id, handle.result_run_id)
    second = agent.client.get_workflow_handle(handle.id, run_id=second_run)
    await execute_update(second, AgentWorkflow.wait_reply, "m1")  # answered from the store
    await reply_to(agent.client, handle.id, SubmitMessage(user_id="alice", text="second", message_id="m2"))
    await next_run(agent.client, handle.id, second_run)
    await agent.client.get_workflow_handle(handle.id).signal(
        AgentWorkflow.end, EndConversation(requested_by="alice")
    )
    await write(agent.client, "tool_results_stored_refusal_carried", handle.id, handle.result_run_id)
    await write(agent.client, "tool_results_stored_earlier_reply", handle.id, second_run)


async def test_served_call_approved(agent: AgentHarness, db_engine: AsyncEngine) -> None:
    """A client's own call (`serve_call`, Countersign as an MCP server): a high-risk write answers
    `waiting`, bob approves it by `decide`, and asking again (`resume`) answers with its result; then
    the user ends the conversation. Recorded after the `input-activity-ids` patch: it takes the new
    branch (tests/workflows/test_replay.py, RECORDED_AFTER)."""
    await reset_jane(db_engine)
    handle = await agent.start(None)
    arguments = json.dumps({"lead": JANE, "new_status": "qualified", "reason": "budget"})
    call = ServedCall(user_id="alice", call_id="s1", tool="update_lead_status", arguments=arguments)
    waiting = await execute_update(handle, AgentWorkflow.serve_call, call)
    assert waiting.state == "waiting", waiting
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id="s1", decision="approve", approver="bob")
    )
    done = await execute_update(handle, AgentWorkflow.serve_call, call.model_copy(update={"resume": True}))
    assert done.state == "done" and done.result is not None, done
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()
    await reset_jane(db_engine)
    await write(agent.client, "served_call_approved", handle.id)
