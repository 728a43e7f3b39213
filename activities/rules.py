"""The rules in force at a call: the operators' tier for the tool now and the tenant's policy set now.

A conversation's snapshot (its tiers, whether its tenant had policies) is what it started with; the
rules that decide a call are today's, whatever the conversation's age (issue 48 item 7). So the
activities a call runs anyway ask here, in their own transaction, with no activity added:

- `check_arguments` / `check_mcp_arguments`, before anyone is asked to approve: the workflow acts on
  the answer (`RulesNow`): refuse, run unasked, or ask (with the quorum a policy wants);
- `execute_tool` / `execute_mcp_tool`, at the moment it would run: a tool blocked since, or a call a
  policy forbids now, is refused and audited there; a call nobody approved that needs approval now
  answers APPROVAL_REQUIRED (nothing ran, nothing was stored) and the workflow asks.

One statement reads the tier and whether the tenant has sets; the policy gate's reads follow only
for a tenant with sets (a tenant without pays one round trip per call, no activity). The decision of
the enforced set carries its version (`PolicyDecision.version`), so the audit row, the approval
request and the decision record which set decided. A shadow set is evaluated beside it and changes
nothing: a call it would decide otherwise is recorded in `shadow_differences` (once per call).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import String, bindparam, exists, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio import activity

from countersign.core.calls import (
    NO_MATCH,
    CheckedCall,
    PolicyDecision,
    RulesNow,
    StoredResult,
    Tier,
    ToolError,
    ToolInvocation,
    ToolResult,
    ToolSpec,
)
from countersign.core.cedar_policy import CallFacts, PolicySetError, decide
from countersign.core.effects import Effect, arguments_effect
from countersign.core.policy import PolicyCheck, forbidden
from countersign.db.policies import gate_reads, loaded
from countersign.db.schema import AgentToolPermission, ShadowDifference, TenantPolicy, TenantToolTier
from countersign.mcp.catalog import MCP_DEFAULT_TIER
from tools.arguments import load_arguments, validate
from tools.effects import preview_effect
from tools.registry import REGISTRY, ToolContext, ToolFailure

_TENANT = bindparam("tenant_id", type_=String)
_AGENT = bindparam("agent", type_=String)
_TOOL = bindparam("tool", type_=String)
# Built once (every call reads it): the tenant's tier, the agent's tier, and whether the tenant has
# a policy set.
TIER_NOW = select(
    select(TenantToolTier.tier)
    .where(TenantToolTier.tenant_id == _TENANT, TenantToolTier.agent == _AGENT, TenantToolTier.tool == _TOOL)
    .scalar_subquery(),
    select(AgentToolPermission.tier)
    .where(AgentToolPermission.agent == _AGENT, AgentToolPermission.tool == _TOOL)
    .scalar_subquery(),
    exists().where(TenantPolicy.tenant_id == _TENANT, TenantPolicy.text != ""),
)


async def rules_now(session: AsyncSession, invocation: ToolInvocation, spec: ToolSpec) -> RulesNow:
    """The tier of the call's tool now (the tenant's own, else the agent's, else the tool's default)
    and, for a tenant with policies, the enforced set's decision now."""
    caller = invocation.caller
    own, agent_tier, has_sets = (
        await session.execute(
            TIER_NOW, {"tenant_id": caller.tenant_id, "agent": caller.agent, "tool": spec.name}
        )
    ).one()
    default: Tier = MCP_DEFAULT_TIER if spec.mcp is not None else REGISTRY[spec.name].default_tier
    tier: Tier = own or agent_tier or default
    policy = (
        await policy_decision(session, PolicyCheck(invocation=invocation, spec=spec)) if has_sets else None
    )
    return RulesNow(tier=tier, policy=policy if policy is not None and policy.outcome != "no_match" else None)


