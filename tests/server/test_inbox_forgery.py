"""APPROVER_AUTH=signed on real parts (time-skipping Temporal, PostgreSQL, the scripted model, the
inbox over HTTP): only a proof the inbox issued to the authenticated reviewer decides a call.
Every forgery is refused and recorded with its reason, and the call keeps waiting."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowHandle

from countersign.core.approvals import ApproveSignal, PendingCall
from countersign.core.contract import AnswerSignal, ConversationResult, EndConversation, StatusView
from countersign.core.saga import RollbackRequest
from countersign.db.schema import ApprovalDecision, ApprovalRequest, ProofCheck, RollbackRecord, ToolExecution
from countersign.identity.proofs import Binding, load_private_key, mint_proof
from tests.fixtures.approvals import ECHO_RESULT, pending, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import JANE
from tests.workflows.test_replay import replayer
from workflows.agent import AgentWorkflow

ASK = {
    "when": {"user_contains": "ask"},
    "reply": {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which lead?"}}]},
}


async def decisions(engine: AsyncEngine, workflow_id: str) -> list[ApprovalDecision]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(ApprovalDecision)
            .where(ApprovalDecision.workflow_id == workflow_id)
            .order_by(ApprovalDecision.id)
        )
        return list(rows)  # type: ignore[arg-type]


async def recorded_call(engine: AsyncEngine, workflow_id: str, call_id: str) -> tuple[PendingCall, str]:
    """The pending call as the worker recorded it for reviewers and its effect's digest (what the
    inbox binds proofs to)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(ApprovalRequest).where(
                    ApprovalRequest.workflow_id == workflow_id, ApprovalRequest.call_id == call_id
                )
            )
        ).one()
    return PendingCall.model_validate(row._asdict()), row.effect_sha256


async def checks(engine: AsyncEngine, workflow_id: str) -> list[Any]:
    async with engine.connect() as conn:
        return list(
            await conn.execute(
                select(ProofCheck).where(ProofCheck.workflow_id == workflow_id).order_by(ProofCheck.id)
            )
        )


async def still_waiting(handle: WorkflowHandle[Any, Any]) -> StatusView:
    status = await handle.query(AgentWorkflow.status)
    assert status.state == "awaiting_approval", status
    assert [p.call_id for p in status.pending_approvals] == ["c1"]
    return status


