"""Pure decisions the workflow makes about each tool call, before anything runs.

`screen_call` answers, from the permission snapshot alone: refuse (with the envelope the model
will read), ask a human first, or run. Argument validation happens later, in the tool activity,
because only it knows the pydantic models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from countersign.core.calls import PolicyDecision, ToolInvocation, ToolResult, ToolSpec
from countersign.core.messages import MAX_ARGUMENTS_CHARS, ToolCall

ASK_HUMAN = "ask_human"  # handled by the workflow itself, never by an activity

Action = Literal["run", "approve", "ask_human", "refuse"]


@dataclass(frozen=True)
class Screening:
    action: Action
    spec: ToolSpec | None = None
    refusal: ToolResult | None = None  # set when action == "refuse"


def refuse(result: ToolResult) -> Screening:
    return Screening(action="refuse", refusal=result)


def screen_call(call: ToolCall, tools: dict[str, ToolSpec], roles: list[str]) -> Screening:
    """Decide what to do with one call. Fail closed: anything not known to be allowed is refused."""
    spec = tools.get(call.name)
    if spec is None:
        known = ", ".join(sorted(n for n, s in tools.items() if s.tier != "blocked"))
        return refuse(ToolResult.failure("UNKNOWN_TOOL", f"no tool named {call.name!r}; available: {known}"))
    if spec.tier == "blocked":
        return refuse(ToolResult.failure("BLOCKED", f"{call.name} is blocked for this agent"))
    if (missing := role_refusal(spec, roles)) is not None:
        return refuse(ToolResult.failure("FORBIDDEN", missing))
    if call.arguments_chars is not None:
        return refuse(
            ToolResult.failure(
                "VALIDATION_ERROR",
                f"arguments were {call.arguments_chars} characters, over the limit of {MAX_ARGUMENTS_CHARS}",
            )
        )
    if call.name == ASK_HUMAN:
        return Screening(action="ask_human", spec=spec)
    if spec.tier == "needs_approval":
        return Screening(action="approve", spec=spec)
    return Screening(action="run", spec=spec)


def role_refusal(spec: ToolSpec, roles: list[str]) -> str | None:
    """Why a person with `roles` may not call `spec`'s tool (FORBIDDEN), or None: the workflow asks
    with the roles its conversation started with, the activities again with the roles now."""
    if spec.required_roles and not set(spec.required_roles) & set(roles):
        return f"{spec.name} needs the role {' or '.join(spec.required_roles)}"
    return None


def offered_tools(tools: list[ToolSpec]) -> list[ToolSpec]:
    """What the model is shown: every tool of the agent except blocked ones."""
    return [t for t in tools if t.tier != "blocked"]


def callable_tools(tools: list[ToolSpec], roles: list[str]) -> list[ToolSpec]:
    """What a client calling tools directly is offered: the model's tools (`offered_tools`) that
    `roles` may call (`screen_call` refuses the others as FORBIDDEN)."""
    return [t for t in offered_tools(tools) if role_refusal(t, roles) is None]


# --- a tenant's Cedar policies (countersign/core/cedar_policy.py evaluates them, in an activity) ----


class PolicyCheck(BaseModel):
    """One call for the policy gate (`evaluate_policy`), with its spec from the snapshot."""

    invocation: ToolInvocation
    spec: ToolSpec


def forbidden(decision: PolicyDecision, tool: str) -> ToolResult:
    """The refusal a forbidding policy gives the model: nobody was asked, and asking again is useless."""
    why = f" (its evaluation failed: {decision.error})" if decision.error else ""
    return ToolResult.failure(
        "FORBIDDEN", f"the tenant's policy {decision.policy or '(unnamed)'} forbids this {tool} call{why}"
    )
