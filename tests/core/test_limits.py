"""A turn's limits (countersign.core.limits) and the bounds on them (countersign.core.contract), as
plain functions: when a turn may call the model again, how many tool calls it has left, and how an
agent's bounds cap a conversation's limits without ever loosening them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from countersign.core.contract import AgentLimits, ApprovalPolicy, Limits
from countersign.core.limits import before_model_call, tool_call_budget, within_agent_bounds
from countersign.core.messages import Usage

LIMITS = Limits(max_iterations=3, max_tool_calls=4, max_tokens=1_000, turn_timeout_s=60.0)


def used(model_calls: int = 0, tokens: int = 0, tool_calls: int = 0) -> Usage:
    return Usage(model_calls=model_calls, prompt_tokens=tokens, tool_calls=tool_calls)


def test_a_fresh_turn_may_call_the_model() -> None:
    assert before_model_call(LIMITS, used(), 0.0) is None
    assert before_model_call(LIMITS, used(model_calls=2, tokens=999), 59.0) is None


def test_each_limit_stops_the_turn_at_its_value_and_says_which() -> None:
    assert before_model_call(LIMITS, used(model_calls=3), 0.0) == (
        "the turn reached max_iterations (3 model calls)"
    )
    assert before_model_call(LIMITS, used(tokens=1_000), 0.0) == (
        "the turn used 1000 tokens, max_tokens is 1000"
    )
    assert before_model_call(LIMITS, Usage(prompt_tokens=400, completion_tokens=600), 0.0) is not None
    assert before_model_call(LIMITS, used(), 60.0) == "the turn ran 60s, turn_timeout_s is 60"


def test_a_turn_with_less_than_a_millisecond_left_calls_the_model_no_more() -> None:
    """A model call's timeout is what is left of the turn: one that would round to zero is not made."""
    assert before_model_call(LIMITS, used(), 60.0 - 0.0005) is not None
    assert before_model_call(LIMITS, used(), 60.0 - 0.002) is None


def test_iterations_are_checked_before_tokens_and_time() -> None:
    refusal = before_model_call(LIMITS, used(model_calls=3, tokens=5_000), 100.0)
    assert refusal is not None and "max_iterations" in refusal


@given(limit=st.integers(0, 10_000), calls=st.integers(0, 20_000))
def test_the_tool_call_budget_is_what_is_left_never_negative(limit: int, calls: int) -> None:
    budget = tool_call_budget(Limits(max_tool_calls=limit), used(tool_calls=calls))
    assert budget == max(0, limit - calls)


BOUNDED = [key for key in AgentLimits.model_fields]
LIMIT_VALUES = {
    "max_iterations": st.integers(1, 10_000),
    "max_tool_calls": st.integers(0, 10_000),
    "max_tokens": st.integers(1, 100_000_000),
    "turn_timeout_s": st.floats(1, 86_400),
    "approval_timeout_s": st.none() | st.floats(1, 366 * 86_400.0),
    "answer_timeout_s": st.floats(1, 366 * 86_400.0),
    "idle_timeout_s": st.floats(1, 366 * 86_400.0),
}


@st.composite
def conversation_limits(draw: st.DrawFn) -> Limits:
    return Limits(**{key: draw(values) for key, values in LIMIT_VALUES.items()})


@st.composite
def agent_bounds(draw: st.DrawFn) -> AgentLimits:
    chosen = draw(st.sets(st.sampled_from(BOUNDED)))
    return AgentLimits(**{key: draw(LIMIT_VALUES[key].filter(lambda v: v is not None)) for key in chosen})


@given(requested=conversation_limits(), agent=agent_bounds())
def test_an_agents_bounds_cap_a_conversation_but_never_loosen_it(
    requested: Limits, agent: AgentLimits
) -> None:
    capped = within_agent_bounds(requested, agent)
    for key in BOUNDED:
        asked, bound, got = getattr(requested, key), getattr(agent, key), getattr(capped, key)
        if bound is None:
            assert got == asked
        elif asked is None:  # the approval timeout left to the per-risk default takes the agent's bound
            assert got == bound
        else:
            assert got == min(asked, bound)
    assert capped.max_turns_per_run == requested.max_turns_per_run  # no agent bound for it
    assert within_agent_bounds(capped, agent) == capped  # capping twice changes nothing


def test_without_agent_bounds_the_conversation_keeps_its_limits() -> None:
    assert within_agent_bounds(LIMITS, AgentLimits()) is LIMITS


def test_the_admin_assistants_seeded_bounds_become_its_defaults() -> None:
    capped = within_agent_bounds(Limits(), AgentLimits(max_iterations=7, turn_timeout_s=50))
    assert (capped.max_iterations, capped.turn_timeout_s) == (7, 50)
    assert capped.max_tokens == Limits().max_tokens


@pytest.mark.parametrize(
    "payload",
    [
        {"max_iterations": 0},  # a turn that may not call the model does nothing
        {"max_tool_calls": -1},
        {"max_tokens": 0},
        {"turn_timeout_s": 0.5},  # a timeout that rounds to zero is an error in workflow code
        {"turn_timeout_s": float("inf")},
        {"idle_timeout_s": float("nan")},
        {"answer_timeout_s": 367 * 86_400.0},
        {"max_turns_per_run": 10_001},
        {"max_iterations": 8, "grant_admin": True},  # no key the workflow does not know
    ],
)
def test_limits_out_of_bounds_are_refused(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Limits.model_validate(payload)


@pytest.mark.parametrize(
    "payload", [{"max_iterations": 0}, {"turn_timeout_s": 0}, {"max_tool_calls": -1}, {"x": 1}]
)
def test_agent_bounds_out_of_range_or_unknown_are_refused(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        AgentLimits.model_validate(payload)


def test_an_approval_waits_for_the_conversations_timeout_else_its_risks() -> None:
    policy = ApprovalPolicy(timeout_s={"low": 600.0, "medium": 3_600.0, "high": 7_200.0})
    assert policy.timeout_for("high", None) == 7_200.0
    assert policy.timeout_for("low", 90.0) == 90.0
    assert ApprovalPolicy(timeout_s={}).timeout_for("medium", None) == 86_400.0


@pytest.mark.parametrize(
    "bound",
    [{"turn_timeout_s": 0.5}, {"idle_timeout_s": 0.01}, {"approval_timeout_s": 0.2}, {"max_iterations": 0}],
)
def test_an_agent_bound_that_limits_would_refuse_is_refused_where_it_is_read(bound: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        AgentLimits.model_validate(bound)


@given(
    turn=st.floats(min_value=1, max_value=3_600),
    idle=st.floats(min_value=1, max_value=86_400),
)
def test_capped_limits_are_limits_that_validate(turn: float, idle: float) -> None:
    capped = within_agent_bounds(Limits(), AgentLimits(turn_timeout_s=turn, idle_timeout_s=idle))
    assert Limits.model_validate(capped.model_dump()) == capped
