"""send_email end to end: approval, the undo window, delivery to a real SMTP server, cancellation."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.approvals import Decision
from countersign.core.calls import call_key
from countersign.core.contract import EndConversation
from countersign.core.saga import RollbackRequest
from countersign.db.instances import instance_of
from countersign.db.schema import EmailOutbox
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import pending
from tests.fixtures.smtp import SmtpServer
from tests.fixtures.updates import execute_update
from tests.workflows.test_saga import rolled_back
from workflows.agent import AgentWorkflow

SEND = {"to": "jane.doe@example.com", "subject": "Your demo", "body": "Tuesday works for us."}
RULES = (
    {
        "when": {"user_contains": "email"},
        "reply": {"tool_calls": [{"name": "send_email", "arguments": SEND}]},
    },
    {"when": {"after_tool": "send_email"}, "reply": {"content": "sent"}},
)


async def outbox_status(engine: AsyncEngine, workflow_id: str) -> str:
    async with engine.connect() as conn:
        key = call_key(workflow_id, await instance_of(conn, workflow_id), "c1")
        return (
            await conn.execute(select(EmailOutbox.status).where(EmailOutbox.idempotency_key == key))
        ).scalar_one()


async def test_an_approved_email_is_delivered_after_its_undo_window(
    agent: AgentHarness, db_engine: AsyncEngine, smtp_server: SmtpServer
) -> None:
    agent.script(*RULES)
    handle = await agent.start("email jane", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    )
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert await outbox_status(db_engine, handle.id) == "queued" and not smtp_server.messages
    await handle.result()  # the time-skipping server jumps the undo window
    assert await outbox_status(db_engine, handle.id) == "sent"
    (message,) = smtp_server.messages
    assert message["To"] == "jane.doe@example.com" and message["Subject"] == "Your demo"


async def test_rolling_back_within_the_window_cancels_the_email(
    agent: AgentHarness, db_engine: AsyncEngine, smtp_server: SmtpServer
) -> None:
    agent.script(*RULES)
    handle = await agent.start("email jane")
    (waiting,) = (await pending(handle)).pending_approvals
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    )
    await execute_update(handle, AgentWorkflow.wait_turn, 1)
    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="turn"))
    saga = await rolled_back(agent, handle)
    assert [(e.tool, e.state) for e in saga.entries] == [("send_email", "done")]
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()
    assert await outbox_status(db_engine, handle.id) == "cancelled" and not smtp_server.messages