@pytest.mark.devserver  # the inbox lists pending approvals through Temporal visibility
async def test_every_forged_decision_is_refused_recorded_and_the_call_keeps_waiting(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    signed_agent = signed_dev_agent
    agent, key = signed_agent.agent, load_private_key(signed_agent.keys.private)
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    args = (await pending(handle)).pending_approvals[0].args
    wf, now = handle.id, datetime.now(UTC)
    call, effect = await recorded_call(db_engine, wf, "c1")
    approve = Binding.decision(call, "approve", args, effect)

    def signed(user: str, binding: Binding, at: datetime = now, with_key: Ed25519PrivateKey = key) -> str:
        return mint_proof(with_key, user, binding, at)

    def as_(approver: str, proof: str) -> ApproveSignal:
        return ApproveSignal(call_id="c1", approver=approver, proof=proof)

    def by_bob(binding: Binding = approve, **kwargs: Any) -> ApproveSignal:
        return ApproveSignal(call_id="c1", approver="bob", proof=signed("bob", binding, **kwargs))

    def bound(action: Any = "approve", to: Any = args, seen: str = effect, **other: str) -> Binding:
        return Binding.decision(call.model_copy(update=other), action, to, seen)

    converted = {"lead": JANE, "new_status": "converted", "reason": "x"}
    forgeries: list[tuple[ApproveSignal, str]] = [
        (ApproveSignal(call_id="c1", approver="bob"), "no proof"),
        (ApproveSignal(call_id="c1", approver="bob", proof="garbage"), "invalid proof"),
        (by_bob(with_key=Ed25519PrivateKey.generate()), "Signature verification failed"),
        (by_bob(bound(call_id="c2")), "another target 'c2'"),
        (by_bob(bound(to=converted)), "another arguments"),
        # issue 34: what the reviewer decides is the effect the request recorded, not another one
        (by_bob(bound(seen="0" * 64)), "another effect"),
        (by_bob(bound(action="reject")), "another action 'reject'"),
        (by_bob(bound(tenant_id="globex")), "another tenant 'globex'"),
        # issue 26, class 2: what the reviewer saw must be the conversation's own pending call
        (by_bob(bound(tool="get_lead")), "another tool 'get_lead'"),
        (by_bob(bound(risk="low")), "another risk 'low'"),
        (by_bob(bound(nonce="another-nonce")), "another approval nonce"),
        (by_bob(bound(conversation_id="another-run")), "another conversation instance"),
        (by_bob(at=now - timedelta(minutes=10)), "expired"),
        (as_("bob", signed("carol", approve)), "issued to 'carol', not 'bob'"),
        # a real proof, but alice (sales) requested this high-risk call: the rules hold with proofs too
        (as_("alice", signed("alice", approve)), "alice may not decide high-risk calls"),
        # another tenant's reviewer
        (as_("erin", signed("erin", approve)), "not a user of this tenant"),
    ]
    for signal, _ in forgeries:
        await handle.signal(AgentWorkflow.approve, signal)
    for _ in range(200):
        rows = await decisions(db_engine, wf)
        if len(rows) == len(forgeries):
            break
        await asyncio_sleep()
    assert len(rows) == len(forgeries), rows
    assert not any(row.accepted or row.proven for row in rows), rows
    # handlers run concurrently, so rows come in any order: each forgery has its own reason
    reasons = [row.reason or "" for row in rows]
    for signal, reason in forgeries:
        assert [r for r in reasons if reason in r], f"{signal.approver}: {reason} not in " + " | ".join(
            reasons
        )
    await still_waiting(handle)

    # A proof spent on a decision that was refused for another reason cannot be used again: bob's
    # proof for invalid edited arguments is accepted as a proof, the edit is refused, the replay too.
    bad_edit = {"lead": JANE, "new_status": "bogus", "reason": "x"}
    proof = signed("bob", Binding.decision(call, "approve", bad_edit, effect))
    replayed = ApproveSignal(call_id="c1", approver="bob", args=bad_edit, proof=proof)
    for _ in range(2):
        await handle.signal(AgentWorkflow.approve, replayed)
    for _ in range(200):
        rows = await decisions(db_engine, wf)
        if len(rows) == len(forgeries) + 2:
            break
        await asyncio_sleep()
    assert "edited arguments are invalid" in (rows[-2].reason or "")
    assert "already used (replay)" in (rows[-1].reason or "")
    await still_waiting(handle)
    recorded = await checks(db_engine, wf)
    # alice's, erin's (refused later by the rules) and bob's; and the start's (the harness, as the server)
    assert [c.action for c in recorded if c.accepted] == ["start", "approve", "approve", "approve"]
    assert all(c.reason for c in recorded if not c.accepted)

    # Through the inbox: alice (logged in) may not approve her own call; erin sees no such conversation.
    alice, erin, bob = (await signed_agent.login("alice"), await signed_agent.login("erin", "globex"),
                        await signed_agent.login("bob"))  # fmt: skip
    assert (await signed_agent.call("GET", "/api/approvals", alice))[1] == []  # not hers to decide
    status, body = await signed_agent.call("POST", f"/api/approvals/{wf}/c1", alice, {"decision": "approve"})
    assert (status, "alice may not decide high-risk" in body["error"]) == (403, True)
    status, body = await signed_agent.call("POST", f"/api/approvals/{wf}/c1", erin, {"decision": "approve"})
    assert status == 404, body
    assert (await signed_agent.call("GET", "/api/approvals", None))[0] == 401
    assert (
        await signed_agent.call(
            "POST", "/api/login", None, {"tenant_id": "acme", "user_id": "bob", "password": "nope"}
        )
    )[0] == 401
    await still_waiting(handle)

    # bob, logged in, decides: the proof the inbox issued counts, once, and the audit says proven.
    # (this file shares its database with others, whose ended conversations' requests wait to expire)
    [listed] = [
        i for i in (await signed_agent.call("GET", "/api/approvals", bob))[1] if i["workflow_id"] == wf
    ]
    assert (listed["workflow_id"], listed["call_id"], listed["args"]) == (wf, "c1", args)
    status, body = await signed_agent.call(
        "POST", f"/api/approvals/{wf}/c1", bob, {"decision": "approve", "reason": "ok"}
    )
    assert (status, body["state"], body["decided_by"]) == (200, "approved", "bob"), body
    await handle.result()
    await replayer().replay_workflow(await handle.fetch_history())  # refusals and notices replay too
    accepted = [r for r in await decisions(db_engine, wf) if r.accepted]
    assert [(r.approver, r.proven) for r in accepted] == [("bob", True)]
    async with db_engine.connect() as conn:
        executed = list(await conn.execute(select(ToolExecution).where(ToolExecution.workflow_id == wf)))
    assert [(e.outcome, e.approved_by) for e in executed] == [("executed", "bob")]
    status, body = await signed_agent.call("POST", f"/api/approvals/{wf}/c1", bob, {"decision": "approve"})
    assert status in (404, 409), body  # decided and ended


async def test_answer_and_end_need_a_proof_in_signed_mode(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    agent = signed_agent.agent
    agent.script(ASK, {"when": {"after_tool": "ask_human"}, "reply": {"content": "thanks"}})
    alice = await signed_agent.login("alice")
    code, started = await signed_agent.call(
        "POST", "/api/conversations", alice, {"agent": "lead-qualifier", "message": "ask me"}
    )
    assert code == 201, started
    agent.track(started["workflow_id"])
    handle = agent.client.get_workflow_handle(started["workflow_id"], result_type=ConversationResult)
    for _ in range(200):
        status = await handle.query(AgentWorkflow.status)
        if status.pending_questions:
            break
        await asyncio_sleep()
    await handle.signal(AgentWorkflow.answer, AnswerSignal(call_id="c1", user_id="alice", text="Jane"))
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    for _ in range(200):  # the start's (accepted: the server's proof), then these two
        if len(await checks(db_engine, handle.id)) == 3:
            break
        await asyncio_sleep()
    refused = [c for c in await checks(db_engine, handle.id) if c.action != "start"]
    assert [(c.action, c.accepted, "no proof" in c.reason) for c in refused] == [
        ("answer", False, True),
        ("end", False, True),
    ]
    status = await handle.query(AgentWorkflow.status)
    assert status.state == "awaiting_answer" and status.pending_questions

    code, body = await signed_agent.call(
        "POST", f"/api/conversations/{handle.id}/answer", alice, {"call_id": "c1", "text": "Jane"}
    )
    assert code == 202, body
    # a rollback with a bare name is refused and recorded; through the inbox it is proven
    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="turn"))
    code, body = await signed_agent.call(
        "POST", f"/api/conversations/{handle.id}/rollback", alice, {"scope": "turn"}
    )
    assert code == 202, body
    for _ in range(200):
        async with db_engine.connect() as conn:
            where = RollbackRecord.workflow_id == handle.id
            rollbacks = list(await conn.execute(select(RollbackRecord).where(where)))
        if len(rollbacks) == 2:
            break
        await asyncio_sleep()
    assert sorted((r.accepted, r.proven, "no proof" in (r.reason or "")) for r in rollbacks) == [
        (False, False, True),
        (True, True, False),
    ]
    code, body = await signed_agent.call("POST", f"/api/conversations/{handle.id}/end", alice, {})
    assert code == 202, body
    result = await handle.result()
    assert result.ended_by == "end by alice"
    await replayer().replay_workflow(await handle.fetch_history())  # proof checks replay deterministically
    transcript = await agent.transcript(handle)
    assert json.loads([m for m in transcript if m.role == "tool"][-1].content or "")["data"] == {
        "answer": "Jane"
    }


async def asyncio_sleep() -> None:
    await asyncio.sleep(0.05)


@pytest.mark.devserver
async def test_batch_decides_across_conversations_each_with_its_own_proof(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(qualify(), ECHO_RESULT)
    first = await stack.agent.start("qualify jane", single_turn=True)
    second = await stack.agent.start("qualify jane", single_turn=True)
    await pending(first)
    await pending(second)
    bob = await stack.login("bob")
    items = [
        {"workflow_id": first.id, "call_id": "c1"},
        {"workflow_id": second.id, "call_id": "c1"},
        {"workflow_id": second.id, "call_id": "c9"},  # no such call: refused alone
    ]
    status, body = await stack.call(
        "POST", "/api/approvals/batch", bob, {"decision": "reject", "reason": "not now", "items": items}
    )
    assert status == 200, body
    assert [(r["call_id"], r["status"]) for r in body] == [("c1", 200), ("c1", 200), ("c9", 404)]
    for handle in (first, second):
        await handle.result()
        [row] = [r for r in await decisions(db_engine, handle.id) if r.accepted]
        assert (row.approver, row.decision, row.proven, row.reason) == ("bob", "reject", True, "not now")
