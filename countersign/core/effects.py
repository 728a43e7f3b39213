"""What a call will do, resolved: the thing a reviewer decides (shared/CONTRACT.md, "What a reviewer
decides: the effect, not the model's text").

The model writes arguments ("lead": "jane.doe@example.com", "draft": 1); what they mean is only known
once they are resolved against the tenant's data: whose lead, what its status is now, which
recipients and body draft 1 has at this moment. A tool's preview (tools/effects.py) resolves them,
read-only, into an `Effect`; the approval request records it with its `digest`, the reviewer's proof
binds the digest, and the call runs only while a fresh resolution still has the same digest.

Pure: no I/O, safe in workflow code.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

# Longest summary line kept: a summary is one line on a card, not a second body.
SUMMARY_CHARS = 300


class FieldChange(BaseModel):
    """One field of a record: its value now and the value the call will leave (JSON values)."""

    model_config = ConfigDict(frozen=True)

    before: JsonValue
    after: JsonValue


class RecordChange(BaseModel):
    """A record the call changes (or deletes: `deleted`), named so a person recognises it."""

    model_config = ConfigDict(frozen=True)

    kind: str  # "lead", "task", "draft", a collection's name…
    id: str  # the record's id in its table, as text
    label: str  # "Jane Doe (jane.doe@example.com)"
    fields: dict[str, FieldChange] = {}
    deleted: bool = False


class OutgoingMessage(BaseModel):
    """Something that leaves Countersign, exactly as it will be sent."""

    model_config = ConfigDict(frozen=True)

    channel: str  # "email", "slack", "telegram", "calendar invitation"…
    to: list[str]
    subject: str | None = None
    body: str
    html: str | None = None  # an email's HTML version, as sanitized for sending


class Creation(BaseModel):
    """A record the call creates, with the values it will have."""

    model_config = ConfigDict(frozen=True)

    kind: str
    label: str
    fields: dict[str, JsonValue] = {}


class Effect(BaseModel):
    """What a call will change, send and create, resolved against the tenant's data.

    `resolved` is False when nothing could be resolved on Countersign's side (an MCP tool's effect is
    its arguments). `problem` says what would stop the call if it ran now (no such lead, a name that
    matches two people): the reviewer decides on that too, and a later resolution that no longer
    fails is a different effect.
    """

    model_config = ConfigDict(frozen=True)

    summary: str = Field(max_length=SUMMARY_CHARS)
    changes: list[RecordChange] = []
    messages: list[OutgoingMessage] = []
    creates: list[Creation] = []
    resolved: bool = True
    problem: str | None = None
    # an MCP tool's arguments (resolved False): what is known of its effect
    arguments: dict[str, JsonValue] | None = None

    @property
    def changes_nothing(self) -> bool:
        return not (self.changes or self.messages or self.creates) and self.resolved

    def canonical(self) -> str:
        """The effect as canonical JSON: sorted keys, no spaces, UTF-8 text kept as is."""
        return canonical_json(self.model_dump(mode="json"))

    @property
    def digest(self) -> str:
        """sha256 (hex) of the canonical JSON: what a reviewer's proof binds."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def one_line(text: str, limit: int = SUMMARY_CHARS) -> str:
    """`text` as one summary line: whitespace runs (newlines included) become one space, cut to `limit`."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def shown(value: JsonValue) -> str:
    """A field value as a card shows it: text as is, nothing as "(none)", the rest as JSON."""
    if value is None or value == "":
        return "(none)"
    return value if isinstance(value, str) else canonical_json(value)


def change_line(fields: dict[str, FieldChange]) -> str:
    """ "status new → qualified, owner (none) → bob" for a summary."""
    return ", ".join(f"{name} {shown(c.before)} → {shown(c.after)}" for name, c in fields.items())


def arguments_effect(tool: str, arguments: dict[str, JsonValue]) -> Effect:
    """The effect of a call nothing on Countersign's side can resolve (an MCP tool's): its arguments,
    marked not resolved."""
    return Effect(
        summary=one_line(
            f"{tool} with the arguments below (not resolved: the server decides what they mean)"
        ),
        resolved=False,
        arguments=arguments,
    )
