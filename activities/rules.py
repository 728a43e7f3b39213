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
request and the decision record which set decided (the judgement itself: activities/policy_gate.py).
"""

from __future__ import annotations

from sqlalchemy import String, bindparam, exists, func, select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncSession

from activities.policy_gate import judge
from countersign.core.calls import (
    NO_MATCH,
    CheckedCall,
    ErrorCode,
    PolicyDecision,
    RulesNow,
    StoredResult,
    Tier,
    ToolError,
    ToolInvocation,
    ToolResult,
    ToolSpec,
)
from countersign.core.policy import PolicyCheck, forbidden, role_refusal
from countersign.db.schema import AgentToolPermission, TenantPolicy, TenantToolTier, UserRole
from countersign.mcp.catalog import MCP_DEFAULT_TIER
from tools.arguments import load_arguments
from tools.registry import REGISTRY, ToolFailure

_TENANT = bindparam("tenant_id", type_=String)
_AGENT = bindparam("agent", type_=String)
_TOOL = bindparam("tool", type_=String)
_USER = bindparam("user_id", type_=String)
# Built once (every call reads it): the tenant's tier, the agent's tier, whether the tenant has a
# policy set, and the requester's roles (recorded with the call: what `policy test` replays it with).
TIER_NOW = select(
    select(TenantToolTier.tier)
    .where(TenantToolTier.tenant_id == _TENANT, TenantToolTier.agent == _AGENT, TenantToolTier.tool == _TOOL)
    .scalar_subquery(),
    select(AgentToolPermission.tier)
    .where(AgentToolPermission.agent == _AGENT, AgentToolPermission.tool == _TOOL)
    .scalar_subquery(),
    exists().where(TenantPolicy.tenant_id == _TENANT, TenantPolicy.text != ""),
    select(func.array_agg(aggregate_order_by(UserRole.role, UserRole.role)))
    .where(UserRole.tenant_id == _TENANT, UserRole.user_id == _USER)
    .scalar_subquery(),
)


async def rules_now(session: AsyncSession, invocation: ToolInvocation, spec: ToolSpec) -> RulesNow:
    """The tier of the call's tool now (the tenant's own, else the agent's, else the tool's default)
    and, for a tenant with policies, the enforced set's decision now."""
    caller = invocation.caller
    own, agent_tier, has_sets, roles = (
        await session.execute(
            TIER_NOW,
            {
                "tenant_id": caller.tenant_id,
                "agent": caller.agent,
                "tool": spec.name,
                "user_id": caller.user_id,
            },
        )
    ).one()
    default: Tier = MCP_DEFAULT_TIER if spec.mcp is not None else REGISTRY[spec.name].default_tier
    tier: Tier = own or agent_tier or default
    policy = (
        await policy_decision(session, PolicyCheck(invocation=invocation, spec=spec)) if has_sets else None
    )
    return RulesNow(
        tier=tier,
        policy=policy if policy is not None and policy.outcome != "no_match" else None,
        roles=list(roles or []),
    )


async def policy_decision(session: AsyncSession, check: PolicyCheck) -> PolicyDecision:
    """The enforced set's decision on the call now, with its version (no set, or arguments that are
    no JSON object: no match, and the call's own checks refuse what is wrong with it): the policy
    gate's judgement (activities/policy_gate.py), which a reviewer's edit meets too."""
    try:
        arguments = load_arguments(check.invocation.arguments)
    except ToolFailure:
        return NO_MATCH
    return await judge(session, check, arguments)


def refusal_now(rules: RulesNow, spec: ToolSpec) -> ToolFailure | None:
    """The refusal of a call the rules in force stop whoever asked: blocked, a role its requester
    no longer has (the roles now, not the conversation's start), or forbidden."""
    tool = spec.name
    if rules.tier == "blocked":
        return ToolFailure("BLOCKED", f"{tool} is blocked for this agent")
    if (missing := role_refusal(spec, rules.roles)) is not None:
        return ToolFailure("FORBIDDEN", missing)
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
    return not_run(invocation, invocation.store_seq, "APPROVAL_REQUIRED")


def not_run(invocation: ToolInvocation, seq: int, code: ErrorCode) -> StoredResult:
    """A stored call that did not run, refused with `code`: nothing is stored at `seq` (its
    sequence number), which its eventual result takes."""
    return StoredResult(seq=seq, call_id=invocation.call_id, tool=invocation.tool, ok=False, code=code)


def ruled(checked: CheckedCall, rules: RulesNow, spec: ToolSpec) -> CheckedCall:
    """A call's checked arguments with the rules in force, refused here when they stop it."""
    refusal = refusal_now(rules, spec) if checked.ok else None
    if refusal is not None:
        return CheckedCall(ok=False, error=ToolError(code=refusal.code, message=refusal.message), rules=rules)
    return checked.model_copy(update={"rules": rules})
