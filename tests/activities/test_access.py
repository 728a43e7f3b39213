"""Who may act, at each tool call (issue 24): a user deactivated or removed mid-conversation, scopes a
tool needs, and a user's own rate limit beside the tenant's. Real parts: the workflow on the
time-skipping server, embedded PostgreSQL, the scripted model through the openai client, and the CLI
as a person runs it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from activities.tools import ToolActivities
from countersign.core.access import SCOPES, Scope
from countersign.core.approvals import Decision
from countersign.core.calls import CallerContext, ToolInvocation, ToolResult
from countersign.db import access
from countersign.db.engine import session_factory
from countersign.db.ratelimit import CallLimits, RateLimit, RateLimits, take_call
from countersign.db.schema import (
    Conversation,
    Lead,
    RateLimitBucket,
    Task,
    TenantRateLimit,
    ToolExecution,
    User,
    UserRole,
    UserScope,
)
from countersign.db.seed import TENANT_RATE_LIMITS
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import ECHO_RESULT, pending, qualify
from tests.fixtures.cli import run_starter
from tests.fixtures.postgres import JANE
from tests.fixtures.updates import execute_update
from tools.registry import NeedsInput, ToolContext, ToolFailure
from tools.resolve import resolve_person, resolve_user
from workflows.agent import AgentWorkflow

NewUser = Callable[..., Awaitable[str]]
T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest_asyncio.fixture
async def new_user(db_engine: AsyncEngine) -> AsyncIterator[NewUser]:
    """Makes acme users of this test only (other tests count the seeded ones), removed afterwards
    with their roles, scopes and buckets."""
    made: list[str] = []

    async def make(roles: tuple[str, ...] = ("sales",), scopes: tuple[Scope, ...] = SCOPES) -> str:
        user_id = f"acc-{uuid.uuid4().hex[:10]}"
        async with db_engine.begin() as conn:
            await conn.execute(
                insert(User).values(
                    tenant_id="acme", id=user_id, display_name=user_id, email=f"{user_id}@acme.example"
                )
            )
            for role in roles:
                await conn.execute(insert(UserRole).values(tenant_id="acme", user_id=user_id, role=role))
            for scope in scopes:
                await conn.execute(
                    insert(UserScope).values(
                        tenant_id="acme", user_id=user_id, scope=scope, granted_by="test"
                    )
                )
        made.append(user_id)
        return user_id

    yield make
    async with db_engine.begin() as conn:
        await conn.execute(delete(RateLimitBucket).where(RateLimitBucket.user_id.in_(made)))
        # the conversations they started name them (the audit of what those did stays)
        await conn.execute(
            delete(Conversation).where(Conversation.tenant_id == "acme", Conversation.user_id.in_(made))
        )
        await conn.execute(delete(User).where(User.tenant_id == "acme", User.id.in_(made)))


async def set_active(engine: AsyncEngine, user_id: str, active: bool) -> None:
    async with session_factory(engine)() as session, session.begin():
        assert await access.set_active(session, "acme", user_id, active, datetime.now(UTC))


def tool_results(transcript: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(m.content or "") for m in transcript if m.role == "tool"]


async def audit(engine: AsyncEngine, workflow_id: str) -> list[Any]:
    async with engine.connect() as conn:
        return list(
            await conn.execute(
                select(ToolExecution)
                .where(ToolExecution.workflow_id == workflow_id)
                .order_by(ToolExecution.id)
            )
        )


# --- deactivated and removed users ------------------------------------------------------------------


async def test_a_user_deactivated_mid_conversation_cannot_act_through_it(
    agent: AgentHarness, db_engine: AsyncEngine, new_user: NewUser
) -> None:
    """The call waits for approval; meanwhile the user is deactivated. The reviewer's approval is
    refused, saying why (the call could no longer run: issue 48 item 9); a rejection ends it, and
    nothing ran: membership is checked at the decision and the call, not at the start."""
    user = await new_user()
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", user=user, single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    await set_active(db_engine, user, active=False)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await execute_update(
            handle,
            AgentWorkflow.decide,
            Decision(call_id=waiting.call_id, decision="approve", approver="bob"),
        )
    assert f"{user} is deactivated in acme: this call can no longer run" in str(refused.value.cause)
    decided = await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="reject", approver="bob")
    )
    assert decided.state == "rejected"
    await handle.result()

    (result,) = tool_results(await agent.transcript(handle))
    assert result["error"]["code"] == "REJECTED"
    async with db_engine.connect() as conn:
        assert (
            await conn.scalar(select(Lead.status).where(Lead.tenant_id == "acme", Lead.email == JANE))
            == "new"
        )

    # nor start another conversation
    with pytest.raises(WorkflowFailureError):
        await agent.converse("hello", user=user)


async def test_the_next_turn_of_a_deactivated_users_conversation_runs_no_tool(
    agent: AgentHarness, db_engine: AsyncEngine, new_user: NewUser
) -> None:
    """A conversation that ran a tool for its user runs none for them once they are deactivated:
    the model is told CONNECTION_INACTIVE at the next call, and the call is audited as refused."""
    user = await new_user()
    agent.script(
        {"when": {"turn_calls": 0}, "reply": {"tool_calls": [SEARCH]}},
        {"when": {"after_tool": "search_leads"}, "reply": {"content": "done"}},
    )
    handle = await agent.start("search jane", user=user)
    results = await tool_results_once(agent, handle, 1)
    assert results[0]["ok"]
    await set_active(db_engine, user, active=False)
    await handle.signal("submit_message", {"user_id": user, "text": "search jane again"})
    results = await tool_results_once(agent, handle, 2)
    assert results[1]["error"]["code"] == "CONNECTION_INACTIVE"
    assert [(r.outcome, r.user_id) for r in await audit(db_engine, handle.id)] == [
        ("executed", user),
        ("refused", user),
    ]


async def tool_results_once(agent: AgentHarness, handle: Any, count: int) -> list[dict[str, Any]]:
    """The conversation's tool results once there are `count` and its turn is over."""
    for _ in range(400):
        status = await handle.query(AgentWorkflow.status)
        results = tool_results(await agent.transcript(handle))
        if len(results) >= count and status.state == "idle":
            return results
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {count} tool results: {results}")


