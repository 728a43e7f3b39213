"""Tool results in the conversation store, on real parts (the time-skipping Temporal server,
PostgreSQL, the scripted model over HTTP): the activity that produces a result stores it and
workflow history keeps only its envelope; the model and the transcript still get the whole
result; `wait_reply` answers a message an earlier run replied to with the reply's text."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.api.history.v1 import HistoryEvent

from activities.audit import AuditActivities
from countersign.client.ended import full_transcript
from countersign.core.calls import CallerContext, ToolInvocation, ToolResult, UnexecutedCall, stored_at
from countersign.core.contract import Limits, SubmitMessage, TurnResult
from countersign.db.engine import session_factory
from countersign.db.messages import ConversationStore
from countersign.db.schema import Task
from tests.fixtures.agent import AgentHarness
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow

ROWS = 50
FILLER = "a task description long enough to make fifty rows a big result " * 2


@pytest.fixture
async def big_tasks(db_engine: AsyncEngine) -> AsyncIterator[tuple[str, str]]:
    """50 acme tasks whose titles carry a marker of their own (the query names it) and whose
    descriptions another (only a result can hold it): a 50-row query_records result is the
    largest a tool may answer (truncated to 8 000 characters)."""
    marker, inside = f"BIGROW{uuid.uuid4().hex[:8]}", f"ROWBODY{uuid.uuid4().hex[:8]}"
    rows = [
        {
            "tenant_id": "acme",
            "title": f"{marker} task {i:02}",
            "description": f"{inside} {FILLER}",
            "created_by": "tests",
        }
        for i in range(ROWS)
    ]
    async with db_engine.begin() as conn:
        await conn.execute(insert(Task).values(rows))
    yield marker, inside
    async with db_engine.begin() as conn:
        await conn.execute(delete(Task).where(Task.title.startswith(marker)))


def query(marker: str) -> dict[str, Any]:
    filters = [{"field": "title", "op": "contains", "value": marker}]
    arguments = {"collection": "tasks", "filters": filters, "order_by": [], "limit": ROWS}
    return {"name": "query_records", "arguments": arguments}


def payload_bytes(event: HistoryEvent) -> bytes:
    """Everything the event records, payloads as raw bytes (not base64 as in its JSON form)."""
    return event.SerializeToString()


async def test_a_big_tool_result_stays_out_of_history_but_reaches_the_model_and_transcript(
    agent: AgentHarness, db_engine: AsyncEngine, big_tasks: tuple[str, str]
) -> None:
    marker, inside = big_tasks
    unknown = {"name": "no_such_tool", "arguments": {}}  # refused by the workflow, in the same batch
    # (first: `result_contains` reads the latest tool message)
    agent.script(
        {
            "when": {"user_contains": "list the tasks", "turn_calls": 0},
            "reply": {"tool_calls": [unknown, query(marker)]},
        },
        {
            "when": {"after_tool": "query_records", "result_contains": f"{marker} task 00"},
            "reply": {"content": "I read the tasks."},
        },
    )
    handle = await agent.start("list the tasks", agent="admin-assistant", single_turn=True)
    result = await handle.result()
    assert result.last_reply == "[scripted model] I read the tasks."  # result_contains matched

    # the store holds the whole result, where the workflow allocated it: right after the call
    stored = await ConversationStore(session_factory(db_engine)).latest(handle.id)
    tools = [m for m in stored if m.role == "tool"]
    assert [(m.tool_call_id, m.name) for m in tools] == [("c1", "no_such_tool"), ("c2", "query_records")]
    assert json.loads(tools[0].content or "")["error"]["code"] == "UNKNOWN_TOOL"
    body = tools[1].content or ""
    assert len(body) > 6_000 and f"{marker} task 00" in body and inside in body, len(body)
    assert [m.role for m in stored[-4:]] == ["assistant", "tool", "tool", "assistant"]

    # workflow history: the tool activity's result is a small envelope, no event holds a row
    events = (await handle.fetch_history()).events
    assert not [e.event_id for e in events if inside.encode() in payload_bytes(e)]
    executed = [
        e.activity_task_completed_event_attributes.result.payloads[0].data
        for e in events
        if e.HasField("activity_task_completed_event_attributes")
    ]
    markers = [
        p.data
        for e in events
        if e.HasField("marker_recorded_event_attributes")
        for details in e.marker_recorded_event_attributes.details.values()
        for p in details.payloads
    ]
    envelopes = [json.loads(d) for d in executed + markers if b'"call_id":"c2"' in d]
    assert len(envelopes) == 1 and envelopes[0]["ok"] and envelopes[0]["tool"] == "query_records"
    assert envelopes[0]["tokens"] > 1_500  # the window still counts the body it does not hold
    assert len(json.dumps(envelopes[0])) < 300, envelopes

    # the model got the whole result, loaded from the store
    sent = agent.model.requests[-1]["messages"]
    assert any(m["role"] == "tool" and m["content"] == body for m in sent)

    # the transcript query shows the envelope and where the body is; the clients fill it in
    queried = await handle.query(AgentWorkflow.transcript)
    stub = next(m for m in queried if m.tool_call_id == "c2")
    assert stored_at(stub.content) is not None and inside not in (stub.content or "")
    assert next(m for m in await agent.transcript(handle) if m.tool_call_id == "c2").content == body
    whole = await full_transcript(agent.client, agent.settings, handle.id)
    assert next(m for m in whole if m.tool_call_id == "c2").content == body


async def reply_to(agent: AgentHarness, workflow_id: str, message_id: str) -> TurnResult:
    """`wait_reply` on the conversation's latest run, asked again when the run it reached
    continued as new first (it then answers None)."""
    for _ in range(5):
        latest = agent.client.get_workflow_handle(workflow_id)
        replied = await execute_update(latest, AgentWorkflow.wait_reply, message_id)
        if replied is not None:
            return replied
    raise AssertionError(f"no reply to {message_id}")


def reply_loads(events: Any) -> int:
    return sum(
        e.HasField("marker_recorded_event_attributes") and b"load_turn_reply" in e.SerializeToString()
        for e in events
    )


async def test_wait_reply_answers_with_the_reply_of_an_earlier_run(agent: AgentHarness) -> None:
    agent.script(
        {"when": {"user_contains": "first"}, "reply": {"content": "the first reply"}},
        {
            "when": {"user_contains": "second", "turn_calls": 0},
            "reply": {"tool_calls": [{"name": "get_lead", "arguments": {"lead": "jane.doe@example.com"}}]},
        },
        {
            "when": {"after_tool": "get_lead"},
            "reply": {"tool_calls": [{"name": "get_lead", "arguments": {"lead": "jane.doe@example.com"}}]},
        },
    )
    handle = await agent.start(None, limits=Limits(max_turns_per_run=1, max_iterations=2))
    await handle.signal(
        AgentWorkflow.submit_message, SubmitMessage(user_id="alice", text="first", message_id="m1")
    )
    replied = await reply_to(agent, handle.id, "m1")
    assert replied.reply == "[scripted model] the first reply"

    latest = agent.client.get_workflow_handle(handle.id)  # continued as new after turn 1
    await latest.signal(
        AgentWorkflow.submit_message, SubmitMessage(user_id="alice", text="second", message_id="m2")
    )
    limited = await reply_to(agent, handle.id, "m2")
    assert limited.stop == "limit_reached" and limited.turn == 2, limited

    # both were answered by earlier runs now: the reply text, how the turn stopped, its usage
    earlier = await reply_to(agent, handle.id, "m1")
    assert (earlier.turn, earlier.reply, earlier.stop) == (1, "[scripted model] the first reply", "completed")
    assert earlier.usage.model_calls == 1
    again = await reply_to(agent, handle.id, "m2")
    assert (again.turn, again.stop, again.reply) == (2, "limit_reached", limited.reply)
    assert again.usage.model_calls == 2 and again.usage.tool_calls == 2, again.usage
    # asked again, read once: the run keeps what it read from the store
    await reply_to(agent, handle.id, "m1")
    newest = agent.client.get_workflow_handle(handle.id)
    assert reply_loads((await newest.fetch_history()).events) == 2


async def test_a_refusal_of_a_name_postgresql_cannot_hold_is_stored_with_its_audit_row(
    db_engine: AsyncEngine,
) -> None:
    """A model may name a tool with a NUL in it: the refusal is audited and stored (NUL replaced),
    never a database error retried until the turn fails."""
    invocation = ToolInvocation(
        caller=CallerContext(tenant_id="acme", user_id="alice", roles=[], agent="lead-qualifier"),
        workflow_id=f"test-{uuid.uuid4()}",
        run_id="run",
        call_id="c1",
        tool="get\x00lead",
        arguments="{}",
        store_seq=3,
    )
    refusal = ToolResult.failure("UNKNOWN_TOOL", "no tool named 'get\x00lead'")
    audit = AuditActivities(session_factory(db_engine))
    for _ in range(2):  # a retry changes nothing
        await audit.record_unexecuted_call(UnexecutedCall(invocation=invocation, result=refusal))
    stored = await ConversationStore(session_factory(db_engine)).load(
        invocation.workflow_id, invocation.conversation_id
    )
    assert [(m.role, m.name, m.tool_call_id) for m in stored] == [("tool", "get\ufffdlead", "c1")]
    assert json.loads(stored[0].content or "")["error"]["code"] == "UNKNOWN_TOOL"
