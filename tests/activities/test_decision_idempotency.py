"""`record_decision` audits a decision attempt exactly once, however often its activity runs.

It is a local activity: a retry after its commit, or a replay after a worker crash, runs it again
with the same workflow id, run id and activity id. These tests run it directly in an
`ActivityEnvironment` whose info fixes those three, against the session's real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import delete, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.approvals import ApprovalActivities
from countersign.core.approvals import Decision, DecisionRecord, Verdict
from countersign.db.engine import session_factory
from countersign.db.schema import ApprovalDecision, UserRole

JANE = "jane.doe@example.com"
QUALIFY = {"lead": JANE, "new_status": "qualified", "reason": "budget confirmed"}


@pytest.fixture
async def workflow_id(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """A fresh conversation id; its decision rows are removed afterwards."""
    workflow_id = f"conv-acme-idem-{uuid.uuid4().hex[:12]}"
    yield workflow_id
    async with db_engine.begin() as conn:
        await conn.execute(delete(ApprovalDecision).where(ApprovalDecision.workflow_id == workflow_id))


@pytest.fixture
def approvals(db_engine: AsyncEngine) -> ApprovalActivities:
    return ApprovalActivities(session_factory(db_engine))


def environment(workflow_id: str, activity_id: str = "7", run_id: str = "run-1") -> ActivityEnvironment:
    """An activity context as a local activity of `workflow_id` sees it (any attempt of it)."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        activity_id=activity_id,
        activity_type="record_decision",
        is_local=True,
        workflow_id=workflow_id,
        workflow_run_id=run_id,
        workflow_type="AgentWorkflow",
    )
    return env


def record(workflow_id: str, **decision: Any) -> DecisionRecord:
    """bob (reviewer) approves alice's high-risk update_lead_status, unless `decision` says otherwise."""
    refusal = decision.pop("refusal", None)
    return DecisionRecord(
        tenant_id="acme",
        workflow_id=workflow_id,
        tool="update_lead_status",
        risk="high",
        requested_by="alice",
        decision=Decision(**{"call_id": "c1", "decision": "approve", "approver": "bob", **decision}),
        refusal=refusal,
    )


async def rows(engine: AsyncEngine, workflow_id: str) -> list[Any]:
    async with engine.connect() as conn:
        return list(
            await conn.execute(
                select(ApprovalDecision)
                .where(ApprovalDecision.workflow_id == workflow_id)
                .order_by(ApprovalDecision.id)
            )
        )