async def test_no_reviewer_is_asked_for_a_user_who_can_no_longer_act(
    db_engine: AsyncEngine, new_user: NewUser
) -> None:
    """The check before approval: a deactivated user's call, and a removed user's, are refused
    before anyone is asked (the workflow audits the refusal, as for invalid arguments)."""
    tools = ToolActivities(session_factory(db_engine))
    user = await new_user()
    await set_active(db_engine, user, active=False)

    def call(user_id: str) -> ToolInvocation:
        return ToolInvocation(
            caller=CallerContext(tenant_id="acme", user_id=user_id, roles=["sales"], agent="lead-qualifier"),
            workflow_id=f"wf-{uuid.uuid4()}",
            run_id="run-1",
            call_id="c1",
            tool="update_lead_status",
            arguments=json.dumps({"lead": JANE, "new_status": "qualified", "reason": "budget"}),
        )

    deactivated = await tools.check_arguments(call(user))
    removed = await tools.check_arguments(call("nobody-here"))
    assert deactivated.code == removed.code == "CONNECTION_INACTIVE"
    assert removed.error is not None and "nobody-here is no longer a user in acme" in removed.error.message
    await set_active(db_engine, user, active=True)
    assert (await tools.check_arguments(call(user))).ok


async def test_a_deactivated_user_is_nobody_a_tool_can_name(
    db_engine: AsyncEngine, new_user: NewUser
) -> None:
    """Not a meeting's counterpart, nor an assignee: tools resolve only active users."""
    user = await new_user()
    async with session_factory(db_engine)() as session:
        ctx = ToolContext(
            caller=CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="scheduler"),
            session=session,
            workflow_id="wf",
            call_id="c1",
            now=datetime.now(UTC),
        )
        assert (await resolve_person(ctx, user, field="with")).user_id == user
        await access.set_active(session, "acme", user, False, datetime.now(UTC))
        with pytest.raises(ToolFailure, match="nobody named"):
            await resolve_person(ctx, user, field="with")
        with pytest.raises(NeedsInput) as offered:
            await resolve_user(ctx, user, field="assignee")
        assert user not in json.dumps(offered.value.needs.candidates)
        await session.rollback()


