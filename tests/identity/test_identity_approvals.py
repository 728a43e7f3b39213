"""Issue 26, class 2: a proof names exactly what the reviewer saw.

Reviewers see only the approvals the real worker recorded (`approval_requests`, written by an
activity), never what a `status` query answers: any worker polling a conversation's task queue can
answer one. A decision's proof binds the tenant, the workflow id, the conversation instance, the
call, the tool, its risk, the nonce the conversation drew for that approval and the arguments; the
workflow checks it against its own pending call. Generated on the real parts: the time-skipping
Temporal server (the dev server for visibility), embedded PostgreSQL, the scripted model over
HTTP, the inbox over HTTP, the real activities.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio import workflow
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

from countersign.core.approvals import Decision, PendingCall
from countersign.core.contract import (
    WORKFLOW_TYPE,
    ConversationResult,
    PendingApproval,
    StartConversation,
    StatusView,
)
from countersign.core.effects import Effect
from countersign.core.messages import ChatMessage
from countersign.db.schema import ApprovalDecision, ApprovalRequest
from countersign.identity.proofs import Binding, mint_proof
from countersign.runtime.search_attributes import AGENT_STATUS, TENANT_ID
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import ECHO_RESULT, pending, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow

PROPERTY = settings(
    max_examples=8,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# What a transplanted proof may have been minted for instead of the conversation's own pending call
OTHER = {
    "conversation_id": st.sampled_from(["another-run", ""]).map(lambda r: r or str(uuid.uuid4())),
    "tool": st.sampled_from(["get_lead", "create_task", "send_email"]),
    "risk": st.sampled_from(["low", "medium"]),
    "nonce": st.uuids().map(str),
    "workflow_id": st.sampled_from(["conv-acme-key-other", "test-elsewhere"]),
    "tenant_id": st.sampled_from(["globex"]),
}
WHY = {
    "conversation_id": "another conversation instance",
    "tool": "another tool",
    "risk": "another risk",
    "nonce": "another approval nonce",
    "workflow_id": "another conversation",
    "tenant_id": "another tenant",
}


async def recorded_call(
    engine: AsyncEngine, workflow_id: str, call_id: str = "c1"
) -> tuple[PendingCall, str]:
    """The pending call as the worker recorded it for reviewers, in its latest instance, and the
    digest of its recorded effect (both of which a proof binds)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(ApprovalRequest)
                .where(ApprovalRequest.workflow_id == workflow_id, ApprovalRequest.call_id == call_id)
                .order_by(ApprovalRequest.requested_at.desc())
                .limit(1)
            )
        ).first()
    assert row is not None, f"no recorded request for {workflow_id}/{call_id}"
    return PendingCall.model_validate(row._asdict()), row.effect_sha256


async def start_under(agent: AgentHarness, workflow_id: str, text: str) -> WorkflowHandle[Any, Any]:
    """A signed-mode conversation of acme/alice under `workflow_id` (its start proven, as the
    server would)."""
    start = StartConversation(
        tenant_id="acme", user_id="alice", agent="lead-qualifier", message=text, single_turn=True
    )
    assert agent.proof_key is not None
    binding = Binding.start("acme", workflow_id, start.agent, start.proof_content())
    start.proof = mint_proof(agent.proof_key, "alice", binding, datetime.now(UTC))
    handle = await agent.client.start_workflow(
        AgentWorkflow.run, start, id=workflow_id, task_queue=agent.settings.task_queue
    )
    agent.track(workflow_id)
    return handle


def bobs(stack: SignedStack, binding: Binding) -> Decision:
    assert stack.agent.proof_key is not None
    proof = mint_proof(stack.agent.proof_key, "bob", binding, datetime.now(UTC))
    return Decision(call_id="c1", decision="approve", approver="bob", proof=proof)


