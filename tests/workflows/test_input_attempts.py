"""Issue 40: an audit row names the client input it records, so a failed workflow task never makes
one input's row another's.

A local activity's row is keyed by its attempt (countersign/db/attempts.py): workflow id, run id and
activity id. The activity id used to be the activity's position in the run's command sequence, and
a workflow task that fails loses the markers of the local activities it ran: its retry runs them
again at other positions (a refusal recorded twice), and an input the retry no longer carries (an
update the server gave up) leaves its row at a position the next input then takes (a real decision
answered with a forged one's refusal). Now each activity id names the input it acts for: the
update's own id, the signal's place in the run's history, the run itself for the main flow
(workflows/options.py, `acting_for`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.service import RPCError

from countersign.db.schema import ApprovalDecision, InputAudit, ProofCheck
from countersign.devstack.temporal import DYNAMIC_CONFIG
from countersign.scripted_model.server import ScriptedModelServer
from tests.e2e.test_hostile_input import eventually
from tests.fixtures.approvals import ECHO_RESULT, lead_status, pending, qualify
from tests.fixtures.inbox import ProofKeys, SignedStack, signed_dev_stack
from tests.fixtures.smtp import SmtpServer
from tests.fixtures.temporal_dev import running_dev_server
from tests.fixtures.updates import execute_update
from tests.workflows.test_floods import until_answers
from workflows.agent import AgentWorkflow

REFUSED_MESSAGES = 12
UPDATE_BOUND = "history.maxInFlightUpdatePayloads="


@pytest_asyncio.fixture
async def unbounded_signed_dev_agent(
    tmp_path: Path,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
    smtp_server: SmtpServer,
    proof_keys: ProofKeys,
) -> AsyncIterator[SignedStack]:
    """signed_dev_agent on a dev server without Countersign's bound on updates' requests: there an
    oversized update reaches the worker, whose SDK fails the workflow tasks that would answer it,
    the way these tests provoke failed tasks that carry an input (with the bound, the server
    refuses such an update at its door: tests/workflows/test_floods.py)."""
    unbounded = tuple(value for value in DYNAMIC_CONFIG if not value.startswith(UPDATE_BOUND))
    assert len(unbounded) == len(DYNAMIC_CONFIG) - 1
    async with (
        running_dev_server(tmp_path, unbounded) as server,
        signed_dev_stack(server, database_url, db_engine, scripted_model, smtp_server, proof_keys) as stack,
    ):
        yield stack


async def refusals_of(engine: AsyncEngine, workflow_id: str, actor: str) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(
            select(func.count())
            .select_from(InputAudit)
            .where(InputAudit.workflow_id == workflow_id, InputAudit.actor == actor)
        )
    return int(count or 0)


@pytest.mark.devserver
@pytest.mark.security
async def test_an_oversized_decide_leaves_no_row_for_bobs_real_decision_and_no_refusal_twice(
    unbounded_signed_dev_agent: SignedStack, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    """A 1.5 MB `decide` in bob's name, without a proof, reaches the worker (a server without the
    bound on updates) and is held off while the workflow tasks that would accept it fail (its
    handler runs in each, and records its refusal); alice's unproven end and refused messages
    arrive meanwhile. Once the server gives the update up, bob's real, proven decision through the
    inbox is accepted first time, and each refused input is on the record exactly once."""
    stack = unbounded_signed_dev_agent
    agent = stack.agent
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("please qualify jane")
    call = (await pending(handle)).pending_approvals[0]
    heavy = {"call_id": call.call_id, "decision": "approve", "approver": "bob", "comment": "x" * 1_500_000}
    held = asyncio.ensure_future(handle.execute_update("decide", heavy))
    await asyncio.sleep(1.0)  # the workflow tasks that carry it are failing by now
    # alice's unproven end: two local activities (authorized, then its proof refused), the held
    # update's between them in the task that fails; the retry without the update ran the proof
    # check at the update's old position, whose proof-check row it then answered from
    await handle.signal("end", {"requested_by": "alice"})
    for n in range(REFUSED_MESSAGES):
        await handle.signal("submit_message", {"user_id": "mallory", "text": f"flood {n}"})
        await asyncio.sleep(0.3)  # spread over the workflow tasks that fail while the update is held
    with pytest.raises(RPCError):
        await held
    await until_answers(handle)
    assert await eventually(db_engine, handle.id, REFUSED_MESSAGES) >= REFUSED_MESSAGES
    assert await refusals_of(db_engine, handle.id, "mallory") == REFUSED_MESSAGES
    async with db_engine.connect() as conn:
        ends = (
            await conn.execute(
                select(ProofCheck.accepted, ProofCheck.reason).where(
                    ProofCheck.workflow_id == handle.id, ProofCheck.action == "end"
                )
            )
        ).all()
    assert len(ends) == 1 and not ends[0].accepted and "proof" in (ends[0].reason or ""), ends
    bob = await stack.login("bob")
    status, body = await stack.call(
        "POST", f"/api/approvals/{handle.id}/{call.call_id}", bob, {"decision": "approve"}
    )
    assert status == 200, body
    turn = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert turn is not None and turn.reply == "[scripted model] done", turn
    assert await lead_status(db_engine, "acme") == "qualified"
    async with db_engine.connect() as conn:
        decided = (
            await conn.execute(
                select(ApprovalDecision.approver, ApprovalDecision.accepted, ApprovalDecision.proven)
                .where(ApprovalDecision.workflow_id == handle.id)
                .order_by(ApprovalDecision.id)
            )
        ).all()
    # the held update's refusal, once however often its handler ran, then bob's own decision
    assert [tuple(d) for d in decided] == [("bob", False, False), ("bob", True, True)]