CASES: dict[str, tuple[dict[str, Any], bool, str | None, str | None]] = {
    "approved": ({}, True, None, None),
    "approved with edited arguments": (
        {"args": {**QUALIFY, "new_status": "contacted"}},
        True,
        None,
        "contacted",
    ),
    "rejected by the reviewer": ({"decision": "reject", "reason": "not yet"}, True, None, None),
    "refused: approver's role": ({"approver": "alice"}, False, "may not decide high-risk calls", None),
    "refused: not a tenant user": ({"approver": "dave"}, False, "not a user of this tenant", None),
    "refused: invalid edit": (
        {"args": {**QUALIFY, "new_status": "promoted"}},
        False,
        "edited arguments are invalid",
        None,
    ),
    "refused by the workflow's state": (
        {"refusal": "call c1 was already approved by carol"},
        False,
        "already approved by carol",
        None,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_rerun_returns_the_first_verdict_and_adds_no_row(
    approvals: ApprovalActivities, db_engine: AsyncEngine, workflow_id: str, case: str
) -> None:
    decision, accepted, reason, edited_status = CASES[case]
    attempt = record(workflow_id, **decision)
    env = environment(workflow_id)

    first = await env.run(approvals.record_decision, attempt)
    env.info = dataclasses.replace(env.info, attempt=2)  # a retry after a lost completion
    again = await env.run(approvals.record_decision, attempt)
    replayed = await environment(workflow_id).run(approvals.record_decision, attempt)  # a replay

    assert first == again == replayed
    assert first.accepted is accepted
    assert (first.reason is None) if reason is None else (first.reason and reason in first.reason)
    if edited_status is None:
        assert first.args is None
    else:
        assert first.args is not None and f'"new_status":"{edited_status}"' in first.args
    (row,) = await rows(db_engine, workflow_id)
    assert row.attempt_key == f"{workflow_id}:run-1:7"
    assert (row.approver, row.decision, row.accepted) == (
        attempt.decision.approver,
        attempt.decision.decision,
        accepted,
    )


async def test_a_rerun_answers_from_the_row_not_from_todays_roles(
    approvals: ApprovalActivities, db_engine: AsyncEngine, workflow_id: str
) -> None:
    """bob loses his reviewer role between the first run and its re-run: the decision stands as
    recorded (the workflow already acted on it, or will, from the same answer)."""
    attempt = record(workflow_id, args={**QUALIFY, "reason": "edited"})
    first = await environment(workflow_id).run(approvals.record_decision, attempt)
    assert first.accepted and first.args is not None
    bob = (UserRole.tenant_id == "acme") & (UserRole.user_id == "bob")
    async with db_engine.begin() as conn:
        await conn.execute(delete(UserRole).where(bob))
    try:
        again = await environment(workflow_id).run(approvals.record_decision, attempt)
        fresh = await environment(workflow_id, activity_id="8").run(approvals.record_decision, attempt)
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(insert(UserRole).values(tenant_id="acme", user_id="bob", role="reviewer"))
    assert again == first
    assert not fresh.accepted and fresh.reason and "may not decide" in fresh.reason
    assert [r.accepted for r in await rows(db_engine, workflow_id)] == [True, False]


async def test_every_other_attempt_gets_its_own_row(
    approvals: ApprovalActivities, db_engine: AsyncEngine, workflow_id: str
) -> None:
    """Another activity id (the next decision) or another run (after continue-as-new or a reset)
    is another attempt, audited separately."""
    refused = record(workflow_id, approver="alice")
    accepted = record(workflow_id)
    await environment(workflow_id, activity_id="7").run(approvals.record_decision, refused)
    await environment(workflow_id, activity_id="9").run(approvals.record_decision, accepted)
    await environment(workflow_id, activity_id="7", run_id="run-2").run(approvals.record_decision, refused)
    keys = [r.attempt_key for r in await rows(db_engine, workflow_id)]
    assert keys == [f"{workflow_id}:run-1:7", f"{workflow_id}:run-1:9", f"{workflow_id}:run-2:7"]


@pytest.mark.parametrize("twins", [2, 8])
async def test_concurrent_runs_of_one_attempt_insert_one_row(
    approvals: ApprovalActivities, db_engine: AsyncEngine, workflow_id: str, twins: int
) -> None:
    for n, attempt in enumerate(
        [record(workflow_id), record(workflow_id, approver="alice"), record(workflow_id, args=QUALIFY)]
    ):
        env = environment(workflow_id, activity_id=str(n))
        verdicts = await asyncio.gather(*(env.run(approvals.record_decision, attempt) for _ in range(twins)))
        assert all(v == verdicts[0] for v in verdicts)
    found = await rows(db_engine, workflow_id)
    assert [r.attempt_key.rsplit(":", 1)[1] for r in found] == ["0", "1", "2"]
    assert [r.accepted for r in found] == [True, False, True]


async def test_a_run_that_loses_the_race_returns_the_winners_verdict(
    approvals: ApprovalActivities, db_engine: AsyncEngine, workflow_id: str
) -> None:
    """The twin's insert is not committed when this run looks for the row: this run's insert waits
    on it, inserts nothing once it commits, and answers from the twin's row (here a refusal this
    run would not have made, so the answer can only come from the row)."""
    key = f"{workflow_id}:run-1:7"
    async with db_engine.connect() as twin:
        await twin.begin()
        await twin.execute(
            insert(ApprovalDecision).values(
                tenant_id="acme",
                workflow_id=workflow_id,
                call_id="c1",
                tool="update_lead_status",
                approver="bob",
                decision="approve",
                accepted=False,
                reason="refused by the twin",
                attempt_key=key,
            )
        )
        run = asyncio.create_task(
            environment(workflow_id).run(approvals.record_decision, record(workflow_id))
        )
        async with db_engine.connect() as watcher:
            for _ in range(200):  # until the run's insert waits on the twin's row
                waiting = await watcher.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO approval_decisions%'"
                    )
                )
                await watcher.rollback()  # activity statistics are a snapshot per transaction
                if waiting or run.done():
                    break
                await asyncio.sleep(0.02)
        assert waiting == 1 and not run.done()
        await twin.commit()
    assert await run == Verdict(accepted=False, reason="refused by the twin")
    (row,) = await rows(db_engine, workflow_id)
    assert row.reason == "refused by the twin"


async def test_a_key_recorded_for_another_decision_fails_loudly(
    approvals: ApprovalActivities, db_engine: AsyncEngine, workflow_id: str
) -> None:
    """Never answer one decision with another's verdict (a key collision is a bug, not a retry)."""
    await environment(workflow_id).run(approvals.record_decision, record(workflow_id, approver="carol"))
    with pytest.raises(ApplicationError) as conflict:
        await environment(workflow_id).run(approvals.record_decision, record(workflow_id))
    assert conflict.value.type == "DecisionAttemptConflict" and conflict.value.non_retryable
    assert len(await rows(db_engine, workflow_id)) == 1
