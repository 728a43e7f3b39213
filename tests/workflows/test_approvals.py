"""Human approval on real parts: decisions by update and signal, timers on the time-skipping server."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowUpdateFailedError

from countersign.core.approvals import ApproveSignal, Decision, RejectSignal
from countersign.core.calls import ApproverEdit, argument_changes
from countersign.core.contract import AnswerSignal, Limits
from countersign.db.schema import ApprovalDecision, Notification, ToolExecution
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import ECHO_RESULT, audit, last_tool_result, lead_status, pending, qualify
from tests.fixtures.postgres import JANE
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow


async def test_approved_call_runs_once_with_the_approver_recorded(
    agent: AgentHarness, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    status = await pending(handle)
    assert status.state == "awaiting_approval"
    (waiting,) = status.pending_approvals
    assert waiting.tool == "update_lead_status" and waiting.risk == "high" and waiting.requested_by == "alice"
    assert json.loads(waiting.args)["new_status"] == "qualified"
    assert await lead_status(db_engine, "acme") == "new", "nothing runs before a decision"

    decided = await execute_update(
        handle,
        AgentWorkflow.decide,
        Decision(call_id=waiting.call_id, decision="approve", approver="bob", reason="ok"),
    )
    assert decided.state == "approved" and decided.decided_by == "bob"
    await handle.result()
    assert await lead_status(db_engine, "acme") == "qualified"
    assert await lead_status(db_engine, "globex") == "new"
    (row,) = await audit(db_engine, handle.id)
    assert (row.outcome, row.approved_by, row.tool) == ("executed", "bob", "update_lead_status")
    assert row.decision_reason == "ok", "the approver's reason is in the audit, as a rejection's is"


async def test_rejected_by_signal_tells_the_model(
    agent: AgentHarness, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    await handle.signal(
        AgentWorkflow.reject, RejectSignal(call_id=waiting.call_id, approver="bob", reason="not yet")
    )
    await handle.result()
    result = last_tool_result(await agent.transcript(handle))
    assert result["error"]["code"] == "REJECTED" and "not yet" in result["error"]["message"]
    assert await lead_status(db_engine, "acme") == "new"
    (row,) = await audit(db_engine, handle.id)
    assert row.outcome == "rejected" and "bob" in row.decision_reason


async def test_unanswered_approval_expires_after_reminding(
    agent: AgentHarness, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    await pending(handle)
    await handle.result()  # the time-skipping server jumps the 24 h timer
    result = last_tool_result(await agent.transcript(handle))
    assert result["error"]["code"] == "EXPIRED"
    assert await lead_status(db_engine, "acme") == "new"
    (row,) = await audit(db_engine, handle.id)
    assert row.outcome == "expired"
    async with db_engine.connect() as conn:
        reminders = (
            await conn.execute(select(Notification).where(Notification.workflow_id == handle.id))
        ).all()
    assert len(reminders) == 1 and reminders[0].kind == "approval_reminder"
    # issue 34: what the call would have done comes first
    assert reminders[0].message.startswith("Jane Doe, Doe Consulting (jane.doe@example.com): status new")


async def test_approval_timeout_limit_overrides_the_default(agent: AgentHarness, jane_is_new: None) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True, limits=Limits(approval_timeout_s=60))
    (waiting,) = (await pending(handle)).pending_approvals
    # The deadline is the request time plus the limit, measured, not the hour it falls in: a request
    # made in an hour's last minute expires in the next hour.
    waited = datetime.fromisoformat(waiting.expires_at) - datetime.fromisoformat(waiting.requested_at)
    assert waited == timedelta(seconds=60)  # the limit's minute, not the 24 h default


@pytest.mark.parametrize(
    ("approver", "tenant_user", "why"),
    [
        ("alice", "alice", "may not decide high-risk calls"),  # sales: no role for high risk
        ("dave", "alice", "not a user of this tenant"),
        ("bob", "bob", "four-eyes"),
    ],
)
async def test_unauthorized_approvers_are_refused_and_audited(
    agent: AgentHarness, db_engine: AsyncEngine, jane_is_new: None, approver: str, tenant_user: str, why: str
) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", user=tenant_user, single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await execute_update(
            handle,
            AgentWorkflow.decide,
            Decision(call_id=waiting.call_id, decision="approve", approver=approver),
        )
    message = str(refused.value.cause)
    assert "decision refused" in message and why in message
    assert (await handle.query(AgentWorkflow.status)).state == "awaiting_approval"
    # a signal with the same decision is refused without a state change
    await handle.signal(AgentWorkflow.approve, ApproveSignal(call_id=waiting.call_id, approver=approver))
    assert len((await pending(handle)).pending_approvals) == 1
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="approve", approver="carol")
    )
    await handle.result()
    async with db_engine.connect() as conn:
        rows = (
            await conn.execute(
                select(ApprovalDecision)
                .where(ApprovalDecision.workflow_id == handle.id)
                .order_by(ApprovalDecision.id)  # in the order they were recorded
            )
        ).all()
    assert [(r.approver, r.accepted) for r in rows] == [(approver, False), (approver, False), ("carol", True)]


async def test_duplicate_and_unknown_decisions_fail_with_a_reason(
    agent: AgentHarness, jane_is_new: None
) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    with pytest.raises(WorkflowUpdateFailedError) as unknown:
        await execute_update(
            handle, AgentWorkflow.decide, Decision(call_id="c999", decision="approve", approver="bob")
        )
    assert "unknown call id" in str(unknown.value.cause)
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="reject", approver="bob")
    )
    with pytest.raises(WorkflowUpdateFailedError) as duplicate:
        await execute_update(
            handle,
            AgentWorkflow.decide,
            Decision(call_id=waiting.call_id, decision="approve", approver="carol"),
        )
    assert "already rejected by bob" in str(duplicate.value.cause)
    await handle.result()


async def test_edited_arguments_are_validated_and_reported(
    agent: AgentHarness, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    bad = {"lead": JANE, "new_status": "promoted", "reason": "x"}
    with pytest.raises(WorkflowUpdateFailedError) as invalid:
        await execute_update(
            handle,
            AgentWorkflow.decide,
            Decision(call_id=waiting.call_id, decision="approve", approver="bob", args=bad),
        )
    assert "edited arguments are invalid" in str(invalid.value.cause)
    edited = {"lead": JANE, "new_status": "contacted", "reason": "only contacted so far"}
    why = "she has not answered yet"
    await execute_update(
        handle,
        AgentWorkflow.decide,
        Decision(call_id=waiting.call_id, decision="approve", approver="bob", args=edited, reason=why),
    )
    await handle.result()
    assert await lead_status(db_engine, "acme") == "contacted"
    result = last_tool_result(await agent.transcript(handle))
    assert result["ok"] and result["data"]["arguments_edited_by_approver"]["new_status"] == "contacted"
    # the model is told what the reviewer changed, from what to what, and why (issue 34)
    told = result["data"]["approver_edit"]
    assert told["changed"] == {
        "new_status": {"from": "qualified", "to": "contacted"},
        "reason": {"from": "budget confirmed", "to": "only contacted so far"},
    }
    assert (told["approved_by"], told["reason"]) == ("bob", why)
    assert 'new_status from "qualified" to "contacted"' in told["note"] and why in told["note"]
    # asked and approved arguments are distinct facts: the request's, the decision's and its changes
    async with db_engine.connect() as conn:
        decided = (
            await conn.execute(
                select(ApprovalDecision.args, ApprovalDecision.changes, ApprovalDecision.effect).where(
                    ApprovalDecision.workflow_id == handle.id, ApprovalDecision.accepted
                )
            )
        ).one()
        executed = (
            await conn.execute(
                select(ToolExecution.args, ToolExecution.edited_args).where(
                    ToolExecution.workflow_id == handle.id
                )
            )
        ).one()
    assert decided.args == edited and decided.changes["new_status"] == {
        "before": "qualified",
        "after": "contacted",
    }
    assert "new → contacted" in decided.effect["summary"]  # the edit's effect, beside the request's
    assert executed.args["new_status"] == "qualified" and executed.edited_args["new_status"] == "contacted"


async def test_parallel_calls_are_decided_independently_in_any_order(
    agent: AgentHarness, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    calls = [
        {"name": "update_lead_status", "arguments": {"lead": JANE, "new_status": "contacted", "reason": "a"}},
        {"name": "get_lead", "arguments": {"lead": JANE}},
        {"name": "update_lead_status", "arguments": {"lead": JANE, "new_status": "qualified", "reason": "b"}},
    ]
    agent.script(
        {"when": {"user_contains": "both"}, "reply": {"tool_calls": calls}},
        {"when": {"after_tool": "update_lead_status"}, "reply": {"content": "done"}},
    )
    handle = await agent.start("do both", single_turn=True)
    # matched by call id, never by position: the order approvals appear in is not the calls' order
    by_reason = {json.loads(p.args)["reason"]: p for p in (await pending(handle, 2)).pending_approvals}
    first, second = by_reason["a"], by_reason["b"]
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=second.call_id, decision="approve", approver="bob")
    )
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=first.call_id, decision="reject", approver="bob")
    )
    await handle.result()
    results = [json.loads(m.content or "") for m in await agent.transcript(handle) if m.role == "tool"]
    assert [r["ok"] for r in results] == [False, True, True]
    assert results[0]["error"]["code"] == "REJECTED"
    assert await lead_status(db_engine, "acme") == "qualified"


async def test_ask_human_waits_for_the_users_answer(agent: AgentHarness) -> None:
    agent.script(
        {
            "when": {"user_contains": "ask"},
            "reply": {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which Jane?"}}]},
        },
        {
            "when": {"after_tool": "ask_human", "result_contains": "the acme one"},
            "reply": {"content": "Thanks."},
        },
    )
    handle = await agent.start("ask me", single_turn=True)
    for _ in range(200):
        status = await handle.query(AgentWorkflow.status)
        if status.pending_questions:
            break
        await asyncio.sleep(0.05)
    assert status.state == "awaiting_answer"
    (question,) = status.pending_questions
    assert question.question == "Which Jane?"
    await handle.signal(
        AgentWorkflow.answer, AnswerSignal(call_id=question.call_id, user_id="mallory", text="evil")
    )
    await handle.signal(
        AgentWorkflow.answer, AnswerSignal(call_id=question.call_id, user_id="alice", text="the acme one")
    )
    result = await handle.result()
    assert result.last_reply == "[scripted model] Thanks."


def test_an_approvers_changes_name_each_argument_as_asked_and_as_approved() -> None:
    asked = {"lead": JANE, "new_status": "qualified", "reason": "budget"}
    approved = {"lead": JANE, "new_status": "contacted", "reason": "budget", "note": "called"}
    changes = argument_changes(asked, approved)
    assert list(changes) == ["new_status", "note"]  # unchanged ones left out, a new one from null
    assert (changes["note"].before, changes["note"].after) == (None, "called")
    edit = ApproverEdit(approver="bob", changes=changes, reason="not yet")
    assert (
        edit.note() == 'bob changed new_status from "qualified" to "contacted"; note from null to "called" '
        "before approving (reason: not yet)"
    )
    assert (
        ApproverEdit(approver="bob").note() == "bob changed the arguments before approving (no reason given)"
    )
