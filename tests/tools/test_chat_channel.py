"""send_chat_message against a local chat receiver (aiohttp), a Telegram-bot-API-compatible endpoint
and a Slack-compatible webhook, on the real PostgreSQL, the real tool activity and, end to end, the
workflow with the scripted model and a reviewer's approval."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

import tools.chat
from activities.tools import ToolActivities
from countersign.core.approvals import Decision
from countersign.core.calls import CallerContext, ToolInvocation, ToolResult, call_key
from countersign.db.engine import session_factory
from countersign.db.schema import ChatChannel, ChatPost, ToolExecution
from countersign.runtime.endpoints import ALLOW_ENV
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import pending
from tests.fixtures.chat import TOKEN, Receiver, acme_channel
from tests.fixtures.updates import execute_update
from tools.arguments import parse_arguments
from tools.registry import REGISTRY, OutcomeUnknown, ToolContext, ToolFailure
from workflows.agent import AgentWorkflow


@pytest_asyncio.fixture(params=["telegram", "slack"])
async def channel(
    request: pytest.FixtureRequest, db_engine: AsyncEngine, chat_receiver: Receiver
) -> AsyncIterator[str]:
    """acme's channel on the receiver; every post and audit row of acme's chat removed afterwards."""
    async with acme_channel(db_engine, chat_receiver, request.param):
        yield request.param


def invocation(text: str = "Q3 pipeline: 2 new leads") -> ToolInvocation:
    return ToolInvocation(
        caller=CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="admin-assistant"),
        workflow_id=f"wf-{uuid.uuid4()}",
        run_id="run-1",
        call_id="c1",
        tool="send_chat_message",
        arguments=json.dumps({"text": text}),
        approved_by="bob",
    )


async def audit_of(db_engine: AsyncEngine, inv: ToolInvocation) -> ToolExecution:
    async with session_factory(db_engine)() as session:
        row = await session.scalar(select(ToolExecution).where(ToolExecution.workflow_id == inv.workflow_id))
    assert row is not None
    return row


async def posts_of(db_engine: AsyncEngine, inv: ToolInvocation) -> list[ChatPost]:
    async with session_factory(db_engine)() as session:
        key = f"{inv.workflow_id}:{inv.call_id}"
        return list(await session.scalars(select(ChatPost).where(ChatPost.idempotency_key == key)))


def no_secret_in(*texts: Any) -> None:
    for text in texts:
        dumped = json.dumps(text, default=str)
        assert TOKEN not in dumped and "SECRETHOOK" not in dumped and "127.0.0.1" not in dumped


def test_declared_high_risk_external_and_approval_gated() -> None:
    spec = REGISTRY["send_chat_message"].spec()
    assert (spec.risk, spec.category, spec.tier, spec.compensable) == (
        "high",
        "external",
        "needs_approval",
        False,
    )
    assert set(spec.parameters["properties"]) == {"text"}  # no address, channel or token from the model


async def test_posts_once_to_the_tenants_channel_and_audits_no_secret(
    db_engine: AsyncEngine, chat_receiver: Receiver, channel: str
) -> None:
    activities = ToolActivities(session_factory(db_engine))
    inv = invocation()
    first = await activities.execute_tool(inv)
    again = await activities.execute_tool(inv)  # a retried activity: the recorded result, no post
    assert isinstance(first, ToolResult) and first.ok and again == first
    (sent,) = chat_receiver.posts
    assert sent["key"] == f"{inv.workflow_id}:c1"
    if channel == "telegram":
        assert sent["json"] == {"chat_id": "-100200", "text": "Q3 pipeline: 2 new leads"}
        assert first.data["remote_id"] == "1001" and first.data["channel"] == "Sales group"
    else:
        assert sent["json"] == {"text": "Q3 pipeline: 2 new leads"} and first.data["remote_id"] is None
    (post,) = await posts_of(db_engine, inv)
    assert (post.status, post.kind, post.id) == ("sent", channel, first.data["post_id"])
    row = await audit_of(db_engine, inv)
    assert (row.outcome, row.approved_by) == ("executed", "bob")
    no_secret_in(row.args, row.result, first.model_dump())


async def test_an_attempt_after_a_lost_commit_does_not_post_again(
    db_engine: AsyncEngine, chat_receiver: Receiver, channel: str
) -> None:
    """The worker posted and died before the tool's transaction committed: the retried activity
    finds the committed claim and answers the post it made, without posting."""
    inv = invocation()
    sessions = session_factory(db_engine)
    async with sessions() as session:
        await session.begin()
        ctx = ToolContext(inv.caller, session, inv.workflow_id, inv.call_id, datetime.now(UTC))
        args = parse_arguments(REGISTRY["send_chat_message"], {"text": "once"})
        crashed = await REGISTRY["send_chat_message"].run(ctx, args)
        await session.rollback()  # the tool's own transaction (and audit row) never committed
    retried = await ToolActivities(sessions).execute_tool(inv)
    assert isinstance(retried, ToolResult) and retried.ok
    assert retried.data == crashed.model_dump(mode="json")
    assert len(chat_receiver.posts) == 1


async def test_a_refusing_channel_fails_the_call_without_naming_its_address(
    db_engine: AsyncEngine, chat_receiver: Receiver, channel: str
) -> None:
    chat_receiver.answer = "error"
    inv = invocation()
    result = await ToolActivities(session_factory(db_engine)).execute_tool(inv)
    assert isinstance(result, ToolResult) and result.error is not None
    assert result.error.message == f"the {channel} channel refused the message (HTTP 500)"
    (post,) = await posts_of(db_engine, inv)
    assert post.status == "failed"
    row = await audit_of(db_engine, inv)
    assert row.outcome == "failed"
    no_secret_in(row.result, row.error)


async def test_a_lost_answer_is_an_unknown_outcome_never_posted_again(
    db_engine: AsyncEngine, chat_receiver: Receiver, channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tools.chat, "POST_TIMEOUT_S", 0.3)
    chat_receiver.answer = "hang"
    inv = invocation()
    result = await ToolActivities(session_factory(db_engine)).execute_tool(inv)
    assert isinstance(result, ToolResult) and result.error is not None
    assert "may have been posted" in result.error.message
    assert (await audit_of(db_engine, inv)).outcome == "unknown"
    chat_receiver.answer = "ok"
    async with session_factory(db_engine)() as session, session.begin():  # an attempt whose commit was lost
        ctx = ToolContext(inv.caller, session, inv.workflow_id, inv.call_id, datetime.now(UTC))
        with pytest.raises(OutcomeUnknown):
            await REGISTRY["send_chat_message"].run(
                ctx, parse_arguments(REGISTRY["send_chat_message"], {"text": "x"})
            )
    assert len(chat_receiver.posts) == 1
    (post,) = await posts_of(db_engine, inv)
    assert post.status == "sending"


async def test_a_tenant_without_a_channel_is_told_so(db_engine: AsyncEngine) -> None:
    async with session_factory(db_engine)() as session, session.begin():
        caller = CallerContext(tenant_id="globex", user_id="dave", roles=["sales"], agent="admin-assistant")
        ctx = ToolContext(caller, session, "wf-none", "c1", datetime.now(UTC))
        with pytest.raises(ToolFailure) as failure:
            await REGISTRY["send_chat_message"].run(
                ctx, parse_arguments(REGISTRY["send_chat_message"], {"text": "x"})
            )
    assert failure.value.code == "NOT_FOUND"


async def test_the_admin_assistant_posts_after_a_reviewer_approves(
    agent: AgentHarness, db_engine: AsyncEngine, chat_receiver: Receiver, channel: str
) -> None:
    """End to end: the seeded admin assistant, the scripted model over HTTP, the workflow's
    approval gate, the tool activity, the chat_receiver."""
    agent.script(
        {
            "when": {"user_contains": "tell the team"},
            "reply": {"tool_calls": [{"name": "send_chat_message", "arguments": {"text": "Initech signed"}}]},
        },
        {"when": {"after_tool": "send_chat_message"}, "reply": {"content": "Posted to the team channel."}},
    )
    handle = await agent.start("tell the team Initech signed", agent="admin-assistant", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    assert waiting.tool == "send_chat_message" and waiting.risk == "high"
    assert chat_receiver.posts == [], "nothing is posted before a decision"
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    )
    result = await handle.result()
    assert (result.last_reply or "").endswith("Posted to the team channel.")
    (sent,) = chat_receiver.posts
    assert sent["json"]["text"] == "Initech signed" and sent["key"] == call_key(
        handle.id, handle.first_execution_run_id or "", waiting.call_id
    )
    async with session_factory(db_engine)() as session:
        row = await session.scalar(select(ToolExecution).where(ToolExecution.workflow_id == handle.id))
    assert row is not None and (row.outcome, row.approved_by) == ("executed", "bob")
    no_secret_in(row.args, row.result)


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9", "ftp://chat.example/x", "http://[::1"])
async def test_an_endpoint_that_cannot_be_reached_posts_nothing_and_shows_no_address(
    db_engine: AsyncEngine, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOW_ENV, "127.0.0.0/8, ::1")  # allowed, so what is tested is the reach
    async with db_engine.begin() as conn:
        await conn.execute(
            insert(ChatChannel).values(tenant_id="acme", kind="slack", endpoint=endpoint, name="#sales")
        )
    try:
        inv = invocation()
        result = await ToolActivities(session_factory(db_engine)).execute_tool(inv)
        assert isinstance(result, ToolResult) and result.error is not None
        assert result.error.message == "the slack channel could not be reached; nothing was posted"
        assert [p.status for p in await posts_of(db_engine, inv)] == ["failed"]
        assert (await audit_of(db_engine, inv)).outcome == "failed"
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(ChatChannel).where(ChatChannel.tenant_id == "acme"))
            await conn.execute(delete(ChatPost).where(ChatPost.tenant_id == "acme"))
            await conn.execute(delete(ToolExecution).where(ToolExecution.workflow_id == inv.workflow_id))