@pytest.mark.security
@PROPERTY
@given(
    changed=st.dictionaries(st.sampled_from(sorted(OTHER)), st.none(), min_size=1, max_size=3).flatmap(
        lambda keys: st.fixed_dictionaries({k: OTHER[k] for k in keys})
    )
)
async def test_a_proof_for_another_instance_tool_risk_or_approval_is_refused(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None, changed: dict[str, str]
) -> None:
    """A reviewer's proof transplanted onto the conversation's pending call from another instance,
    tool, risk, approval or conversation is refused, recorded, and the call keeps waiting; the
    proof for exactly the recorded call decides it."""
    agent = signed_agent.agent
    agent.script(qualify(), ECHO_RESULT)
    handle = await start_under(agent, f"test-{uuid.uuid4()}", "qualify jane")
    [waiting] = (await pending(handle)).pending_approvals
    call, effect = await recorded_call(db_engine, handle.id)
    assert (call.tool, call.risk, call.tenant_id) == ("update_lead_status", "high", "acme")
    assert call.conversation_id == handle.first_execution_run_id and call.nonce
    transplanted = Binding.decision(call.model_copy(update=changed), "approve", waiting.args, effect)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await execute_update(handle, AgentWorkflow.decide, bobs(signed_agent, transplanted))
    reason = str(refused.value.cause)
    assert all(WHY[field] in reason for field in changed), reason
    assert [p.call_id for p in (await handle.query(AgentWorkflow.status)).pending_approvals] == ["c1"]
    exact = Binding.decision(call, "approve", waiting.args, effect)
    approved = await execute_update(handle, AgentWorkflow.decide, bobs(signed_agent, exact))
    assert approved.state == "approved" and approved.decided_by == "bob"
    result: ConversationResult = await handle.result()
    assert result.last_reply == "[scripted model] done"