# --- scopes -----------------------------------------------------------------------------------------


def meeting_calls(tool: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"when": {"user_contains": tool}, "reply": {"tool_calls": [{"name": tool, "arguments": arguments}]}},
        {"when": {"after_tool": tool}, "reply": {"content": "done"}},
    ]


async def test_a_missing_scope_is_named_and_a_granted_one_lets_the_call_through(
    agent: AgentHarness, db_engine: AsyncEngine, new_user: NewUser
) -> None:
    user = await new_user(scopes=("calendar:availability",))
    agent.script(
        *meeting_calls("schedule_meeting", {"with": "Jane Doe", "duration_minutes": 30}),
        *meeting_calls("confirm_meeting", {"session": 987654321, "selection": 1}),
    )
    proposed = await agent.start("schedule_meeting with Jane", user=user, agent="scheduler", single_turn=True)
    await proposed.result()
    (refused,) = tool_results(await agent.transcript(proposed))
    assert refused["error"]["code"] == "SCOPES_MISSING"
    message = refused["error"]["message"]
    assert "calendar:propose" in message and "calendar:availability" not in message, message
    (row,) = await audit(db_engine, proposed.id)
    assert (row.outcome, row.user_id) == ("refused", user)

    async with session_factory(db_engine)() as session, session.begin():
        assert await access.grant(
            session, "acme", user, ["calendar:book", "calendar:availability"], "test"
        ) == ["calendar:book"]
    booked = await agent.start("confirm_meeting 1", user=user, agent="scheduler", single_turn=True)
    await booked.result()
    (answer,) = tool_results(await agent.transcript(booked))
    assert answer["error"]["code"] == "NOT_FOUND", answer  # past the gate: the tool itself answered


async def test_a_role_lost_since_the_conversation_started_refuses_the_call_before_and_at_execution(
    db_engine: AsyncEngine, new_user: NewUser
) -> None:
    """The conversation's start snapshotted an admin's roles (its workflow screens calls with them);
    the activities read the roles now: a demoted admin's write_record is refused before a reviewer
    is asked and, approved earlier, when it would run, and nothing is written."""
    user = await new_user(roles=("admin",))
    async with db_engine.begin() as conn:
        await conn.execute(delete(UserRole).where(UserRole.tenant_id == "acme", UserRole.user_id == user))
    title = f"role-check-{uuid.uuid4().hex[:8]}"
    asked = ToolInvocation(
        caller=CallerContext(tenant_id="acme", user_id=user, roles=["admin"], agent="admin-assistant"),
        workflow_id=f"wf-{uuid.uuid4()}",
        run_id="run-1",
        call_id="c1",
        tool="write_record",
        arguments=json.dumps({"collection": "tasks", "values": [{"field": "title", "value": title}]}),
    )
    tools = ToolActivities(session_factory(db_engine))
    try:
        checked = await tools.check_arguments(asked)
        ran = await tools.execute_tool(asked.model_copy(update={"approved_by": "bob"}))
        async with db_engine.connect() as conn:
            written = await conn.scalar(select(Task.id).where(Task.title == title))
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(ToolExecution).where(ToolExecution.workflow_id == asked.workflow_id))
            await conn.execute(delete(Task).where(Task.title == title))
    for refused in (checked.error, ran.error if isinstance(ran, ToolResult) else None):
        assert refused is not None and refused.code == "FORBIDDEN", (checked, ran)
        assert refused.message == "write_record needs the role admin", refused
    assert written is None


