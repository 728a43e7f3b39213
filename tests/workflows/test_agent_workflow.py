"""AgentWorkflow end to end on real parts: time-skipping Temporal, embedded PostgreSQL, the real
`openai` client talking HTTP to the scripted model."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowUpdateStage

from countersign.core.contract import EndConversation, Limits, SubmitMessage, TurnResult
from countersign.core.messages import ChatMessage
from countersign.db.schema import ToolExecution
from tests.fixtures.agent import AgentHarness
from tests.fixtures.updates import execute_update, start_update
from workflows.agent import AgentWorkflow

FIND_JANE = (
    {
        "when": {"user_contains": "jane"},
        "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane"}}]},
    },
    {
        "when": {"after_tool": "search_leads", "result_contains": "jane.doe@example.com"},
        "reply": {"tool_calls": [{"name": "get_lead", "arguments": {"lead": "jane.doe@example.com"}}]},
    },
    {"when": {"after_tool": "get_lead"}, "reply": {"content": "Jane Doe is a new lead."}},
)


def tool_results(transcript: list[ChatMessage]) -> list[dict[str, Any]]:
    return [json.loads(m.content or "") for m in transcript if m.role == "tool"]


async def audit_rows(engine: AsyncEngine, workflow_id: str) -> list[ToolExecution]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(ToolExecution).where(ToolExecution.workflow_id == workflow_id).order_by(ToolExecution.id)
        )
        return list(rows)  # type: ignore[arg-type]


async def test_one_turn_searches_reads_and_answers(
    agent: AgentHarness, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    agent.script(*FIND_JANE)
    handle = await agent.start("Find Jane Doe and tell me about her", single_turn=True)
    result = await handle.result()

    assert result.last_reply == "[scripted model] Jane Doe is a new lead."
    assert result.usage.model_calls == 3 and result.usage.tool_calls == 2
    transcript = await agent.transcript(handle)
    assert [m.role for m in transcript] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    search, lead = tool_results(transcript)
    assert search["ok"] and any(row["email"] == "jane.doe@example.com" for row in search["data"]["leads"])
    assert lead == {"ok": True, "data": lead["data"]} and lead["data"]["status"] == "new"
    # the model saw tools with strict schemas and our own call ids
    request = agent.model.requests[0]
    assert {t["function"]["name"] for t in request["tools"]} >= {"search_leads", "get_lead"}
    assert all(t["function"]["parameters"]["additionalProperties"] is False for t in request["tools"])
    assert [c.id for m in transcript for c in m.tool_calls] == ["c1", "c2"]

    rows = await audit_rows(db_engine, handle.id)
    assert [(r.call_id, r.tool, r.outcome, r.tenant_id) for r in rows] == [
        ("c1", "search_leads", "executed", "acme"),
        ("c2", "get_lead", "executed", "acme"),
    ]


async def test_acme_search_never_returns_globex_rows(agent: AgentHarness, db_engine: AsyncEngine) -> None:
    agent.script(
        {
            "when": {"turn_calls": 0},
            "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "e"}}]},
        },
        {"when": {"after_tool": "search_leads"}, "reply": {"content": "done"}},
    )
    for tenant, user in (("acme", "alice"), ("globex", "dave")):
        handle = await agent.start("list everyone", tenant=tenant, user=user, single_turn=True)
        await handle.result()
        (found,) = tool_results(await agent.transcript(handle))
        ids = {row["id"] for row in found["data"]["leads"]}
        async with db_engine.connect() as conn:
            from countersign.db.schema import Lead

            tenants = set((await conn.execute(select(Lead.tenant_id).where(Lead.id.in_(ids)))).scalars())
        assert tenants == {tenant}, f"{tenant}'s search returned rows of {tenants}"


async def test_bad_model_output_is_fed_back_not_fatal(agent: AgentHarness) -> None:
    agent.script(
        {
            "when": {"turn_calls": 0},
            "reply": {
                "tool_calls": [
                    {"name": "drop_database", "arguments": {}},
                    {
                        "name": "get_lead",
                        "arguments": {"lead": "jane.doe@example.com", "tenant_id": "globex"},
                    },
                    {"name": "search_leads", "arguments": {"query": "x", "limit": 500}},
                    {"name": "get_lead", "arguments": {"lead": "nobody@nowhere.example"}},
                ]
            },
        },
        {"when": {"after_tool": "get_lead", "turn_calls": 4}, "reply": {"content": "I could not do that."}},
    )
    handle = await agent.start("do something odd", single_turn=True)
    result = await handle.result()
    assert result.last_reply == "[scripted model] I could not do that."
    unknown, identity, too_many, missing = tool_results(await agent.transcript(handle))
    assert unknown["error"]["code"] == "UNKNOWN_TOOL"
    assert identity["error"]["code"] == "VALIDATION_ERROR"
    assert (
        "tenant_id" in identity["error"]["message"] and "never from arguments" in identity["error"]["message"]
    )
    assert too_many["error"]["code"] == "VALIDATION_ERROR" and "limit" in too_many["error"]["message"]
    assert missing["error"]["code"] == "NOT_FOUND"


async def test_iteration_limit_ends_the_turn(agent: AgentHarness) -> None:
    agent.script(
        {
            "when": {"user_contains": "loop"},
            "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "a"}}]},
        },
        {
            "when": {"after_tool": "search_leads"},
            "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "b"}}]},
        },
    )
    handle = await agent.start("loop forever", single_turn=True, limits=Limits(max_iterations=3))
    result = await handle.result()
    assert result.last_reply is not None and result.last_reply.startswith("LIMIT_REACHED")
    assert "max_iterations (3" in result.last_reply
    assert result.usage.model_calls == 3


async def test_conversation_takes_turns_until_ended(agent: AgentHarness) -> None:
    agent.script(
        {"when": {"user_contains": "hello"}, "reply": {"content": "Hi!"}},
        {
            "when": {"user_contains": "jane"},
            "reply": {"tool_calls": [{"name": "get_lead", "arguments": {"lead": "jane.doe@example.com"}}]},
        },
        {"when": {"after_tool": "get_lead"}, "reply": {"content": "Jane is new."}},
    )
    handle = await agent.start("hello")
    first = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert isinstance(first, TurnResult) and first.reply == "[scripted model] Hi!"
    assert (await handle.query(AgentWorkflow.status)).state == "idle"

    await handle.signal(AgentWorkflow.submit_message, SubmitMessage(user_id="mallory", text="ignore me"))
    await handle.signal(AgentWorkflow.submit_message, SubmitMessage(user_id="alice", text="and jane?"))
    second = await execute_update(handle, AgentWorkflow.wait_turn, 2)
    assert second is not None and second.reply == "[scripted model] Jane is new." and second.turn == 2

    update = await start_update(
        handle, AgentWorkflow.wait_turn, 3, wait_for_stage=WorkflowUpdateStage.ACCEPTED
    )
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    assert await update.result() is None
    result = await handle.result()
    assert result.turns == 2 and result.ended_by == "end by alice"
    status = await handle.query(AgentWorkflow.status)
    assert status.state == "ended" and status.usage.tool_calls == 1
