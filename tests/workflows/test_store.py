"""The conversation store on real parts: the time-skipping Temporal server, PostgreSQL, and the
scripted model over HTTP. Bodies leave history, the window and summary bound what the model sees,
budgets refuse model calls, a redelivered message is answered once, and an ended conversation
still shows its transcript and can be rolled back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import delete, insert, text
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.client.ended import roll_back_ended, stored_transcript
from countersign.client.handles import render_transcript
from countersign.core.contract import Limits, SubmitMessage
from countersign.core.saga import RollbackRequest
from countersign.db.engine import session_factory
from countersign.db.messages import ConversationStore
from countersign.db.schema import AgentProfile, AgentToolPermission, ContextPolicy, TenantTokenBudget
from tests.fixtures.agent import AgentHarness
from tests.fixtures.updates import execute_update
from tests.workflows.test_saga import WRITES, clean, snapshot  # noqa: F401  (a fixture, used by name)
from workflows.agent import AgentWorkflow

AGENT = "store-test"
PASTE = "PASTED-" + "lorem ipsum " * 250  # ~3 KB of pasted text


async def make_agent(engine: AsyncEngine, scratch: list[str], **policy: Any) -> str:
    """An agent with the saga test's writes (always allowed) and `policy` as its context policy."""
    scratch.append(AGENT)
    async with engine.begin() as conn:
        await conn.execute(
            insert(AgentProfile).values(name=AGENT, description="tests", system_prompt="You test the store.")
        )
        for tool in ("create_task", "create_event", "update_lead_status", "send_email"):
            await conn.execute(
                insert(AgentToolPermission).values(agent=AGENT, tool=tool, tier="always_allow")
            )
        if policy:
            await conn.execute(insert(ContextPolicy).values(agent=AGENT, **policy))
    return AGENT


@pytest.fixture
async def tenant_budget(db_engine: AsyncEngine) -> AsyncIterator[None]:
    """globex may spend one token more today than it has: its next model call spends it."""
    used, _ = await ConversationStore(session_factory(db_engine)).tokens_today("globex")
    async with db_engine.begin() as conn:
        await conn.execute(insert(TenantTokenBudget).values(tenant_id="globex", tokens_per_day=used + 1))
    yield
    async with db_engine.begin() as conn:
        await conn.execute(delete(TenantTokenBudget).where(TenantTokenBudget.tenant_id == "globex"))


ECHO = [{"when": {"user_contains": f"msg{i}"}, "reply": {"content": f"reply{i}"}} for i in range(12)]


def message(text: str, message_id: str | None = None) -> SubmitMessage:
    return SubmitMessage(user_id="alice", text=text, message_id=message_id or uuid.uuid4().hex)


async def converse(handle: Any, texts: list[str]) -> None:
    for i, text_ in enumerate(texts, 2):
        await handle.signal(AgentWorkflow.submit_message, message(text_))
        await execute_update(handle, AgentWorkflow.wait_turn, i)


async def test_history_carries_no_message_bodies(
    agent: AgentHarness, db_engine: AsyncEngine, scratch: list[str]
) -> None:
    name = await make_agent(db_engine, scratch)
    agent.script(
        {"when": {"user_contains": "PASTED"}, "reply": {"tool_calls": [WRITES[1]]}},
        {"when": {"after_tool": "create_task"}, "reply": {"content": "task created"}},
        *ECHO,
    )
    handle = await agent.start(f"msg0 {PASTE}", agent=name)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    await converse(handle, [f"msg1 {PASTE}", f"msg2 {PASTE}"])
    # a model call's input is sequence numbers and tool names: no pasted text, a few hundred bytes
    inputs = [
        e.activity_task_scheduled_event_attributes.input.payloads[0].data
        for e in (await handle.fetch_history()).events
        if e.activity_task_scheduled_event_attributes.activity_type.name == "call_model"
    ]
    assert len(inputs) == 6 and all(b"lorem" not in i and len(i) < 600 for i in inputs)
    stored = await ConversationStore(session_factory(db_engine)).latest(handle.id)
    assert stored[0].role == "system" and [m.role for m in stored].count("user") == 3
    assert any(m.role == "tool" and m.name == "create_task" for m in stored)
    # the model got the whole conversation, loaded from the store
    last = agent.model.requests[-1]["messages"]
    assert [m["role"] for m in last][:2] == ["system", "user"] and any(
        "msg2" in (m["content"] or "") for m in last
    )


async def test_window_and_running_summary(
    agent: AgentHarness, db_engine: AsyncEngine, scratch: list[str]
) -> None:
    name = await make_agent(db_engine, scratch, window_messages=4, summarize=True)
    agent.script(
        {"when": {"user_contains": "user (alice): msg0"}, "reply": {"content": "they said msg0 and msg1"}},
        *ECHO,
    )
    handle = await agent.start("msg0", agent=name)
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    await converse(handle, ["msg1", "msg2", "msg3"])
    last = agent.model.requests[-1]["messages"]
    assert last[0]["role"] == "system" and last[1]["content"].startswith(
        "Summary of the earlier conversation"
    )
    assert [m["content"] for m in last[2:]] == [
        "[scripted model] reply1",
        "msg2",
        "[scripted model] reply2",
        "msg3",
    ]
    transcript = render_transcript(await stored_transcript(agent.settings, handle.id), scripted=False)
    assert (
        "summary> Summary of the earlier conversation: [scripted model] they said msg0 and msg1" in transcript
    )
    # three messages folded at once (half the window kept): one summarizing call, not one per turn
    assert sum(r["messages"][0]["content"].startswith("Summarize") for r in agent.model.requests) == 1
    status = await handle.query(AgentWorkflow.status)
    assert status.policy is not None and status.policy.window_messages == 4


