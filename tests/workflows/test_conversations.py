"""Conversations addressed by key, turns across continue-as-new, an end that meets one, idle timeout."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowExecutionStatus

from countersign.client.handles import keyed_workflow_id, send_keyed, wait_reply
from countersign.core.contract import Limits, StartConversation, SubmitMessage
from countersign.db.engine import session_factory
from countersign.db.messages import ConversationStore
from countersign.scripted_model.server import Fault
from tests.fixtures.agent import AgentHarness
from workflows.agent import AgentWorkflow

ECHO = [
    {"when": {"user_contains": "one"}, "reply": {"content": "first"}},
    {"when": {"user_contains": "two"}, "reply": {"content": "second"}},
    {"when": {"user_contains": "three"}, "reply": {"content": "third"}},
]


def message(text: str, user: str = "alice") -> SubmitMessage:
    return SubmitMessage(user_id=user, text=text, message_id=uuid.uuid4().hex)


async def test_concurrent_first_messages_reach_one_conversation(agent: AgentHarness) -> None:
    agent.script(*ECHO)
    key = f"telegram_{uuid.uuid4().int % 10**10}"
    start = StartConversation(tenant_id="acme", user_id="alice", agent="lead-qualifier")
    one, two = message("one"), message("two")
    handles = await asyncio.gather(
        send_keyed(agent.client, agent.settings, start, key, one),
        send_keyed(agent.client, agent.settings, start, key, two),
    )
    assert {h.id for h in handles} == {keyed_workflow_id("acme", key)}
    agent.track(handles[0].id)
    replies = await asyncio.gather(
        wait_reply(agent.client, handles[0].id, one.message_id or ""),
        wait_reply(agent.client, handles[0].id, two.message_id or ""),
    )
    assert sorted(r.reply or "" for r in replies if r) == [
        "[scripted model] first",
        "[scripted model] second",
    ]
    transcript = await agent.client.get_workflow_handle(handles[0].id).query(AgentWorkflow.transcript)
    assert sorted(m.content or "" for m in transcript if m.role == "user") == ["one", "two"]


async def test_turns_continue_as_new_carrying_state(agent: AgentHarness, db_engine: AsyncEngine) -> None:
    agent.script(*ECHO)
    key = f"web_{uuid.uuid4().hex[:8]}"
    start = StartConversation(
        tenant_id="acme", user_id="alice", agent="lead-qualifier", limits=Limits(max_turns_per_run=2)
    )
    handles = []
    for text, expected in (("one", "first"), ("two", "second"), ("three", "third")):
        sent = message(text)
        handles.append(await send_keyed(agent.client, agent.settings, start, key, sent))
        agent.track(handles[-1].id)
        reply = await wait_reply(agent.client, handles[-1].id, sent.message_id or "")
        assert reply is not None and reply.reply == f"[scripted model] {expected}"
    latest = agent.client.get_workflow_handle(handles[0].id)
    status = await latest.query(AgentWorkflow.status)
    assert status.turn == 3 and status.usage.model_calls == 3 and status.limits.max_turns_per_run == 2
    # the run carried a cursor, not the transcript: the whole conversation is in the store
    transcript = await ConversationStore(session_factory(db_engine)).latest(handles[0].id)
    assert transcript[0].role == "system"
    assert [m.content for m in transcript if m.role == "user"] == ["one", "two", "three"]
    assert [m.content for m in await latest.query(AgentWorkflow.transcript) if m.role == "user"] == ["three"]
    started = (await latest.fetch_history()).events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "the third turn ran in a continued run"
    assert (await latest.describe()).status == WorkflowExecutionStatus.RUNNING


async def test_an_end_accepted_during_a_turn_after_which_the_run_would_continue_ends_it(
    agent: AgentHarness,
) -> None:
    """The turn's end would continue the run as new (max_turns_per_run); the `end` accepted during
    the turn is not dropped with the run: the conversation ends, and no next run starts."""
    agent.script(*ECHO)
    agent.model.inject(Fault(delay_s=2))  # the turn is still asking the model when the end lands
    handle = await agent.start("one", limits=Limits(max_turns_per_run=1))
    for _ in range(200):  # the turn has started (it is counted when it starts)
        if (await handle.query(AgentWorkflow.status)).turn == 1:
            break
        await asyncio.sleep(0.05)
    await handle.signal("end", {"requested_by": "alice"})
    result = await asyncio.wait_for(handle.result(), timeout=60)
    assert (result.ended_by, result.turns, result.last_reply) == ("end by alice", 1, "[scripted model] first")
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED  # not continued as new


async def test_idle_conversation_ends_after_its_timeout(agent: AgentHarness) -> None:
    agent.script(*ECHO)
    handle = await agent.start("one", limits=Limits(idle_timeout_s=3600))
    result = await handle.result()  # time skips through the idle hour
    assert result.ended_by == "idle_timeout" and result.turns == 1
