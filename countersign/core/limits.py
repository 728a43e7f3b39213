"""Pure limit checks for one turn. The workflow asks before each model call and each tool batch."""

from __future__ import annotations

from countersign.core.contract import AgentLimits, Limits
from countersign.core.messages import Usage

MIN_MODEL_CALL_S = 0.001


def before_model_call(limits: Limits, turn: Usage, elapsed_s: float) -> str | None:
    """Why the turn may not call the model again, or None when it may."""
    if turn.model_calls >= limits.max_iterations:
        return f"the turn reached max_iterations ({limits.max_iterations} model calls)"
    if turn.total_tokens >= limits.max_tokens:
        return f"the turn used {turn.total_tokens} tokens, max_tokens is {limits.max_tokens}"
    if elapsed_s >= limits.turn_timeout_s - MIN_MODEL_CALL_S:  # a shorter call's timeout would round to zero
        return f"the turn ran {elapsed_s:.0f}s, turn_timeout_s is {limits.turn_timeout_s:.0f}"
    return None


def tool_call_budget(limits: Limits, turn: Usage) -> int:
    """How many more tool calls this turn may make."""
    return max(0, limits.max_tool_calls - turn.tool_calls)


def within_agent_bounds(requested: Limits, agent: AgentLimits) -> Limits:
    """The conversation's limits capped by the agent's: each bounded key takes the smaller value.

    A conversation may tighten what the agent allows, never loosen it; an approval timeout left to
    the per-risk default (None) takes the agent's bound when it has one.
    """
    capped: dict[str, float | int] = {}
    for key, bound in agent.model_dump(exclude_none=True).items():
        asked = getattr(requested, key)
        capped[key] = bound if asked is None else min(asked, bound)
    return requested.model_copy(update=capped) if capped else requested
