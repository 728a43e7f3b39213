"""What an MCP client is told of a tool (`tools/list`): the hints follow risk and category."""

from __future__ import annotations

from countersign.core.calls import Category, Risk, ToolSpec
from countersign.server.mcp_face import hints, listed


def spec(risk: Risk, category: Category, compensable: bool = False) -> ToolSpec:
    return ToolSpec(
        name="t",
        description="as the model sees it",
        parameters={"type": "object", "properties": {"x": {"type": "string"}}},
        risk=risk,
        category=category,
        tier="always_allow",
        compensable=compensable,
    )


def test_a_read_is_read_only_and_idempotent_and_never_destructive() -> None:
    shown = hints(spec("low", "read"))
    assert (shown.read_only_hint, shown.idempotent_hint, shown.destructive_hint) == (True, True, False)


def test_a_write_is_destructive_when_high_risk_or_it_cannot_be_undone() -> None:
    assert hints(spec("high", "write", compensable=True)).destructive_hint
    assert hints(spec("medium", "external")).destructive_hint  # an email cannot be unsent
    undoable = hints(spec("medium", "write", compensable=True))
    assert (undoable.destructive_hint, undoable.read_only_hint, undoable.idempotent_hint) == (
        False,
        False,
        False,
    )


def test_a_listed_tool_carries_the_models_description_and_schema() -> None:
    tool = listed(spec("low", "read"))
    assert tool.description == "as the model sees it"
    assert tool.input_schema["properties"] == {"x": {"type": "string"}}
