"""The admin assistant's seeded context policy, end to end: the last 20 messages reach the model,
and an idle conversation expires after 24 hours. Nothing here builds a policy or passes limits:
what applies is what `db seed` stored (context_policies, agent_profiles.limits) and the defaults."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.testing import WorkflowEnvironment

from countersign.client.handles import send_keyed, wait_reply
from countersign.core.contract import ConversationResult, StartConversation, SubmitMessage
from countersign.db.engine import session_factory
from countersign.db.schema import ContextPolicy
from tests.fixtures.agent import AgentHarness
from workflows.agent import AgentWorkflow

DAY = timedelta(hours=24)


async def test_seeded_window_of_20_messages_and_24_hour_expiry(
    agent: AgentHarness, db_engine: AsyncEngine, temporal_env: WorkflowEnvironment
) -> None:
    async with session_factory(db_engine)() as session:
        seeded = await session.scalar(select(ContextPolicy).where(ContextPolicy.agent == "admin-assistant"))
    assert seeded is not None and seeded.window_messages == 20  # the policy under test is the seed's

    agent.script({"reply": {"content": "noted"}})
    start = StartConversation(tenant_id="acme", user_id="alice", agent="admin-assistant")
    key = f"policy_{uuid.uuid4().hex[:8]}"
    texts = [f"note number {i}" for i in range(12)]  # 24 messages: past the window
    for text in texts:
        sent = SubmitMessage(user_id="alice", text=text, message_id=uuid.uuid4().hex)
        handle = await send_keyed(agent.client, agent.settings, start, key, sent)
        agent.track(handle.id)
        assert await wait_reply(agent.client, handle.id, sent.message_id or "") is not None

    seen = agent.model.requests[-1]["messages"]
    assert seen[0]["role"] == "system"
    window = seen[1:]
    assert 17 <= len(window) <= 20 and window[0]["role"] != "tool"  # a result stays with its call
    users = [m["content"] for m in window if m["role"] == "user"]
    assert users == texts[-len(users) :] and "note number 0" not in users
    status = await agent.client.get_workflow_handle(handle.id).query(AgentWorkflow.status)
    assert status.limits.idle_timeout_s == DAY.total_seconds()

    idle_since = await temporal_env.get_current_time()
    conversation = agent.client.get_workflow_handle(handle.id, result_type=ConversationResult)
    await temporal_env.sleep(DAY - timedelta(minutes=1))
    assert (await conversation.query(AgentWorkflow.status)).state == "idle"  # a minute short: still there
    await temporal_env.sleep(timedelta(minutes=2))
    result = await conversation.result()
    assert result.ended_by == "idle_timeout" and result.turns == len(texts)
    closed = (await conversation.describe()).close_time
    assert closed is not None
    assert DAY - timedelta(seconds=5) <= closed - idle_since < DAY + timedelta(minutes=1)
