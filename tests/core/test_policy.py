"""What the workflow does with each tool call before anything runs (countersign.core.policy), from
the permission snapshot alone: refuse with the envelope the model reads, ask a person, or run."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from countersign.core.calls import Tier, ToolSpec
from countersign.core.messages import ToolCall
from countersign.core.policy import ASK_HUMAN, callable_tools, offered_tools, screen_call

TIERS: tuple[Tier, ...] = get_args(Tier)


def spec(name: str, tier: Tier = "always_allow", roles: list[str] | None = None) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=name,
        parameters={"type": "object", "properties": {}},
        risk="low",
        category="read",
        tier=tier,
        required_roles=roles or [],
    )


TOOLS = {
    s.name: s
    for s in [
        spec("search_leads"),
        spec("update_lead_status", "needs_approval"),
        spec("delete_everything", "blocked"),
        spec("export_leads", roles=["admin", "reviewer"]),
        spec(ASK_HUMAN, "needs_approval"),
    ]
}


def call(name: str, arguments_chars: int | None = None) -> ToolCall:
    return ToolCall(id="c1", name=name, arguments="{}", arguments_chars=arguments_chars)


def test_a_known_allowed_call_runs_with_its_spec() -> None:
    screening = screen_call(call("search_leads"), TOOLS, ["sales"])
    assert (screening.action, screening.spec, screening.refusal) == ("run", TOOLS["search_leads"], None)


def test_a_call_needing_approval_asks_a_reviewer() -> None:
    screening = screen_call(call("update_lead_status"), TOOLS, ["sales"])
    assert (screening.action, screening.spec) == ("approve", TOOLS["update_lead_status"])


def test_ask_human_is_the_workflows_own_whatever_its_tier() -> None:
    assert screen_call(call(ASK_HUMAN), TOOLS, []).action == "ask_human"


def test_an_unknown_tool_is_refused_naming_what_is_available_but_not_the_blocked() -> None:
    refusal = screen_call(call("approve"), TOOLS, ["admin"]).refusal
    assert refusal is not None and refusal.code == "UNKNOWN_TOOL"
    assert refusal.error is not None and refusal.error.message == (
        "no tool named 'approve'; available: ask_human, export_leads, search_leads, update_lead_status"
    )


def test_a_blocked_tool_is_refused_before_its_roles_are_looked_at() -> None:
    blocked = {"delete_everything": spec("delete_everything", "blocked", roles=["admin"])}
    refusal = screen_call(call("delete_everything"), blocked, ["sales"]).refusal
    assert refusal is not None and refusal.code == "BLOCKED"


def test_a_tool_needing_a_role_the_user_lacks_is_forbidden() -> None:
    refusal = screen_call(call("export_leads"), TOOLS, ["sales"]).refusal
    assert refusal is not None and refusal.code == "FORBIDDEN"
    assert (
        refusal.error is not None and refusal.error.message == "export_leads needs the role admin or reviewer"
    )
    assert screen_call(call("export_leads"), TOOLS, ["sales", "reviewer"]).action == "run"


def test_oversized_arguments_are_refused_even_for_an_allowed_tool() -> None:
    refusal = screen_call(call("search_leads", arguments_chars=70_000), TOOLS, ["sales"]).refusal
    assert refusal is not None and refusal.code == "VALIDATION_ERROR"
    assert refusal.error is not None and "70000 characters" in refusal.error.message


def test_the_model_is_offered_every_tool_but_the_blocked_in_order() -> None:
    assert [t.name for t in offered_tools(list(TOOLS.values()))] == [
        "search_leads",
        "update_lead_status",
        "export_leads",
        ASK_HUMAN,
    ]


@given(
    name=st.sampled_from([*TOOLS, "nope", "Search_Leads", "search_leads "]),
    tier=st.sampled_from(TIERS),
    needs=st.lists(st.sampled_from(["admin", "reviewer", "sales"]), max_size=2),
    roles=st.lists(st.sampled_from(["admin", "reviewer", "sales", "Admin"]), max_size=3),
    oversized=st.booleans(),
)
def test_a_call_runs_only_when_everything_says_it_may(
    name: str, tier: Tier, needs: list[str], roles: list[str], oversized: bool
) -> None:
    """Fail closed: a call runs only when its tool is known by that exact name, allowed without
    approval, its roles are met and its arguments came whole; it asks a reviewer only when all of
    that holds but the tier needs approval."""
    tools = {n: spec(n, tier, needs) if n == name else s for n, s in TOOLS.items()}
    screening = screen_call(call(name, 70_000 if oversized else None), tools, roles)
    admissible = (
        name in tools
        and tools[name].tier != "blocked"
        and (not tools[name].required_roles or bool(set(tools[name].required_roles) & set(roles)))
        and not oversized
    )
    assert (screening.action == "refuse") == (not admissible)
    assert (screening.refusal is not None) == (screening.action == "refuse")
    if admissible and name != ASK_HUMAN:
        assert screening.action == ("approve" if tools[name].tier == "needs_approval" else "run")


@given(roles=st.lists(st.sampled_from(["admin", "reviewer", "sales", "viewer"]), max_size=3))
def test_a_client_is_offered_exactly_what_screening_would_let_it_call(roles: list[str]) -> None:
    """`callable_tools` (what an MCP client lists) leaves out just the tools `screen_call` would
    refuse before their arguments are read: blocked ones and those the roles lack."""
    offered = {t.name for t in callable_tools(list(TOOLS.values()), roles)}
    for name in TOOLS:
        refusal = screen_call(ToolCall(id="c", name=name), TOOLS, roles).refusal
        assert (name in offered) == (refusal is None), (name, roles)