# --- rate limits ------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def tight_search(db_engine: AsyncEngine) -> AsyncIterator[None]:
    """acme's own limit for search_leads: 3 calls for the tenant, 2 for a user (no refill to speak
    of); removed afterwards with the buckets it filled."""
    async with session_factory(db_engine)() as session, session.begin():
        await access.set_rate_limit(session, "acme", "search_leads", (0.001, 3), (0.001, 2))
    yield
    async with db_engine.begin() as conn:
        await conn.execute(
            delete(TenantRateLimit).where(
                TenantRateLimit.tenant_id == "acme", TenantRateLimit.tool == "search_leads"
            )
        )
        await conn.execute(
            delete(RateLimitBucket).where(
                RateLimitBucket.tenant_id == "acme", RateLimitBucket.tool == "search_leads"
            )
        )


SEARCH = {"name": "search_leads", "arguments": {"query": "Jane"}}


async def searches(agent: AgentHarness, user: str, count: int) -> list[dict[str, Any]]:
    agent.script(
        {"when": {"turn_calls": 0}, "reply": {"tool_calls": [SEARCH] * count}},
        {"when": {"after_tool": "search_leads"}, "reply": {"content": "done"}},
    )
    handle = await agent.start("search", user=user, single_turn=True)
    await handle.result()
    return tool_results(await agent.transcript(handle))


@pytest.mark.usefixtures("tight_search")
async def test_one_user_spending_their_limit_does_not_block_another(
    agent: AgentHarness, db_engine: AsyncEngine, new_user: NewUser
) -> None:
    flooder, other = await new_user(), await new_user()
    results = await searches(agent, flooder, 3)
    limited = [r["error"] for r in results if not r["ok"]]
    assert sum(r["ok"] for r in results) == 2 and len(limited) == 1
    assert limited[0]["code"] == "RATE_LIMITED"
    assert (
        f"{flooder}'s own limit: 0.001/s" in limited[0]["message"]
        and "retry in 1000 s" in limited[0]["message"]
    )

    (result,) = await searches(agent, other, 1)
    assert result["ok"], "the flooder's refused call took nothing from the tenant's bucket"

    # the tenant's three are spent now: the workspace's limit, said so, and the user's token is kept
    (result,) = await searches(agent, other, 1)
    assert result["error"]["code"] == "RATE_LIMITED"
    assert "the workspace's limit, shared by all its users" in result["error"]["message"]
    async with db_engine.connect() as conn:
        tokens = await conn.scalar(
            select(RateLimitBucket.tokens).where(
                RateLimitBucket.tenant_id == "acme",
                RateLimitBucket.tool == "search_leads",
                RateLimitBucket.user_id == other,
            )
        )
    assert tokens == pytest.approx(1.0, abs=0.01), "a call the tenant refused took nothing from the user"


def test_the_worker_limits_and_the_seeded_ones() -> None:
    limits = RateLimits.from_env(
        {"RATE_LIMIT_USER_PER_S": "2", "RATE_LIMIT_USER_BURST": "4", "RATE_LIMIT_TENANT_SETTINGS": "off"}
    )
    assert limits.per_user == RateLimit(2, 4) and limits.default == RateLimits().default
    assert not limits.tenant_settings and RateLimits.from_env({}).tenant_settings
    seeded = TENANT_RATE_LIMITS  # a user's share leaves the tenant's other users a token at least
    assert seeded["user_per_s"] <= seeded["per_s"] and seeded["user_burst"] + 1 <= seeded["burst"]


async def test_a_tenants_own_limits_come_before_the_workers(db_engine: AsyncEngine) -> None:
    """The tenant's row for the tool, else its `*` row (seeded), else the worker's limits."""
    worker = RateLimits(RateLimit(7, 7), per_user=RateLimit(3, 3))
    seeded = CallLimits(RateLimit(10, 20), RateLimit(5, 10))
    async with session_factory(db_engine)() as session:
        assert await worker.for_call(session, "acme", "get_lead") == seeded
        assert await worker.for_call(session, "no-such-tenant", "get_lead") == CallLimits(
            RateLimit(7, 7), RateLimit(3, 3)
        )
        unread = RateLimits(tenant_settings=False)
        assert await unread.for_call(session, "acme", "get_lead") == CallLimits(
            unread.default, unread.per_user
        )
        await access.set_rate_limit(session, "acme", "get_lead", (1, 2), (0.5, 1))  # rolled back below
        assert await worker.for_call(session, "acme", "get_lead") == CallLimits(
            RateLimit(1, 2), RateLimit(0.5, 1)
        )
        assert await worker.for_call(session, "acme", "get_case") == seeded
        await session.rollback()


