"""The policy gate's judgement of one call, in the caller's transaction: what `evaluate_policy`
(activities/policies.py) answers for the model's call, and what `record_decision`
(activities/approvals.py) asks of a reviewer's edit, which is a new call judged again (one function,
so an edit meets exactly the rules the call met). A helper: it declares no activity.

Authority comes from the database, at the call: the requester's roles now, the enforced set now,
the audit's counts and sums the set names, all three in one statement (countersign/db/policies.py
`gate_reads`), and the call's plan now (read-only; tools/registry.py `Plan`): policies judge its
normalized arguments (`context.args`, one spelling for every spelling the tool accepts) and its
effect (`context.effect`), never the model's text. A shadow set is evaluated beside the enforced
one and changes nothing: a call whose outcome would differ is recorded in `shadow_differences`
(once per call).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio import activity

from countersign.core.calls import NO_MATCH, PolicyDecision, ToolInvocation
from countersign.core.cedar_policy import CallFacts, PolicySetError, decide
from countersign.core.effects import Effect, arguments_effect
from countersign.core.policy import PolicyCheck
from countersign.db.policies import gate_reads, loaded
from countersign.db.schema import ShadowDifference
from countersign.mcp.catalog import normalized
from tools.arguments import validate
from tools.registry import REGISTRY, Plan, ToolContext, ToolFailure


async def judge(session: AsyncSession, check: PolicyCheck, arguments: dict[str, Any]) -> PolicyDecision:
    """The enforced set's decision on the call with `arguments` (its parsed JSON object) in
    `session`'s transaction, with the set's version; no set: no match; a set that cannot be loaded
    (applied before the bounds, and past them) refuses every call, naming why."""
    invocation, caller = check.invocation, check.invocation.caller
    try:  # both parse the sets (once per process): a set past the bounds is never parsed
        reads = await gate_reads(
            session,
            tenant_id=caller.tenant_id,
            user=caller.user_id,
            spec=check.spec,
            at=datetime.now(UTC),
        )
        if reads is None:
            return NO_MATCH
        sets = {mode: loaded(text) for mode, (text, _) in reads.sets.items()}
    except PolicySetError as broken:  # applied before the bounds, and past them: refuse, saying why
        return PolicyDecision(outcome="forbid", error=f"the tenant's policy set cannot be loaded: {broken}")
    effect: Effect | None = None
    if check.spec.mcp is not None:  # an MCP tool's plan: its call, normalized by its schema
        arguments = normalized(check.spec.parameters, arguments)
        effect = arguments_effect(invocation.tool, arguments)
    elif (plan := await planned(session, check, reads.roles)) is not None:
        arguments, effect = plan.arguments(), plan.effect()
    call = CallFacts(
        user=caller.user_id,
        roles=reads.roles,
        agent=caller.agent,
        spec=check.spec,
        arguments=arguments,
        effect=effect,
        history=reads.history.counts,
        sums=reads.history.sums,
    )
    enforced = decide(sets["enforced"], call) if "enforced" in sets else NO_MATCH
    if "shadow" in sets:
        would = decide(sets["shadow"], call)
        if would != enforced:
            await record_difference(session, invocation, reads.sets["shadow"][1], enforced, would)
    if "enforced" in sets and enforced.outcome != "no_match":  # which set decided, for the record
        return enforced.model_copy(update={"version": reads.sets["enforced"][1]})
    return enforced


async def planned(session: AsyncSession, check: PolicyCheck, roles: tuple[str, ...]) -> Plan | None:
    """The call's plan now, made read-only (in a savepoint) for the requester. None when its tool is
    unknown or its arguments do not validate (its own checks refuse it next), or when the plan
    breaks: policies then judge the arguments as the model wrote them, with no `context.effect`."""
    invocation = check.invocation
    tool = REGISTRY.get(invocation.tool)
    if tool is None:
        return None
    try:
        args = validate(tool, invocation.arguments)
    except ToolFailure:
        return None
    context = ToolContext(
        caller=invocation.caller.model_copy(update={"roles": list(roles)}),
        session=session,
        workflow_id=invocation.workflow_id,
        call_id=invocation.call_id,
        now=datetime.now(UTC),
        conversation_id=invocation.conversation_id,
    )
    if tool.planner is None:  # a read's plan is its arguments: nothing is read, no savepoint needed
        return await tool.plan(context, args)
    try:
        async with session.begin_nested():
            return await tool.plan(context, args)
    except Exception:  # a plan that breaks decides nothing here: the approval step shows it
        activity.logger.exception("planning %s for its policies failed", invocation.tool)
        return None


async def record_difference(
    session: AsyncSession,
    invocation: ToolInvocation,
    version: int,
    enforced: PolicyDecision,
    shadow: PolicyDecision,
) -> None:
    """A call the shadow set would decide otherwise, once (a retried activity finds its row)."""
    await session.execute(
        insert(ShadowDifference)
        .values(
            tenant_id=invocation.caller.tenant_id,
            shadow_version=version,
            workflow_id=invocation.workflow_id,
            conversation_id=invocation.conversation_id,
            call_id=invocation.call_id,
            tool=invocation.tool,
            requested_by=invocation.caller.user_id,
            enforced=enforced.model_dump(mode="json", exclude_defaults=True),
            shadow=shadow.model_dump(mode="json", exclude_defaults=True),
        )
        .on_conflict_do_nothing()
    )
