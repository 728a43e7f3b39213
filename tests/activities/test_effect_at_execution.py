"""Nothing runs that was not approved (issue 34): an approved call's tool resolves its effect again in
the transaction that would make it, and runs only when it is the effect approved.

Property tests generate what someone else does between the decision and the execution (a status
changed, a name corrected, the record deleted, a draft rewritten or redirected) for each tool with an
effect, and run the real tool activity on the real PostgreSQL: either the call runs and what it did
is what was approved, or nothing changed, the activity answers EFFECT_CHANGED with the new effect,
and the approval is recorded as voided.

    EFFECT_EXAMPLES=200 .venv/bin/python -m pytest tests/activities/test_effect_at_execution.py -q
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from activities.tools import EffectChanged, ToolActivities, approved_plan
from countersign.core.calls import CallerContext, ToolInvocation, ToolResult
from countersign.core.effects import Effect
from countersign.db.engine import session_factory
from countersign.db.ratelimit import RateLimit, RateLimits
from countersign.db.schema import (
    LEAD_STATUSES,
    ApprovalDecision,
    ApprovalRequest,
    EmailDraft,
    EmailOutbox,
    Lead,
    LeadEvent,
    MeetingSession,
    Notification,
    ToolExecution,
)
from tests.tools.test_effects import MODELS, RUNNABLE, Sample, fingerprint, sample_context
from tools.arguments import parse_arguments
from tools.registry import REGISTRY, Needs, ToolContext, ToolFailure
from tools.resolve import as_json

EXAMPLES = int(os.environ.get("EFFECT_EXAMPLES", "25"))
CALLER = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="lead-qualifier")
UNLIMITED = RateLimits(
    default=RateLimit(per_s=1e6, burst=1e6), per_user=RateLimit(per_s=1e6, burst=1e6), tenant_settings=False
)
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def invocation(tool: str, arguments: dict[str, Any], asked: dict[str, Any] | None = None) -> ToolInvocation:
    """bob's approved call; `asked`: the model's arguments, which bob edited to `arguments`."""
    return ToolInvocation(
        caller=CALLER,
        workflow_id=f"wf-effect-{uuid.uuid4().hex[:12]}",
        run_id="run-1",
        call_id="c1",
        tool=tool,
        arguments=json.dumps(arguments),
        model_arguments=json.dumps(asked) if asked is not None else None,
        approved_by="bob",
    )


async def resolved(
    sessions: async_sessionmaker[AsyncSession], tool: str, arguments: dict[str, Any]
) -> Effect:
    """The effect a reviewer is shown: the tool's plan's, read-only, in its own transaction."""
    declared = REGISTRY[tool]
    async with sessions() as session, session.begin():
        ctx = ToolContext(CALLER, session, "wf-preview", "c0", datetime.now(UTC))
        return (await declared.plan(ctx, parse_arguments(declared, arguments))).effect()


async def approved_by_bob(
    sessions: async_sessionmaker[AsyncSession],
    inv: ToolInvocation,
    effect: Effect,
    requested_at: datetime | None = None,
) -> None:
    """The call's request (asked at `requested_at`, default now), and bob's accepted approval of
    `effect`, as the worker's record_approval_request and record_decision leave them (an edit's
    effect on the decision)."""
    edited = inv.arguments_edited
    now = requested_at or datetime.now(UTC)
    async with sessions() as session, session.begin():
        session.add(
            ApprovalRequest(
                conversation_id=inv.conversation_id,
                call_id=inv.call_id,
                workflow_id=inv.workflow_id,
                tenant_id="acme",
                agent=CALLER.agent,
                tool=inv.tool,
                risk="high",
                args=inv.model_arguments or inv.arguments,
                args_sha256="-",
                nonce="n",
                requested_by="alice",
                requested_at=now,
                expires_at=now + timedelta(hours=1),
                effect=None if edited else effect.model_dump(mode="json"),
                effect_sha256=None if edited else effect.digest,
                state="approved",
                decided_by="bob",
            )
        )
        session.add(
            ApprovalDecision(
                tenant_id="acme",
                workflow_id=inv.workflow_id,
                call_id=inv.call_id,
                tool=inv.tool,
                approver="bob",
                decision="approve",
                accepted=True,
                args=json.loads(inv.arguments) if edited else None,
                effect=effect.model_dump(mode="json") if edited else None,
                effect_sha256=effect.digest if edited else None,
            )
        )


@dataclass
class Outcome:
    result: ToolResult
    audited: bool  # a tool_executions row was written
    voided: dict[str, Any] | None  # approval_decisions.voided of bob's approval


async def execute(
    engine: AsyncEngine, inv: ToolInvocation, approved: Effect, requested_at: datetime | None = None
) -> Outcome:
    sessions = session_factory(engine)
    await approved_by_bob(sessions, inv, approved, requested_at)
    result = await ToolActivities(sessions, rate_limits=UNLIMITED).execute_tool(inv)
    assert isinstance(result, ToolResult)
    async with sessions() as session:
        audited = await session.scalar(
            select(ToolExecution.id).where(ToolExecution.workflow_id == inv.workflow_id)
        )
        voided = await session.scalar(
            select(ApprovalDecision.voided).where(ApprovalDecision.workflow_id == inv.workflow_id)
        )
        await session.execute(delete(ApprovalDecision).where(ApprovalDecision.workflow_id == inv.workflow_id))
        await session.execute(delete(ToolExecution).where(ToolExecution.workflow_id == inv.workflow_id))
        await session.execute(delete(ApprovalRequest).where(ApprovalRequest.workflow_id == inv.workflow_id))
        await session.commit()
    return Outcome(result, audited is not None, voided)


def check(outcome: Outcome, approved: Effect, now: Effect) -> bool:
    """The property: the call ran exactly when what it would do now is what was approved; when it
    did not, the activity said so with the new effect, wrote no audit row and voided the approval.
    Returns whether it ran."""
    if now.digest == approved.digest:
        assert outcome.result.ok or outcome.result.code != "EFFECT_CHANGED", outcome.result
        assert outcome.audited and outcome.voided is None
        return outcome.result.ok
    assert outcome.result.code == "EFFECT_CHANGED", (approved, now, outcome.result)
    assert outcome.result.data == now.model_dump(mode="json")
    assert not outcome.audited and outcome.voided == now.model_dump(mode="json")
    return False


# --- a proposal (schedule_meeting): its default window starts when the call was asked ----------------


@pytest.mark.security
async def test_an_approved_proposal_runs_the_times_shown_whenever_it_runs(db_engine: AsyncEngine) -> None:
    """The reviewer was shown the proposals resolved when the call was asked (10:20 on a Monday, a
    future one: the worker's clock at the run is hours or days away from it); the tool activity
    resolves the window from the approval request's `requested_at`, so the call runs the times shown
    instead of coming back as EFFECT_CHANGED."""
    asked = datetime(2030, 1, 7, 10, 20, tzinfo=UTC)
    raw = {"with": "bob", "duration_minutes": 30, "title": "Pricing"}
    inv = invocation("schedule_meeting", raw)
    declared = REGISTRY["schedule_meeting"]
    async with session_factory(db_engine)() as session, session.begin():
        ctx = ToolContext(CALLER, session, "wf-preview", "c0", asked, asked_at=asked)
        shown = (await declared.plan(ctx, parse_arguments(declared, raw))).effect()
    assert shown.creates[0].fields["slots"][0] == "Mon 2030-01-07 11:30-12:00 UTC"  # type: ignore[index]
    outcome = await execute(db_engine, inv, shown, requested_at=asked)
    assert outcome.result.ok and outcome.audited and outcome.voided is None, outcome.result
    proposal = outcome.result.data
    assert [slot["counterpart_local"] for slot in proposal["slots"]] == shown.creates[0].fields["slots"]
    async with db_engine.begin() as conn:
        await conn.execute(delete(MeetingSession).where(MeetingSession.id == proposal["session"]))
        await conn.execute(delete(Notification).where(Notification.id == proposal["notification_id"]))
        await conn.execute(delete(EmailOutbox).where(EmailOutbox.id.in_(proposal["outbox_ids"])))


# --- a lead's status (update_lead_status) ----------------------------------------------------------

LEAD_EDITS = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(LEAD_STATUSES),
        "name": st.sampled_from(["Nina New", "Nina Newer"]),
        "company": st.sampled_from(["Newco", "Oldco", None]),
        "deleted": st.just(True),
    },
)


async def new_lead(engine: AsyncEngine, status: str) -> tuple[int, str]:
    email = f"nina.{uuid.uuid4().hex[:10]}@newco.example"
    async with session_factory(engine)() as session, session.begin():
        lead = Lead(
            tenant_id="acme", email=email, name="Nina New", company="Newco", source="web", status=status
        )
        session.add(lead)
        await session.flush()
        return lead.id, email


async def edit_lead(engine: AsyncEngine, lead_id: int, edit: dict[str, Any]) -> None:
    """Someone else's change, committed between the decision and the execution."""
    async with session_factory(engine)() as session, session.begin():
        if edit.get("deleted"):
            await session.execute(delete(Lead).where(Lead.id == lead_id))
        elif edit:
            await session.execute(update(Lead).where(Lead.id == lead_id).values(**edit))


async def drop_lead(engine: AsyncEngine, lead_id: int) -> None:
    async with session_factory(engine)() as session, session.begin():
        await session.execute(delete(LeadEvent).where(LeadEvent.lead_id == lead_id))
        await session.execute(delete(Lead).where(Lead.id == lead_id))


@pytest.mark.security
@PROPERTY
@given(
    initial=st.sampled_from(LEAD_STATUSES),
    wanted=st.sampled_from(LEAD_STATUSES),
    asked=st.none() | st.sampled_from(LEAD_STATUSES),
    edit=LEAD_EDITS,
)
async def test_a_lead_changed_between_decision_and_execution_is_asked_again(
    db_engine: AsyncEngine, initial: str, wanted: str, asked: str | None, edit: dict[str, Any]
) -> None:
    """`asked`: the status the model asked for, which bob edited to `wanted` (None: no edit)."""
    lead_id, email = await new_lead(db_engine, initial)
    try:
        sessions = session_factory(db_engine)
        args = {"lead": email, "new_status": wanted, "reason": "the call went well"}
        model = None if asked is None else args | {"new_status": asked}
        approved = await resolved(sessions, "update_lead_status", args)
        await edit_lead(db_engine, lead_id, edit)
        now = await resolved(sessions, "update_lead_status", args)
        outcome = await execute(db_engine, invocation("update_lead_status", args, model), approved)
        async with sessions() as session:
            lead = await session.get(Lead, lead_id)
        if check(outcome, approved, now):
            # what ran is what was approved: the lead has the status the effect said it would have
            assert lead is not None and lead.status == wanted
            assert all(change.fields["status"].after == wanted for change in approved.changes)
        elif not edit.get("deleted"):
            assert lead is not None and lead.status == edit.get("status", initial)  # nothing ran
    finally:
        await drop_lead(db_engine, lead_id)


# --- a saved draft (send_draft, update_draft) ------------------------------------------------------

DRAFT_EDITS = st.fixed_dictionaries(
    {},
    optional={
        "to_address": st.sampled_from(["partner@example.org", "attacker@evil.example"]),
        "subject": st.sampled_from(["Our offer", "Our new offer"]),
        "body": st.sampled_from(["Dear partner, here is our offer.", "Pay into this account instead."]),
        "deleted": st.just(True),
    },
)


async def new_draft(engine: AsyncEngine) -> int:
    async with session_factory(engine)() as session, session.begin():
        draft = EmailDraft(
            tenant_id="acme",
            idempotency_key=f"effect-{uuid.uuid4().hex}",
            created_by="alice",
            to_address="partner@example.org",
            subject="Our offer",
            body="Dear partner, here is our offer.",
        )
        session.add(draft)
        await session.flush()
        return draft.id


async def edit_draft_row(engine: AsyncEngine, draft_id: int, edit: dict[str, Any]) -> None:
    async with session_factory(engine)() as session, session.begin():
        if edit.get("deleted"):
            await session.execute(delete(EmailDraft).where(EmailDraft.id == draft_id))
        elif edit:
            await session.execute(update(EmailDraft).where(EmailDraft.id == draft_id).values(**edit))


async def drop_draft(engine: AsyncEngine, draft_id: int) -> None:
    async with session_factory(engine)() as session, session.begin():
        sent = await session.scalar(select(EmailDraft.sent_outbox_id).where(EmailDraft.id == draft_id))
        await session.execute(delete(EmailDraft).where(EmailDraft.id == draft_id))
        if sent is not None:
            await session.execute(delete(EmailOutbox).where(EmailOutbox.id == sent))


DraftCall = Callable[[int], dict[str, Any]]
DRAFT_CALLS: dict[str, DraftCall] = {
    "send_draft": lambda draft_id: {"draft": draft_id},
    "update_draft": lambda draft_id: {"draft": draft_id, "subject": "Our final offer"},
}


async def outbox_of(engine: AsyncEngine, draft_id: int) -> EmailOutbox | None:
    async with session_factory(engine)() as session:
        sent = await session.scalar(select(EmailDraft.sent_outbox_id).where(EmailDraft.id == draft_id))
        return None if sent is None else await session.get(EmailOutbox, sent)


@pytest.mark.security
@pytest.mark.parametrize("tool", sorted(DRAFT_CALLS))
@PROPERTY
@given(edit=DRAFT_EDITS)
async def test_a_draft_changed_after_the_reviewer_saw_it_is_never_sent_unseen(
    db_engine: AsyncEngine, tool: str, edit: dict[str, Any]
) -> None:
    draft_id = await new_draft(db_engine)
    try:
        sessions = session_factory(db_engine)
        args = DRAFT_CALLS[tool](draft_id)
        approved = await resolved(sessions, tool, args)
        await edit_draft_row(db_engine, draft_id, edit)
        now = await resolved(sessions, tool, args)
        outcome = await execute(db_engine, invocation(tool, args), approved)
        outbox = await outbox_of(db_engine, draft_id)
        if check(outcome, approved, now) and tool == "send_draft":
            # the email queued is the one the reviewer read, to the recipient they read
            (message,) = approved.messages
            assert outbox is not None
            assert (outbox.to_address, outbox.subject, outbox.body) == (
                message.to[0],
                message.subject,
                message.body,
            )
        elif tool == "send_draft":
            assert outbox is None  # nothing queued
    finally:
        await drop_draft(db_engine, draft_id)


# --- every tool that changes something (the catalog's samples, tests/tools/test_effects.py) -------------

# What someone else does to the first record the approved effect changes, meanwhile: nothing, the
# same change the call would make (so the call would now change nothing), or deleting the record.
MUTATIONS = st.sampled_from(["none", "same", "delete"])


async def mutate(session: AsyncSession, approved: Effect, mutation: str) -> bool:
    """Apply `mutation` to the first record `approved` changes; False when it cannot apply here (no
    record changes, a date field, a row others still reference)."""
    if mutation == "none":
        return True
    if not approved.changes or approved.changes[0].kind not in MODELS:
        return False
    change = approved.changes[0]
    row = await session.get(MODELS[change.kind], int(change.id))
    assert row is not None
    try:
        async with session.begin_nested():
            if mutation == "delete":
                await session.delete(row)
            else:
                for name, field in change.fields.items():
                    if isinstance(getattr(row, name), date):
                        return False
                    setattr(row, name, field.after)
            await session.flush()
    except IntegrityError:
        return False
    return True


@pytest.mark.security
@pytest.mark.parametrize("sample", RUNNABLE, ids=lambda s: s.id)
@PROPERTY
@given(mutation=MUTATIONS)
async def test_what_runs_is_what_was_approved_for_every_tool_that_changes_something(
    db_session: AsyncSession, sample: Sample, mutation: str
) -> None:
    """The execution's plan and check (`activities.tools.approved_plan`), then that plan applied,
    in one transaction, on
    the seeded data (rolled back after each example): the call runs only on the approved effect,
    and then its records hold the approved values; otherwise nothing changes."""
    declared = REGISTRY[sample.tool]
    example = await db_session.begin_nested()
    try:
        ctx, raw = await sample_context(db_session, sample)
        args = parse_arguments(declared, raw)
        approved = (await declared.plan(ctx, args)).effect()
        assume(await mutate(db_session, approved, mutation))
        now = (await declared.plan(ctx, args)).effect()
        before = await fingerprint(db_session)
        outbox = set(await db_session.scalars(select(EmailOutbox.id)))
        try:
            async with db_session.begin_nested():
                plan, _ = await approved_plan(declared, ctx, args, approved.digest)
                result = await declared.apply(ctx, plan)
        except EffectChanged as changed:
            assert now.digest != approved.digest and changed.effect.digest == now.digest
            assert await fingerprint(db_session) == before  # nothing ran
            return
        except ToolFailure:
            assert approved.problem is not None  # approved as failing, and it failed
            return
        assert now.digest == approved.digest and not isinstance(result, Needs)
        for change in approved.changes:
            row = await db_session.get(MODELS[change.kind], int(change.id))
            assert row is not None
            await db_session.refresh(row)
            assert {name: as_json(getattr(row, name)) for name in change.fields} == {
                name: c.after for name, c in change.fields.items()
            }
        queued = await db_session.scalars(select(EmailOutbox).where(EmailOutbox.id.not_in(outbox or {0})))
        assert sorted((q.to_address, q.subject, q.body) for q in queued) == sorted(
            (m.to[0], m.subject, m.body) for m in approved.messages if m.channel == "email"
        )
    finally:
        await example.rollback()
