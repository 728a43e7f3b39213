"""What a policy reads of a call's plan (countersign.core.cedar_policy `effect_context`), without a
server: each record the plan changes (`targets`) and each field it sets with its new value as text
(`fields`), so one rule on the effect covers every tool that has it (issue 48, item 6)."""

from __future__ import annotations

from typing import Any

from countersign.core.calls import ToolSpec
from countersign.core.cedar_policy import CallFacts, compile_policies, decide, effect_context, field_text
from countersign.core.effects import Creation, Effect, FieldChange, RecordChange

CONVERTED = """@id("never-converted") forbid(principal, action, resource) when {
  context has effect && context.effect has fields &&
  context.effect.fields.contains({kind: "lead", field: "status", value: "converted"})
};
@id("not-lead-7") forbid(principal, action, resource) when {
  context has effect && context.effect has targets && context.effect.targets.contains({kind: "lead", id: "7"})
};"""


def spec(name: str) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=name,
        parameters={"type": "object", "properties": {}},
        risk="medium",
        category="write",
        tier="needs_approval",
    )


TOOLS = [spec("update_lead_status"), spec("write_record"), spec("create_task")]


def status_change(record: str, status: Any) -> Effect:
    change = RecordChange(
        kind="lead",
        id=record,
        label=f"lead {record}",
        fields={"status": FieldChange(before="new", after=status)},
    )
    return Effect(summary="s", changes=[change])


def decided(tool: str, effect: Effect | None) -> str:
    call = CallFacts(user="alice", roles=("sales",), agent="a", spec=spec(tool), arguments={}, effect=effect)
    decision = decide(compile_policies(CONVERTED, TOOLS), call)
    return decision.policy if decision.outcome == "forbid" and decision.policy else decision.outcome


def test_the_context_names_each_target_and_each_field_with_its_new_value_as_text() -> None:
    created = Creation(kind="task", label="t", fields={"title": "Call", "due": None, "tags": ["a"], "n": 3})
    effect = status_change("12", "converted").model_copy(update={"creates": [created]})
    context = effect_context(effect)
    assert context["targets"] == [{"kind": "lead", "id": "12"}]
    assert context["fields"] == [
        {"kind": "lead", "field": "status", "value": "converted"},
        {"kind": "task", "field": "title", "value": "Call"},
        {"kind": "task", "field": "due", "value": ""},
        {"kind": "task", "field": "tags", "value": '["a"]'},
        {"kind": "task", "field": "n", "value": "3"},
    ]
    assert (field_text(True), field_text({"b": 1, "a": 2})) == ("true", '{"a":2,"b":1}')


def test_one_rule_on_the_effect_covers_every_tool_with_that_effect() -> None:
    for tool in ("update_lead_status", "write_record"):
        assert decided(tool, status_change("12", "converted")) == "never-converted"
        assert decided(tool, status_change("12", "qualified")) == "no_match"
        assert decided(tool, status_change("7", "qualified")) == "not-lead-7"
    created = Effect(summary="s", creates=[Creation(kind="lead", label="l", fields={"status": "converted"})])
    assert decided("create_task", created) == "never-converted"  # a lead created converted is one too
    assert decided("update_lead_status", None) == "no_match"  # no plan, no effect: the rule reads none