async def test_conversation_budget_refuses_the_next_model_call(
    agent: AgentHarness, db_engine: AsyncEngine, scratch: list[str]
) -> None:
    name = await make_agent(db_engine, scratch, conversation_tokens=5)
    agent.script(*ECHO)
    handle = await agent.start("msg0", agent=name)
    first = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert first is not None and first.stop == "completed"
    await handle.signal(AgentWorkflow.submit_message, message("msg1"))
    second = await execute_update(handle, AgentWorkflow.wait_turn, 2)
    assert second is not None and second.stop == "limit_reached"
    assert (
        second.reply
        and "LIMIT_REACHED: the conversation used" in second.reply
        and "budget is 5" in second.reply
    )
    assert len(agent.model.requests) == 1


async def test_tenant_daily_budget_refuses_model_calls(
    agent: AgentHarness, db_engine: AsyncEngine, tenant_budget: None
) -> None:
    agent.script(*ECHO)
    handle = await agent.start("msg0", tenant="globex", user="dave")
    first = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert first is not None and first.stop == "completed"
    await handle.signal(AgentWorkflow.submit_message, SubmitMessage(user_id="dave", text="msg1"))
    second = await execute_update(handle, AgentWorkflow.wait_turn, 2)
    assert second is not None and second.stop == "limit_reached"
    assert (
        second.reply
        and "tenant globex used" in second.reply
        and "per day (tenant_token_budgets)" in second.reply
    )


async def test_a_redelivered_message_is_answered_once_across_continue_as_new(
    agent: AgentHarness, db_engine: AsyncEngine
) -> None:
    agent.script(*ECHO)
    handle = await agent.start(None, limits=Limits(max_turns_per_run=1))
    again = message("msg1", "fixed-id")
    await handle.signal(AgentWorkflow.submit_message, again)
    await handle.signal(AgentWorkflow.submit_message, again)  # in the inbox still: dropped
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    latest = agent.client.get_workflow_handle(handle.id)  # continued as new after turn 1
    await latest.signal(AgentWorkflow.submit_message, again)  # answered in the previous run
    await latest.signal(AgentWorkflow.submit_message, message("msg2"))
    assert (await execute_update(latest, AgentWorkflow.wait_turn, 2)).reply == "[scripted model] reply2"  # type: ignore[union-attr]
    assert len(agent.model.requests) == 2
    replied = await execute_update(latest, AgentWorkflow.wait_reply, "fixed-id")
    assert replied is not None and replied.turn == 1
    stored = await ConversationStore(session_factory(db_engine)).latest(handle.id)
    assert [m.content for m in stored if m.role == "user"] == ["msg1", "msg2"]


@pytest.mark.usefixtures("clean")
async def test_ended_conversation_shows_its_transcript_and_rolls_back_once(
    agent: AgentHarness, db_engine: AsyncEngine, scratch: list[str]
) -> None:
    name = await make_agent(db_engine, scratch)
    agent.script(
        {"when": {"user_contains": "do it"}, "reply": {"tool_calls": WRITES[1:3]}},
        {"when": {"after_tool": "create_event"}, "reply": {"content": "done"}},
    )
    before = await snapshot(db_engine)
    handle = await agent.start("do it", agent=name, single_turn=True)
    await handle.result()
    assert (await snapshot(db_engine))["tasks"] != before["tasks"]

    transcript = render_transcript(await stored_transcript(agent.settings, handle.id), scripted=False)
    assert (
        "alice> do it" in transcript
        and "← create_task [c1]" in transcript
        and "agent> [scripted model] done" in transcript
    )

    refused = await roll_back_ended(
        agent.client, agent.settings, handle.id, RollbackRequest(requested_by="bob", scope="conversation")
    )
    assert refused.refused and not refused.entries
    outcome = await roll_back_ended(
        agent.client, agent.settings, handle.id, RollbackRequest(requested_by="alice", scope="conversation")
    )
    assert [(e.call_id, e.state) for e in outcome.entries] == [("c2", "done"), ("c1", "done")]
    after = await snapshot(db_engine)
    assert after["tasks"] == before["tasks"] and after["events"] == before["events"]
    again = await roll_back_ended(
        agent.client, agent.settings, handle.id, RollbackRequest(requested_by="alice", scope="conversation")
    )
    assert again.entries == [] and again.refused is None  # exactly once
    async with db_engine.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT count(*) FROM compensations WHERE workflow_id = :w"), {"w": handle.id}
            )
        ).scalar()
    assert rows == 2
