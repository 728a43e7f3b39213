"""The tool activity: validate the model's arguments, run the tool, audit it, exactly once.

One transaction holds the tool's effect and its audit row (`tool_executions`, unique per workflow id,
conversation instance and call id). An advisory lock (`lock_key`) serializes concurrent attempts of
the same call, and an
attempt that finds the row returns the recorded result instead of acting again: so a retry after a
commit (worker crash, lost completion, timeout) changes nothing twice. A call that runs also takes a
token from its tenant's rate limit bucket for the tool, in the same transaction: a retry that finds
its recorded result takes none, and a call over the limit is audited as failed with RATE_LIMITED.
Before any of it, the access gate (activities/access.py) checks again that the conversation's user is
still an active user with the scopes the tool needs: refused calls are audited as refused.

A call is planned once, inside the transaction that makes the change and locking what the plan
reads (`ctx.lock_reads`), and its tool applies that same plan (tools/registry.py `Plan`). An approved
call runs only on what was approved: when its plan's effect digest differs from the approved one
(`approval_requests.effect_sha256`, what the reviewer was shown and their proof bound; for an
approver's edit, the edit's effect on its decision) nothing changes: the approval is recorded as
voided, no audit row or result is written (the call is not over), and the activity answers
EFFECT_CHANGED, on which the workflow asks for a decision again.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

from pydantic import BaseModel
from sqlalchemy import String, bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.access import admit, check_standing
from activities.audit import approval_reason, ran_audit_row, standing_approvals
from activities.failures import is_connection_error
from activities.heartbeat import heartbeats
from activities.rules import approval_required, asks_now, not_run, refusal_now, ruled, rules_now
from countersign.core.activity_refs import CHECK_ARGUMENTS, EXECUTE_TOOL
from countersign.core.calls import CheckedCall, StoredResult, ToolError, ToolInvocation, ToolResult, lock_key
from countersign.core.effects import Effect
from countersign.core.guards import TruncationLimits, sanitize
from countersign.db.chain import chain
from countersign.db.events import QUESTION_TOOL, publish
from countersign.db.messages import audited_answer, result_or_envelope
from countersign.db.ratelimit import RateLimits
from countersign.db.schema import ApprovalDecision, ApprovalRequest, SagaRecord, ToolExecution
from tools.arguments import validate
from tools.registry import REGISTRY, Needs, OutcomeUnknown, Plan, Tool, ToolArgs, ToolContext, ToolFailure


class EffectChanged(Exception):
    """An approved call's plan, made where it is applied, does not have the approved effect."""

    def __init__(self, effect: Effect) -> None:
        super().__init__(f"the effect changed since it was approved: {effect.summary}")
        self.effect = effect


def output_result(output: BaseModel) -> ToolResult:
    """A native tool's output as the result the model reads: its data, or what it still needs."""
    if isinstance(output, Needs):
        return ToolResult(ok=False, needs=output.fields, data=output.candidates or None)
    return ToolResult.success(output.model_dump(mode="json"))


def saga_record(invocation: ToolInvocation) -> SagaRecord:
    """The saga entry of a compensable call that executed (see activities/rollback.py)."""
    return SagaRecord(
        workflow_id=invocation.workflow_id,
        conversation_id=invocation.conversation_id,
        call_id=invocation.call_id,
        tenant_id=invocation.caller.tenant_id,
        caller=invocation.caller.model_dump(mode="json"),
        tool=invocation.tool,
        turn=invocation.turn,
        arguments=invocation.arguments,
    )


async def approved_plan(
    tool: Tool, context: ToolContext, args: ToolArgs, approved: str
) -> tuple[Plan, Effect]:
    """The call's plan and its effect, made in `context`'s transaction with the rows it reads
    locked until that transaction ends; raises EffectChanged unless the effect's digest is the
    `approved` one."""
    plan = await tool.plan(replace(context, lock_reads=True), args)
    effect = plan.effect()
    if effect.digest != approved:
        raise EffectChanged(effect)
    return plan, effect


class Approved(NamedTuple):
    """What a reviewer approved for a call: its effect's digest, and when the call was asked (its
    approval request's `requested_at`, where the plan they were shown started its clock)."""

    digest: str
    asked_at: datetime | None