async def policy_decision(session: AsyncSession, check: PolicyCheck) -> PolicyDecision:
    """The enforced set's decision on the call now, with its version (no set, or arguments that are
    no JSON object: no match, and the call's own checks refuse what is wrong with it). A set that
    cannot be loaded (applied before the bounds, and past them) refuses every call, naming why."""
    invocation, caller = check.invocation, check.invocation.caller
    try:
        arguments = load_arguments(invocation.arguments)
    except ToolFailure:
        return NO_MATCH
    try:  # both parse the sets (once per process): a set past the bounds is never parsed
        reads = await gate_reads(
            session, tenant_id=caller.tenant_id, user=caller.user_id, spec=check.spec, at=datetime.now(UTC)
        )
        if reads is None:
            return NO_MATCH
        sets = {mode: loaded(text) for mode, (text, _) in reads.sets.items()}
    except PolicySetError as broken:
        return PolicyDecision(outcome="forbid", error=f"the tenant's policy set cannot be loaded: {broken}")
    effect = None
    if any(s.reads_effect for s in sets.values()):
        effect = await resolved_effect(session, check, reads.roles, arguments)
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
    if "enforced" in sets and enforced.outcome != "no_match":
        return enforced.model_copy(update={"version": reads.sets["enforced"][1]})
    return enforced


async def resolved_effect(
    session: AsyncSession, check: PolicyCheck, roles: tuple[str, ...], arguments: dict[str, Any]
) -> Effect | None:
    """What the call would do now, as its tool's preview resolves it (read-only, in a savepoint)
    for the requester; an MCP tool's is its arguments. None when its arguments do not validate
    (its own checks refuse it next) or the preview breaks: policies see no `context.effect`."""
    invocation = check.invocation
    tool = REGISTRY.get(invocation.tool)
    if tool is None or check.spec.mcp is not None:
        return arguments_effect(invocation.tool, arguments)
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
    try:
        async with session.begin_nested():
            return await preview_effect(tool, context, args)
    except Exception:  # a preview that breaks decides nothing here: the approval step shows it
        activity.logger.exception("resolving the effect of %s for its policies failed", invocation.tool)
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


def refusal_now(rules: RulesNow, tool: str) -> ToolFailure | None:
    """The refusal of a call the rules in force stop whoever asked: blocked, or forbidden."""
    if rules.tier == "blocked":
        return ToolFailure("BLOCKED", f"{tool} is blocked for this agent")
    if rules.policy is not None and rules.policy.outcome == "forbid":
        result = forbidden(rules.policy, tool)
        assert result.error is not None
        return ToolFailure(result.error.code, result.error.message)
    return None


def asks_now(rules: RulesNow, invocation: ToolInvocation) -> bool:
    """Whether a call about to run needs an approval it does not have under the rules in force: a
    policy's quorum, or the tool's tier now, when nobody (no person, no grant) approved it."""
    if invocation.approved_by is not None:
        return False
    if rules.policy is not None:
        return rules.policy.outcome == "permit_approvals"
    return rules.tier == "needs_approval"


def approval_required(invocation: ToolInvocation) -> ToolResult | StoredResult:
    """What `execute_tool` / `execute_mcp_tool` answer for a call `asks_now` stops: nothing ran and
    nothing is stored at its sequence number, which its eventual result takes."""
    if invocation.store_seq is None:
        message = f"{invocation.tool} needs approval under the rules in force now; it did not run"
        return ToolResult.failure("APPROVAL_REQUIRED", message)
    return StoredResult(
        seq=invocation.store_seq,
        call_id=invocation.call_id,
        tool=invocation.tool,
        ok=False,
        code="APPROVAL_REQUIRED",
    )


def ruled(checked: CheckedCall, rules: RulesNow, tool: str) -> CheckedCall:
    """A call's checked arguments with the rules in force, refused here when they stop it."""
    refusal = refusal_now(rules, tool) if checked.ok else None
    if refusal is not None:
        return CheckedCall(ok=False, error=ToolError(code=refusal.code, message=refusal.message), rules=rules)
    return checked.model_copy(update={"rules": rules})