@pytest.mark.security
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gaps=st.lists(st.floats(min_value=0, max_value=2), min_size=1, max_size=25),
    user=st.tuples(st.floats(0.1, 5), st.integers(1, 6)),
    spare=st.tuples(st.floats(0, 5), st.integers(1, 6)),
)
async def test_a_flooding_user_never_empties_the_tenants_bucket_for_the_others(
    db_engine: AsyncEngine, gaps: list[float], user: tuple[float, int], spare: tuple[float, int]
) -> None:
    """Whatever one user's calls and timing, when a user's limit is below the tenant's (per second,
    and by a token in burst), another user's call still finds the tenant's bucket with a token."""
    limits = CallLimits(
        tenant=RateLimit(user[0] + spare[0], user[1] + spare[1]), user=RateLimit(user[0], user[1])
    )
    tool, now = f"prop-{uuid.uuid4()}", T0
    try:
        async with session_factory(db_engine)() as session:
            for gap in gaps:
                now += timedelta(seconds=gap)
                async with session.begin():
                    await take_call(session, "acme", "flooder", tool, limits, now)
            async with session.begin():
                assert await take_call(session, "acme", "other", tool, limits, now) is None
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(RateLimitBucket).where(RateLimitBucket.tool == tool))


# --- the CLI ----------------------------------------------------------------------------------------


async def starter(database_url: str, *args: str) -> tuple[int, str]:
    done = await run_starter(*args, env={"DATABASE_URL": database_url})
    return done.returncode, done.stdout + done.stderr


async def test_an_operator_deactivates_grants_and_sets_limits_from_the_cli(
    database_url: str, db_engine: AsyncEngine, new_user: NewUser, tmp_path: Path
) -> None:
    user = await new_user(scopes=())
    code, out = await starter(
        database_url, "users", "grant", user, "calendar:propose", "calendar:book", "--tenant", "acme"
    )
    assert code == 0 and "granted" in out and "calendar:book, calendar:propose" in out, out
    code, out = await starter(database_url, "users", "revoke", user, "calendar:book", "--tenant", "acme")
    assert code == 0 and "revoked" in out, out
    code, out = await starter(database_url, "users", "deactivate", user, "--tenant", "acme")
    assert code == 0 and "deactivated" in out, out
    code, out = await starter(database_url, "users", "list", "--tenant", "acme", "--json")
    (listed,) = [u for u in json.loads(out) if u["id"] == user]
    assert (
        listed["active"] is False
        and listed["scopes"] == ["calendar:propose"]
        and listed["roles"] == ["sales"]
    )
    code, out = await starter(
        database_url, "users", "grant", "nobody-here", "calendar:book", "--tenant", "acme"
    )
    assert code != 0 and "no user 'nobody-here' in tenant 'acme'" in out, out
    code, out = await starter(database_url, "users", "grant", user, "calendar:everything", "--tenant", "acme")
    assert code != 0 and "calendar:everything" in out, out

    tool = f"cli-{uuid.uuid4().hex[:8]}"
    try:
        code, out = await starter(
            database_url, "rate-limits", "set", "--tenant", "acme", "--tool", tool,
            "--per-s", "4", "--burst", "8", "--user-per-s", "1", "--user-burst", "2",
        )  # fmt: skip
        assert code == 0, out
        code, out = await starter(database_url, "rate-limits", "show", "--tenant", "acme", "--json")
        shown = {row["tool"]: row for row in json.loads(out)}
        assert shown[tool] == {"tool": tool, "per_s": 4, "burst": 8, "user_per_s": 1, "user_burst": 2}
        assert shown["*"]["user_burst"] == TENANT_RATE_LIMITS["user_burst"]
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(TenantRateLimit).where(TenantRateLimit.tool == tool))