async def approved_effect(session: AsyncSession, invocation: ToolInvocation) -> Approved | None:
    """The effect a reviewer approved for this call: as its approval request recorded it, or, when
    the approver edited the arguments, as their decision recorded the edit's; None for a call nobody
    approved, or one approved before effects were recorded."""
    if invocation.approved_by is None:
        return None
    request = (
        await session.execute(
            select(ApprovalRequest.effect_sha256, ApprovalRequest.requested_at, ApprovalRequest.state).where(
                ApprovalRequest.conversation_id == invocation.conversation_id,
                ApprovalRequest.call_id == invocation.call_id,
                ApprovalRequest.workflow_id == invocation.workflow_id,
            )
        )
    ).one_or_none()
    asked_at = request.requested_at if request is not None else None
    if invocation.arguments_edited:
        digest = await session.scalar(
            select(ApprovalDecision.effect_sha256)
            .where(*standing_approvals(invocation))
            .order_by(ApprovalDecision.id.desc())
            .limit(1)
        )
    else:
        digest = request.effect_sha256 if request is not None and request.state == "approved" else None
    return Approved(digest, asked_at) if digest is not None else None


# The two statements every tool call starts with, built once: a statement built per call costs its
# construction and its cache key each time (issue 36's profile: twice the cost of running it).
LOCK_CALL = select(func.pg_advisory_xact_lock(func.hashtextextended(bindparam("lock", type_=String), 0)))
RECORDED = select(ToolExecution.result).where(
    ToolExecution.workflow_id == bindparam("workflow_id"),
    ToolExecution.conversation_id == bindparam("conversation_id"),
    ToolExecution.call_id == bindparam("call_id"),
)


class ToolActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        limits: TruncationLimits | None = None,
        rate_limits: RateLimits | None = None,
    ) -> None:
        self._sessions = sessions
        self._limits = limits or TruncationLimits()
        self._rate_limits = rate_limits or RateLimits()

    @activity.defn(name=EXECUTE_TOOL.name)
    @heartbeats
    async def execute_tool(self, invocation: ToolInvocation) -> ToolResult | StoredResult:
        """The call's result; with `invocation.store_seq`, stored as its tool message in the
        transaction of its effect and audit row, and answered with the small `StoredResult`."""
        tool = REGISTRY.get(invocation.tool)
        async with self._sessions() as session, session.begin():
            if tool is None:  # the workflow screens calls first; this is the defence in depth
                result = ToolResult.failure("UNKNOWN_TOOL", f"no tool named {invocation.tool!r}")
                return await result_or_envelope(session, invocation, result)
            await session.execute(LOCK_CALL, {"lock": lock_key(invocation.workflow_id, invocation.call_id)})
            recorded = await session.scalar(
                RECORDED,
                {
                    "workflow_id": invocation.workflow_id,
                    "conversation_id": invocation.conversation_id,
                    "call_id": invocation.call_id,
                },
            )
            if recorded is not None:
                return await result_or_envelope(session, invocation, ToolResult.model_validate(recorded))
            spec = tool.spec()
            rules = await rules_now(session, invocation, spec)
            refusal = refusal_now(rules, spec)
            if refusal is None and asks_now(rules, invocation):
                return approval_required(invocation)
            if rules.policy is not None:  # the decision in force, with its set's version, in the audit
                invocation = invocation.model_copy(update={"policy": rules.policy})
            try:
                result, audit = await self._run(session, tool, invocation, refusal)
                audit["roles"] = rules.roles  # the requester's at the call: what `policy test` replays
                # stopped by the rules in force, before the tool, as the workflow stops one
                if refusal is not None:
                    audit["outcome"] = "blocked"
            except EffectChanged as changed:
                return await self._voided(session, invocation, changed.effect)
            return await audited_answer(session, invocation, result, audit)

    @staticmethod
    async def _voided(
        session: AsyncSession, invocation: ToolInvocation, effect: Effect
    ) -> ToolResult | StoredResult:
        """Record the call's approval as voided by `effect`, in `session`'s transaction (where the
        tool's writes were rolled back; a rate-limit token taken stays spent, as for any attempt),
        and answer EFFECT_CHANGED; nothing is stored at the call's sequence number, which its
        eventual result takes."""
        voided = await session.scalars(
            update(ApprovalDecision)
            .where(*standing_approvals(invocation))
            .values(voided_at=func.now(), voided=effect.model_dump(mode="json"))
            .returning(ApprovalDecision)
            .execution_options(populate_existing=True)
        )
        for decision in voided.all():
            await chain(session, decision)  # a voided approval is a fact of the audit too
        message = (
            f"{invocation.tool} did not run: its effect changed since it was approved ({effect.summary})"
        )
        if invocation.store_seq is None:
            return ToolResult(
                ok=False,
                data=effect.model_dump(mode="json"),
                error=ToolError(code="EFFECT_CHANGED", message=message),
            )
        return not_run(invocation, invocation.store_seq, "EFFECT_CHANGED")

    @activity.defn(name=CHECK_ARGUMENTS.name)
    async def check_arguments(self, invocation: ToolInvocation) -> CheckedCall:
        """Validate a call's arguments before a human is asked to approve it.

        Answers `{"ok": true, "data": <normalized arguments>}`, the VALIDATION_ERROR envelope, or the
        access gate's refusal (the user deactivated, a scope missing: activities/access.py), with
        the rules in force now (activities/rules.py), which the workflow acts on: a refusal by them
        is the envelope too.
        An `ask_human` call whose question checks is asked next: its readers are told here (the
        `question` event), when the workflow is about to wait for the answer, not before.
        """
        tool = REGISTRY.get(invocation.tool)
        if tool is None:
            return CheckedCall.failure("UNKNOWN_TOOL", f"no tool named {invocation.tool!r}")
        try:
            checked = CheckedCall.success(validate(tool, invocation.arguments).model_dump(mode="json"))
        except ToolFailure as failure:
            return CheckedCall.failure(failure.code, failure.message)
        except Exception:  # a bug in a validator: refuse now (never retried, never sent to a reviewer)
            activity.logger.exception("checking %s arguments failed", tool.name)
            return CheckedCall.failure("INTERNAL_ERROR", f"the arguments of {tool.name} could not be checked")
        async with self._sessions() as session:
            try:  # nobody is asked to approve, or to answer, for a user who can no longer act
                await check_standing(session, invocation.caller, tool.name, tool.scopes)
            except ToolFailure as refused:
                return CheckedCall.failure(refused.code, refused.message)
            if tool.name != QUESTION_TOOL:
                spec = tool.spec()
                checked = ruled(checked, await rules_now(session, invocation, spec), spec)
                await session.commit()  # a shadow set's difference, found on the way, is kept
        if tool.name == QUESTION_TOOL and isinstance(checked.data, dict):
            asked = {"call_id": invocation.call_id, "question": str(checked.data.get("question", ""))}
            async with self._sessions() as session, session.begin():
                await publish(
                    session, invocation.workflow_id, invocation.conversation_id, invocation.caller.tenant_id,
                    "question", asked,
                    f"question:{invocation.call_id}",
                )  # fmt: skip
        return checked

    async def _run(
        self,
        session: AsyncSession,
        tool: Tool,
        invocation: ToolInvocation,
        refusal: ToolFailure | None = None,
    ) -> tuple[ToolResult, dict[str, Any]]:
        """Run the call in `session`'s transaction: its result, and its audit row's values;
        `refusal`: the rules in force stop it (activities/rules.py), audited, before anything runs."""
        started = datetime.now(UTC)
        clock = time.perf_counter()
        unknown = False
        effect: Effect | None = None
        try:
            if refusal is not None:
                raise refusal
            await admit(session, invocation.caller, tool.name, tool.scopes, self._rate_limits, started)
            parsed = validate(tool, invocation.arguments)
            context = ToolContext(
                caller=invocation.caller,
                session=session,
                workflow_id=invocation.workflow_id,
                call_id=invocation.call_id,
                now=started,
                conversation_id=invocation.conversation_id,
                lock_reads=True,  # what the plan reads stays as read until the plan is applied
            )
            async with (
                session.begin_nested()
            ):  # a failing tool's partial writes roll back; the audit row stays
                approved = await approved_effect(session, invocation)
                if approved is None:
                    plan = await tool.plan(context, parsed)
                else:
                    context = replace(context, asked_at=approved.asked_at)
                    plan, effect = await approved_plan(tool, context, parsed, approved.digest)
                result = output_result(await tool.apply(context, plan))
        except EffectChanged:
            raise
        except ToolFailure as failure:
            unknown = isinstance(failure, OutcomeUnknown)
            result = ToolResult.failure(failure.code, failure.message)
        except Exception as exc:
            if is_connection_error(exc):
                raise  # the database is out of reach: Temporal retries the call
            # A bug or a value the database refused fails the same way on every attempt: an error
            # envelope now, with its audit row; the details (SQL, parameters) stay in the worker's log.
            error_id = f"{invocation.workflow_id}:{invocation.call_id}"
            activity.logger.exception("%s failed (%s)", tool.name, error_id)
            message = f"{tool.name} failed unexpectedly; the operators' log has details ({error_id})"
            result = ToolResult.failure("INTERNAL_ERROR", message)
        result = result.model_copy(update={"data": sanitize(result.data, self._limits)})
        audit = ran_audit_row(
            invocation,
            result,
            risk=tool.risk,
            category=tool.category,
            started=started,
            clock=clock,
            unknown=unknown,
            effect=effect,
            decision_reason=await approval_reason(session, invocation),
        )
        if audit["outcome"] == "executed" and tool.compensation is not None:
            session.add(saga_record(invocation))  # what a rollback after the conversation's end undoes
        return result, audit
