"""The policy gate on real parts (Temporal, PostgreSQL, the worker): a tenant's Cedar policies decide
beside the tiers. A forbid refuses unasked; a permit runs unasked; @approvals("2") needs two distinct
approvers, never the requester; a shadow set changes nothing and records the difference; a tenant
without policies adds no step to the conversation."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from countersign.core.approvals import Decision
from countersign.db.schema import ApprovalRequest, ShadowDifference, ToolExecution
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import (
    ECHO_RESULT,
    audit,
    last_tool_result,
    lead_status,
    pending,
    qualify,
)
from tests.fixtures.policies import ApplyPolicies
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow

STATUS = 'Countersign::Action::"update_lead_status"'
SEARCH = 'Countersign::Action::"search_leads"'
FIND = {
    "when": {"user_contains": "jane"},
    "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane"}}]},
}
pytestmark = pytest.mark.usefixtures("jane_is_new")


def decided(policy: dict[str, Any] | None) -> dict[str, Any] | None:
    """A recorded policy decision without the deciding set's version, which it must carry (issue 48
    item 7: the version is recorded with each decision)."""
    if policy is None:
        return None
    assert isinstance(policy.get("version"), int), policy
    return {k: v for k, v in policy.items() if k != "version"}


async def asked_policies(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the conversation's history holds a step of its own for the policy gate (runs that
    snapshotted the tenant's policies had one; the rules in force ride in the call's own activities)."""
    history = await handle.fetch_history()
    markers = [
        e.marker_recorded_event_attributes
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    recorded = [p.data for m in markers for p in m.details["data"].payloads]
    return any(b'"evaluate_policy"' in data for data in recorded)


async def test_a_forbidden_call_is_refused_unasked_naming_the_policy(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    await policies(f'@id("never-qualify") forbid(principal, action == {STATUS}, resource) '
                   'when { context.args.new_status == "qualified" };')  # fmt: skip
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    await handle.result()
    result = last_tool_result(await agent.transcript(handle))
    assert result["error"]["code"] == "FORBIDDEN"
    assert "policy never-qualify forbids this update_lead_status call" in result["error"]["message"]
    (row,) = await audit(db_engine, handle.id)
    assert (row.outcome, decided(row.policy)) == ("blocked", {"outcome": "forbid", "policy": "never-qualify"})
    async with db_engine.connect() as conn:
        asked = (
            await conn.execute(select(ApprovalRequest).where(ApprovalRequest.workflow_id == handle.id))
        ).all()
    assert asked == [] and await lead_status(db_engine, "acme") == "new"


async def test_a_policy_reads_the_calls_resolved_effect(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    """The arguments name the lead by email; only the resolved effect says whose company it is."""
    whose = 'context has effect && context.effect.summary like "*Doe Consulting*"'
    await policies(f'@id("not-doe") forbid(principal, action == {STATUS}, resource) when {{ {whose} }};')
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    await handle.result()
    assert last_tool_result(await agent.transcript(handle))["error"]["code"] == "FORBIDDEN"
    (row,) = await audit(db_engine, handle.id)
    assert decided(row.policy) == {"outcome": "forbid", "policy": "not-doe"}


async def test_a_permitted_call_runs_unasked(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    await policies(
        f'@id("qualify-freely") @allow_high("demo") permit(principal, action == {STATUS}, resource);'
    )
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    await handle.result()
    (row,) = await audit(db_engine, handle.id)
    assert (row.outcome, row.approved_by) == ("executed", None)
    assert decided(row.policy) == {"outcome": "permit_run", "policy": "qualify-freely"}
    assert await lead_status(db_engine, "acme") == "qualified"


async def test_two_approvers_distinct_and_never_the_requester(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    await policies(f'@id("two-for-status") @approvals("2") permit(principal, action == {STATUS}, resource);')
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)  # by alice
    (waiting,) = (await pending(handle)).pending_approvals

    async def decide(approver: str) -> Any:
        return await execute_update(
            handle,
            AgentWorkflow.decide,
            Decision(call_id=waiting.call_id, decision="approve", approver=approver),
        )

    first = await decide("bob")
    assert first.state == "pending" and first.progress() == "1 of 2 approved (bob)"
    (card,) = (await handle.query(AgentWorkflow.status)).pending_approvals
    assert card.quorum == "1 of 2 approved (bob)"
    for again, why in (("bob", "bob already approved"), ("alice", "alice may not decide high-risk calls")):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await decide(again)
        assert why in str(refused.value.cause)
    assert await lead_status(db_engine, "acme") == "new", "one approval of two runs nothing"
    async with db_engine.connect() as conn:
        request = (
            await conn.execute(select(ApprovalRequest).where(ApprovalRequest.workflow_id == handle.id))
        ).one()
    assert (request.state, request.approvals_required) == ("pending", 2)
    assert decided(request.policy) == {
        "outcome": "permit_approvals",
        "policy": "two-for-status",
        "approvals": 2,
    }

    second = await decide("carol")
    assert second.state == "approved" and second.decided_by == "bob, carol"
    await handle.result()
    assert await lead_status(db_engine, "acme") == "qualified"
    (row,) = await audit(db_engine, handle.id)
    assert (row.outcome, row.approved_by, row.policy["policy"]) == (
        "executed",
        "bob, carol",
        "two-for-status",
    )


async def approved_once_of_two(agent: AgentHarness, policies: ApplyPolicies) -> tuple[Any, str]:
    """A call under a two-approver policy, approved by bob alone: its conversation and call id."""
    await policies(f'@id("two-for-status") @approvals("2") permit(principal, action == {STATUS}, resource);')
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    )
    return handle, waiting.call_id


async def test_one_rejection_ends_a_quorum(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    handle, call_id = await approved_once_of_two(agent, policies)
    rejected = await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=call_id, decision="reject", approver="carol")
    )
    assert rejected.state == "rejected"
    await handle.result()
    assert last_tool_result(await agent.transcript(handle))["error"]["code"] == "REJECTED"
    assert await lead_status(db_engine, "acme") == "new"


async def test_a_shadow_set_changes_nothing_and_records_the_difference(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    await policies(f'@id("would-forbid") forbid(principal, action == {STATUS}, resource);', shadow=True)
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals  # the tiers decide, as before
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    )
    await handle.result()
    assert await lead_status(db_engine, "acme") == "qualified"
    (row,) = await audit(db_engine, handle.id)
    assert row.policy is None  # no enforced set decided anything
    async with db_engine.connect() as conn:
        (difference,) = (
            await conn.execute(select(ShadowDifference).where(ShadowDifference.workflow_id == handle.id))
        ).all()
    assert (difference.enforced, difference.shadow) == (
        {"outcome": "no_match"},
        {"outcome": "forbid", "policy": "would-forbid"},
    )
    assert not await asked_policies(handle)  # judged where the call is checked: no step added


async def test_a_tenant_without_policies_adds_no_step(agent: AgentHarness) -> None:
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    )
    await handle.result()
    assert not await asked_policies(handle)


async def test_a_quorum_short_of_n_at_its_deadline_expires_and_nothing_runs(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    handle, _ = await approved_once_of_two(agent, policies)
    await handle.result()  # the time-skipping server jumps to the deadline: fail closed
    assert last_tool_result(await agent.transcript(handle))["error"]["code"] == "EXPIRED"
    assert await lead_status(db_engine, "acme") == "new"
    (row,) = await audit(db_engine, handle.id)
    assert row.outcome == "expired"


async def test_a_history_aware_limit_refuses_the_call_past_it(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    """search_leads runs unasked (its tier); the policy allows alice one more today, then refuses."""
    async with db_engine.connect() as conn:
        ran = await conn.scalar(
            select(func.count()).where(
                ToolExecution.tenant_id == "acme", ToolExecution.user_id == "alice",
                ToolExecution.tool == "search_leads", ToolExecution.outcome == "executed",
                ToolExecution.created_at >= func.date_trunc("day", func.now(), "UTC"),
            )
        )  # fmt: skip
    limit = "context.history.calls_today_by_requester >= " + str((ran or 0) + 1)
    await policies(f'@id("one-more") forbid(principal, action == {SEARCH}, resource) when {{ {limit} }};')
    outcomes = []
    for _ in range(2):
        agent.script(FIND, {"when": {"after_tool": "search_leads"}, "reply": {"content": "done"}})
        handle = await agent.start("find jane", single_turn=True)
        await handle.result()
        outcomes.append(
            [(r.outcome, (r.policy or {}).get("policy")) for r in await audit(db_engine, handle.id)]
        )
    assert outcomes == [[("executed", None)], [("blocked", "one-more")]]


async def test_a_sum_limit_refuses_the_call_whose_field_total_reached_it(
    agent: AgentHarness, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    """A limit on the total of search_leads' `limit` argument alice asked for today: the first call
    (limit 5) runs, and the next finds the total at the limit and is refused."""
    async with db_engine.connect() as conn:
        asked = await conn.execute(
            select(ToolExecution.edited_args, ToolExecution.args).where(
                ToolExecution.tenant_id == "acme", ToolExecution.user_id == "alice",
                ToolExecution.tool == "search_leads", ToolExecution.outcome == "executed",
                ToolExecution.created_at >= func.date_trunc("day", func.now(), "UTC"),
            )
        )  # fmt: skip
        total = sum((edited or args).get("limit") or 0 for edited, args in asked)
    limit = f"context.history.sum_today_by_requester.limit >= {total + 5}"
    await policies(f'@id("rows-a-day") forbid(principal, action == {SEARCH}, resource) when {{ {limit} }};')
    find = {
        **FIND,
        "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane", "limit": 5}}]},
    }
    outcomes = []
    for _ in range(2):
        agent.script(find, {"when": {"after_tool": "search_leads"}, "reply": {"content": "done"}})
        handle = await agent.start("find jane", single_turn=True)
        await handle.result()
        outcomes.append(
            [(r.outcome, (r.policy or {}).get("policy")) for r in await audit(db_engine, handle.id)]
        )
    assert outcomes == [[("executed", None)], [("blocked", "rows-a-day")]]
