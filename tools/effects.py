"""Previews: every tool says what a call would do before anyone decides on it.

A preview is an async `(ctx, args) -> Effect` declared with the tool (`@tool(..., preview=...)`). It
resolves the call's arguments against the tenant's data the way the tool itself will (the same
resolvers), and changes nothing: the records it would touch with each field's before and after, the
messages it would send exactly as they would leave, what it would create. Reads declare
`reads_only`.

`preview_effect` is the one way to run a preview: in the approval request's activity (what the
reviewer sees and the proof binds) and again inside the transaction that makes the change, with
`ctx.lock_reads` set so what it read cannot change before the tool writes.
"""

from __future__ import annotations

from typing import Any

from pydantic import JsonValue

from countersign.core.effects import Effect, FieldChange, RecordChange, change_line, one_line
from tools.registry import Tool, ToolArgs, ToolContext, ToolFailure
from tools.resolve import NeedsInput, as_json


async def preview_effect(tool: Tool, ctx: ToolContext, args: ToolArgs) -> Effect:
    """What `tool` would do with `args` now. A failure the tool would meet (no such record, a name
    matching two people) is part of the effect (`problem`), not an error: the reviewer sees it."""
    try:
        return await tool.preview(ctx, args)
    except ToolFailure as failure:
        problem = f"{failure.code}: {failure.message}"
    except NeedsInput as stop:
        problem = f"needs {', '.join(sorted(stop.needs.fields))}: more than one match, or none"
    return Effect(summary=one_line(f"{tool.name} would fail now: {problem}"), problem=problem)


async def reads_only(ctx: ToolContext, args: ToolArgs) -> Effect:
    """The preview of a tool that only reads."""
    return Effect(summary="Changes nothing: reads only")


def field_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, FieldChange]:
    """The fields of `after` whose value differs from `before`'s, as JSON values, in `after`'s order."""
    changes: dict[str, FieldChange] = {}
    for name, value in after.items():
        old, new = as_json(before.get(name)), as_json(value)
        if old != new:
            changes[name] = FieldChange(before=old, after=new)
    return changes


def record_change(
    kind: str, record_id: Any, label: str, before: dict[str, Any], after: dict[str, Any]
) -> Effect:
    """The effect of changing one record's fields: "Jane Doe (jane@…): status new → qualified", or
    "…: no change" when every field already has its value."""
    fields = field_changes(before, after)
    if not fields:
        return Effect(summary=one_line(f"{label}: no change"))
    change = RecordChange(kind=kind, id=str(record_id), label=label, fields=fields)
    return Effect(summary=one_line(f"{label}: {change_line(fields)}"), changes=[change])


def json_fields(values: dict[str, Any]) -> dict[str, JsonValue]:
    """Values as JSON, nothing left out: what a creation will hold."""
    return {name: as_json(value) for name, value in values.items()}
