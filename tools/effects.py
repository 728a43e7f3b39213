"""Plans every tool shares, and the effects they are derived from.

A write tool's `plan(ctx, args)` (tools/registry.py `Plan`) resolves the call once, changing nothing;
its `effect()` says what the call will do: the records it touches with each field's before and
after, the messages it sends exactly as they will leave, what it creates. Most writes are one of two
shapes, declared here: `RowUpdate` (one row's columns set to new values) and `RowCreation` (one row
inserted with these values). A tool with another shape declares its own `Plan` subclass beside it.

A plan is made in the approval request's activity (what the reviewer sees and the proof binds), by
the policy gate (what policies judge) and in the transaction that makes the change, with
`ctx.lock_reads` set, where the tool's body applies that same plan (activities/tools.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import JsonValue
from sqlalchemy import inspect as row_state

from countersign.core.effects import Creation, Effect, FieldChange, RecordChange, change_line, one_line
from countersign.db.schema import Base
from tools.registry import Plan
from tools.resolve import apply_changes, as_json

M = TypeVar("M", bound=Base)


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


def creation(kind: str, label: str, values: dict[str, Any]) -> Effect:
    """The effect of creating one row with these column values."""
    created = Creation(kind=kind, label=label, fields=json_fields(values))
    return Effect(summary=one_line(f"Creates {label}"), creates=[created])


@dataclass(kw_only=True)
class RowUpdate(Plan, Generic[M]):
    """Set `wanted` columns of one row, read (and locked, when it runs) by the plan: `before` is
    what the plan read of those columns, the values the change starts from. `ref` is the argument
    that named the row (its title or id): the plan's arguments name it by its id."""

    kind: str
    row: M
    label: str
    wanted: dict[str, Any]
    ref: str | None = None
    before: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.before = {name: getattr(self.row, name) for name in self.wanted}
        if self.ref is not None:
            self.named = {**self.named, self.ref: str(self.row_id)}

    @property
    def row_id(self) -> Any:
        identity = row_state(self.row).identity  # (id,): the row was read, so it has one
        return identity[0] if identity else None

    def effect(self) -> Effect:
        return record_change(self.kind, self.row_id, self.label, self.before, self.wanted)

    def write(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Set the planned values on the row: (previous, changed) as JSON, as `apply_changes`."""
        return apply_changes(self.row, self.wanted)


@dataclass(kw_only=True)
class RowCreation(Plan):
    """Insert one row with `values` (references already resolved to their columns)."""

    kind: str
    label: str
    values: dict[str, Any]

    def effect(self) -> Effect:
        return creation(self.kind, self.label, self.values)
