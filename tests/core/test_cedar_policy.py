"""A tenant's Cedar policy set (countersign.core.cedar_policy), without a server: what `policy apply`
refuses, and the decision on one call (forbid wins, the strictest permit decides, errors refuse)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.core.calls import PolicyDecision, Risk, ToolSpec
from countersign.core.cedar_policy import (
    ANNOTATIONS,
    MAX_APPROVALS,
    CallFacts,
    PolicySetError,
    cedar_type,
    cedar_value,
    compile_policies,
    decide,
)
from countersign.core.effects import Effect, OutgoingMessage


def spec(name: str, risk: Risk, parameters: dict[str, Any] | None = None) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=name,
        parameters=parameters or {"type": "object", "properties": {}},
        risk=risk,
        category="write" if risk != "low" else "read",
        tier="needs_approval",
    )


EMAIL = spec(
    "send_email",
    "high",
    {
        "type": "object",
        "properties": {
            "to": {"type": "string"},
            "amount": {"type": "integer"},
            "cc": {"type": "array", "items": {"type": "string"}},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "ratio": {"type": "number"},
            "copies": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
        "required": ["to", "amount", "note", "ratio"],
    },
)
SEARCH = spec("search_leads", "low")
TASK = spec("create_task", "medium")
MCP = spec("mcp__git__git_log", "medium")
TOOLS = [EMAIL, SEARCH, TASK, MCP]
BY_NAME = {t.name: t for t in TOOLS}


def call(
    tool: str = "send_email", user: str = "alice", roles: tuple[str, ...] = ("sales",), **kw: Any
) -> CallFacts:
    arguments = kw.pop("arguments", {"to": "jane@example.com", "amount": 3, "note": None, "ratio": 0.5})
    return CallFacts(
        user=user, roles=roles, agent="sales-assistant", spec=BY_NAME[tool], arguments=arguments, **kw
    )


def action(tool: str) -> str:
    return f'Countersign::Action::"{tool}"'


def rule(effect: str, pid: str, tool: str | None = None, when: str = "", notes: str = "") -> str:
    """One policy: `tool` None is every action; `when` its condition."""
    scope = "action" if tool is None else f"action == {action(tool)}"
    condition = f" when {{ {when} }}" if when else ""
    return f'@id("{pid}") {notes} {effect}(principal, {scope}, resource){condition};\n'


def refused(text: str) -> list[str]:
    with pytest.raises(PolicySetError) as refusal:
        compile_policies(text, TOOLS)
    return refusal.value.problems


# --- apply ----------------------------------------------------------------------------------------


def test_a_schema_error_is_refused_naming_the_policy() -> None:
    (problem,) = refused(rule("forbid", "typo", "send_email", 'context.args.too == "x"'))
    assert problem.startswith("policy 'typo':") and "args.too" in problem


def test_arguments_cedar_cannot_hold_are_not_in_the_schema() -> None:
    for name in ("note", "ratio"):  # nullable, a float
        problems = refused(rule("forbid", "p", "send_email", f'context.args.{name} == "x"'))
        assert len(problems) == 1
    compile_policies(
        rule("forbid", "p", "send_email", 'context.args has cc && context.args.cc.contains("x")'),
        TOOLS,
    )


def test_a_syntax_error_is_refused() -> None:
    assert refused("permit(")[0].startswith("not a Cedar policy set:")


def test_every_policy_needs_a_unique_id() -> None:
    assert "has no @id" in refused(f"forbid(principal, action == {action('search_leads')}, resource);")[0]
    twice = f'@id("a") forbid(principal, action == {action("search_leads")}, resource);\n' * 2
    assert refused(twice) == ["@id('a') is used twice"]


@given(name=st.from_regex(r"[a-z_]{1,12}", fullmatch=True).filter(lambda n: n not in ANNOTATIONS))
@settings(max_examples=25, deadline=None)
def test_an_unknown_annotation_is_refused(name: str) -> None:
    """`@approval("2")` (a typo) would leave a permit that runs calls unasked."""
    text = f'@id("p") @{name}("2") permit(principal, action == {action("search_leads")}, resource);'
    assert refused(text) == [
        f"policy 'p': unknown annotation @{name} (known: allow_high, approvals, approvers, id)"
    ]


@given(raw=st.one_of(st.text(max_size=4), st.integers(-3, 12).map(str)))
@settings(max_examples=80, deadline=None)
def test_approvals_are_parsed_strictly(raw: str) -> None:
    literal = raw.replace("\\", "\\\\").replace('"', '\\"')
    text = f'@id("p") @approvals("{literal}") permit(principal, action == {action("create_task")}, resource);'
    valid = raw.isascii() and raw.isdigit() and not raw.startswith("0") and int(raw) <= MAX_APPROVALS
    try:
        compiled = compile_policies(text, TOOLS)
    except PolicySetError as refusal:
        assert not valid, refusal.problems
        return
    assert valid
    assert compiled.policies["policy0"].approvals == int(raw)


def test_approvals_and_approvers_belong_on_a_permit_with_roles() -> None:
    assert (
        "belongs on a permit"
        in refused(
            f'@id("f") @approvals("2") forbid(principal, action == {action("create_task")}, resource);'
        )[0]
    )
    assert refused(
        f'@id("r") @approvers("admin") permit(principal, action == {action("create_task")}, resource);'
    ) == ["policy 'r': @approvers needs @approvals"]
    assert (
        "must name roles"
        in refused(rule("permit", "r", "create_task", notes='@approvals("2") @approvers("admin,")'))[0]
    )


def test_a_permit_that_runs_a_high_risk_tool_unasked_needs_a_reason() -> None:
    for scope in (
        "action",
        f"action == {action('send_email')}",
        f"action in [{action('send_email')}, {action('search_leads')}]",
    ):
        (problem,) = refused(f'@id("p") permit(principal, {scope}, resource);')
        assert "would run high-risk tools without asking (send_email)" in problem
    assert "@allow_high needs the reason" in refused(rule("permit", "p", notes='@allow_high("")'))[0]
    compile_policies(
        rule("permit", "p", notes='@allow_high("the tenant sends its own newsletter")'),
        TOOLS,
    )
    compile_policies(rule("permit", "p", notes='@approvals("1")'), TOOLS)
    compile_policies(
        f'@id("p") permit(principal, action in [{action("search_leads")}, {action("create_task")}],'
        " resource);",
        TOOLS,
    )


def test_the_set_names_only_the_history_counters_it_reads() -> None:
    text = (
        f'@id("cap") forbid(principal, action == {action("send_email")}, resource)'
        " when { context.history.calls_today_by_requester >= 20 };\n"
        f'@id("burst") forbid(principal, action == {action("create_task")}, resource)'
        " when { context.history has calls_last_hour_by_requester };"
    )
    assert compile_policies(text, TOOLS).counters == {
        "calls_today_by_requester",
        "calls_last_hour_by_requester",
    }
    none = rule("forbid", "p", "create_task", "context.args has x")
    assert compile_policies(none, TOOLS).counters == set()
    assert compile_policies(text, TOOLS).sums == set()


def test_the_set_names_only_the_sums_it_reads_and_only_of_integer_arguments() -> None:
    """A sum is of one integer argument of the tool: another field is refused at apply (the schema's
    records hold only the tool's integer arguments)."""
    text = rule(
        "forbid", "spend", "send_email", "context.history.sum_last_hour_by_requester.amount > 1000"
    ) + rule("forbid", "any", "send_email", "context.history.sum_today_by_tenant has amount")
    compiled = compile_policies(text, TOOLS)
    assert compiled.sums == {("sum_last_hour_by_requester", "amount"), ("sum_today_by_tenant", "amount")}
    assert compiled.counters == set()
    compile_policies(
        rule("forbid", "p", "send_email", "context.history.sum_today_by_tenant.copies > 9"), TOOLS
    )
    for field in ("to", "note", "ratio", "nothing"):  # a string, string-or-null, a float, nothing
        (problem,) = refused(
            rule("forbid", "p", "send_email", f"context.history.sum_today_by_requester.{field} > 1")
        )
        assert "policy 'p'" in problem
    assert refused(rule("forbid", "p", "create_task", "context.history.sum_today_by_requester.amount > 1"))


# --- one call -------------------------------------------------------------------------------------


def test_no_policy_matching_leaves_the_call_to_the_tiers() -> None:
    compiled = compile_policies(
        f'@id("p") forbid(principal, action == {action("create_task")}, resource);', TOOLS
    )
    assert decide(compiled, call()) == PolicyDecision(outcome="no_match")


def test_context_carries_arguments_risk_effect_history_and_roles() -> None:
    text = (
        rule("forbid", "big", "send_email", "context.args.amount > 100")
        + rule(
            "forbid",
            "outside",
            None,
            'context has effect && context.effect.recipients.contains("x@r.example")',
        )
        + rule("forbid", "cap", None, "context.history.calls_today_by_requester >= 20")
        + rule(
            "permit", "two", None, 'context.risk == "high"', '@approvals("2") @approvers("admin,reviewer")'
        )
        + rule("permit", "sales-run", "create_task", 'principal.roles.contains("sales")')
    )
    compiled = compile_policies(text, TOOLS)
    assert decide(compiled, call(arguments={"to": "a", "amount": 101})).policy == "big"
    rival = Effect(summary="s", messages=[OutgoingMessage(channel="email", to=["x@r.example"], body="b")])
    assert decide(compiled, call(effect=rival)) == PolicyDecision(outcome="forbid", policy="outside")
    assert decide(compiled, call(history={"calls_today_by_requester": 20})).policy == "cap"
    assert decide(compiled, call(history={"calls_today_by_requester": 19})) == PolicyDecision(
        outcome="permit_approvals", policy="two", approvals=2, approvers=["admin", "reviewer"]
    )
    assert decide(compiled, call("create_task", arguments={})) == PolicyDecision(
        outcome="permit_run", policy="sales-run"
    )
    assert decide(compiled, call("create_task", roles=("support",), arguments={})).outcome == "no_match"


def test_a_sum_limit_decides_on_the_total_and_an_unnamed_sum_is_zero() -> None:
    compiled = compile_policies(
        rule(
            "forbid",
            "spend",
            "send_email",
            "context.history.sum_today_by_requester.amount + context.args.amount > 100",
        ),
        TOOLS,
    )
    spent = ("sum_today_by_requester", "amount")
    assert decide(compiled, call(sums={spent: 98})).policy == "spend"  # 98 today and this call's 3
    assert decide(compiled, call(sums={spent: 97})).outcome == "no_match"
    assert decide(compiled, call(sums={("sum_today_by_tenant", "amount"): 500})).outcome == "no_match"
    huge = decide(compiled, call(sums={spent: 2**70}))  # held at Long's bound: the addition overflows
    assert (huge.outcome, huge.policy) == ("forbid", "spend")


def test_the_strictest_matching_permit_decides() -> None:
    text = """
    @id("a-run") @allow_high("test") permit(principal, action, resource);
    @id("b-three") @approvals("3") permit(principal, action, resource);
    @id("c-two") @approvals("2") permit(principal, action, resource);
    """
    assert decide(compile_policies(text, TOOLS), call()).policy == "b-three"


def test_a_policy_whose_evaluation_errs_refuses_the_call() -> None:
    """Cedar skips an erring policy; a skipped forbid would let the call through."""
    text = rule("forbid", "overflow", "send_email", "context.args.amount + 9223372036854775807 > 0") + rule(
        "permit", "p", notes='@approvals("1")'
    )
    decision = decide(compile_policies(text, TOOLS), call())
    assert (decision.outcome, decision.policy) == ("forbid", "overflow")
    assert decision.error and "overflow" in decision.error


def test_values_cedar_cannot_hold_are_left_out() -> None:
    assert cedar_value({"a": None, "b": 1.5, "c": 2**63, "d": [1, None, "x"], "e": {"f": True}}) == {
        "d": [1, "x"],
        "e": {"f": True},
    }
    assert cedar_type({"anyOf": [{"type": "string"}, {"type": "null"}]}) is None
    assert cedar_type({"type": "array", "items": {"type": "number"}}) is None


permits = st.lists(
    st.tuples(st.sampled_from([*sorted(BY_NAME), "*"]), st.integers(0, MAX_APPROVALS)), max_size=6
)


@given(permits=permits, tool=st.sampled_from(sorted(BY_NAME)), forbid_all=st.booleans())
@settings(max_examples=60, deadline=None)
def test_a_matching_forbid_always_wins(permits: list[tuple[str, int]], tool: str, forbid_all: bool) -> None:
    lines = []
    for i, (target, approvals) in enumerate(permits):
        scope = "action" if target == "*" else f"action == {action(target)}"
        notes = f'@approvals("{approvals}")' if approvals else '@allow_high("generated")'
        lines.append(f'@id("permit-{i}") {notes} permit(principal, {scope}, resource);')
    scope = "action" if forbid_all else f"action == {action(tool)}"
    lines.append(
        f'@id("zz-forbid") forbid(principal, {scope}, resource)'
        f' when {{ context.risk == "{BY_NAME[tool].risk}" }};'
    )
    args = {"to": "a", "amount": 1} if tool == "send_email" else {}
    decision = decide(compile_policies("\n".join(lines), TOOLS), call(tool, arguments=args))
    assert decision == PolicyDecision(outcome="forbid", policy="zz-forbid")