@pytest.mark.security
async def test_the_request_records_the_effect_and_a_proof_binds_it(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    """Issue 34: the worker records what the call will do (whose lead, its status now) with the
    request, and a reviewer's proof binds that effect's digest: one minted for another effect (what
    a client claims it showed) is refused and recorded; one for the recorded effect decides."""
    agent = signed_agent.agent
    agent.script(qualify(), ECHO_RESULT)
    handle = await start_under(agent, f"test-{uuid.uuid4()}", "qualify jane")
    [waiting] = (await pending(handle)).pending_approvals
    call, digest = await recorded_call(db_engine, handle.id)
    async with db_engine.connect() as conn:
        recorded = await conn.scalar(
            select(ApprovalRequest.effect).where(
                ApprovalRequest.call_id == "c1", ApprovalRequest.workflow_id == handle.id
            )
        )
    effect = Effect.model_validate(recorded)
    assert effect.summary == "Jane Doe, Doe Consulting (jane.doe@example.com): status new → qualified"
    assert effect.digest == digest and effect.resolved
    elsewhere = Binding.decision(call, "approve", waiting.args, Effect(summary="something else").digest)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await execute_update(handle, AgentWorkflow.decide, bobs(signed_agent, elsewhere))
    assert "another effect" in str(refused.value.cause)
    exact = Binding.decision(call, "approve", waiting.args, digest)
    approved = await execute_update(handle, AgentWorkflow.decide, bobs(signed_agent, exact))
    assert approved.state == "approved" and approved.decided_by == "bob"


@pytest.mark.security
async def test_a_proof_for_an_ended_instance_does_not_decide_the_next_one(
    signed_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    """Bob approved call c1 of one conversation; it is replaced by another under the same workflow
    id whose c1 is the same tool with the same arguments. Bob's proof does not decide it: the
    instance and the approval's nonce are the new conversation's own. The inbox lists only the new
    instance's request, and bob decides it there."""
    agent = signed_agent.agent
    agent.script(qualify(), ECHO_RESULT)
    workflow_id = f"test-{uuid.uuid4()}"
    first = await start_under(agent, workflow_id, "qualify jane")
    [waiting] = (await pending(first)).pending_approvals
    seen, effect = await recorded_call(db_engine, workflow_id)
    proof_for_first = bobs(signed_agent, Binding.decision(seen, "approve", waiting.args, effect))
    await first.terminate("replaced")
    second = await start_under(agent, workflow_id, "qualify jane")
    await pending(second)
    now, _ = await recorded_call(db_engine, workflow_id)
    assert now.conversation_id != seen.conversation_id and now.nonce != seen.nonce
    assert (now.tool, now.call_id) == (seen.tool, seen.call_id)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await execute_update(second, AgentWorkflow.decide, proof_for_first)
    assert "another conversation instance" in str(refused.value.cause)
    bob = await signed_agent.login("bob")
    listed = [
        i
        for i in (await signed_agent.call("GET", "/api/approvals", bob))[1]
        if i["workflow_id"] == workflow_id
    ]
    assert [(i["conversation_id"], i["nonce"]) for i in listed] == [(now.conversation_id, now.nonce)]
    status, body = await signed_agent.call(
        "POST", f"/api/approvals/{workflow_id}/c1", bob, {"decision": "approve"}
    )
    assert status == 200, body
    assert (await second.result()).last_reply == "[scripted model] done"
    async with db_engine.connect() as conn:
        decided = (
            await conn.execute(
                select(ApprovalDecision.conversation_id, ApprovalDecision.accepted, ApprovalDecision.proven)
                .where(ApprovalDecision.workflow_id == workflow_id)
                .order_by(ApprovalDecision.id)
            )
        ).all()
    assert [tuple(d) for d in decided] == [
        (now.conversation_id, False, False),
        (now.conversation_id, True, True),
    ]


# --- an outsider's worker answers queries: reviewers never see what it claims ------------------


@workflow.defn(name=WORKFLOW_TYPE, sandboxed=False)
class FakeConversation:
    """What an outsider's worker serves on its own task queue: an acme conversation whose `status`
    says call c1 is a low-risk get_lead waiting for approval."""

    @workflow.run
    async def run(self, start: StartConversation) -> None:
        workflow.upsert_search_attributes([AGENT_STATUS.value_set("awaiting_approval")])
        await workflow.wait_condition(lambda: False)

    @workflow.query
    def transcript(self) -> list[ChatMessage]:
        return []

    @workflow.query
    def status(self) -> StatusView:
        now = workflow.now()
        fake = PendingApproval(
            call_id="c1",
            tool="get_lead",
            args=f'{{"lead": "{JANE}"}}',
            risk="low",
            requested_by="alice",
            requested_at=now.isoformat(),
            expires_at=(now + timedelta(hours=1)).isoformat(),
        )
        return StatusView(
            state="awaiting_approval",
            turn=1,
            tenant_id="acme",
            agent="lead-qualifier",
            pending_approvals=[fake],
        )


@pytest.mark.security
@pytest.mark.devserver  # the query path needed Temporal visibility: the real dev server has it
async def test_the_inbox_lists_only_what_the_real_worker_recorded(signed_dev_agent: SignedStack) -> None:
    agent = signed_dev_agent.agent
    workflow_id = f"test-fake-{uuid.uuid4()}"
    queue = f"outsider-{uuid.uuid4()}"
    start = StartConversation(tenant_id="acme", user_id="alice", agent="lead-qualifier")
    async with Worker(agent.client, task_queue=queue, workflows=[FakeConversation]):
        await agent.client.start_workflow(
            WORKFLOW_TYPE,
            start,
            id=workflow_id,
            task_queue=queue,
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(TENANT_ID, "acme"), SearchAttributePair(AGENT_STATUS, "running")]
            ),
        )
        try:
            handle = agent.client.get_workflow_handle(workflow_id)
            waiting = (
                f"WorkflowId = '{workflow_id}' AND AgentStatus = 'awaiting_approval' AND TenantId = 'acme'"
            )
            for _ in range(100):  # the fake answers its query, and visibility lists it as waiting
                listed = [e.id async for e in agent.client.list_workflows(waiting)]
                if listed and (await handle.query("status", result_type=StatusView)).pending_approvals:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the outsider's conversation never looked like it waited")
            bob = await signed_dev_agent.login("bob")
            _, items = await signed_dev_agent.call("GET", "/api/approvals", bob)
            assert [i for i in items if i["workflow_id"] == workflow_id] == []
            status, body = await signed_dev_agent.call(
                "POST", f"/api/approvals/{workflow_id}/c1", bob, {"decision": "approve"}
            )
            assert status == 404, body  # nothing to decide, no proof minted
        finally:
            await agent.client.get_workflow_handle(workflow_id).terminate("test finished")
