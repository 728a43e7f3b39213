"""What a call will do, resolved: the thing a reviewer decides (shared/CONTRACT.md, "What a reviewer
decides: the effect, not the model's text").

The model writes arguments ("lead": "jane.doe@example.com", "draft": 1); what they mean is only known
once they are resolved against the tenant's data: whose lead, what its status is now, which
recipients and body draft 1 has at this moment. A tool's plan (tools/registry.py `Plan`) resolves
them, read-only, and its `effect()` is an `Effect`; the approval request records it with its
`digest`, the reviewer's proof binds the digest, and the call runs only while its plan, made where
it is applied, still has the same digest.

Pure: no I/O, safe in workflow code.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from countersign.core.html_text import readable
from countersign.core.shown import Folded, capped, folded, string_warnings, visible

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


class Attachment(BaseModel):
    """A file a message carries: shown by name and size; its content bound by `sha256`."""

    model_config = ConfigDict(frozen=True)

    name: str
    size: int = Field(ge=0)  # bytes
    content_type: str = "application/octet-stream"
    sha256: str  # hex digest of the content: a proof binds the bytes, not only the name


class OutgoingMessage(BaseModel):
    """Something that leaves Countersign, exactly as it will be sent: every part of it."""

    model_config = ConfigDict(frozen=True)

    channel: str  # "email", "slack", "telegram", "calendar invitation"…
    to: list[str]
    subject: str | None = None
    body: str
    html: str | None = None  # an email's HTML version, as sanitized for sending (its source)
    # Left out of the JSON while empty, so a message without attachments (every one recorded
    # before they existed) keeps its canonical form and digest.
    attachments: list[Attachment] = Field(default_factory=list, exclude_if=lambda found: not found)


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


# --- how an effect is shown (inbox card, chat page, notices, CLI) -----------------------------------


def _text_lines(text: str, indent: str) -> list[str]:
    """A multi-line text (a body) as lines, each with hidden characters made visible."""
    return [visible(f"{indent}{line}") for line in text.split("\n")]


def named(kind: str, label: str) -> str:
    """A record as a line names it: "lead Jane Doe (…)", "task 5 “Call Jane”" (a label may name its
    kind already)."""
    return label if label.startswith(f"{kind} ") else f"{kind} {label}"


def message_lines(message: OutgoingMessage) -> list[str]:
    """A message as it will leave: recipients, subject, the text, the HTML as its reader sees it
    (countersign.core.html_text: links with their targets, hidden text shown and marked) and each
    attachment by name and size."""
    lines = [visible(f"  sends {message.channel} to {', '.join(message.to)}")]
    if message.subject is not None:
        lines.append(visible(f"    subject: {message.subject}"))
    lines.append("    body:")
    lines.extend(_text_lines(message.body, "      "))
    if message.html is not None:
        lines.append("    HTML version, as its reader sees it (links with [their targets], [hidden: text]):")
        lines.extend(_text_lines(readable(message.html).text, "      "))
    for attached in message.attachments:
        lines.append(
            visible(f"    attaches {attached.name} ({attached.size:,} bytes, {attached.content_type})")
        )
    return lines


def effect_text(effect: Effect) -> list[str]:
    """The effect as a person reads it, whole: the summary, then each change (field: before →
    after), each message as it will be sent (`message_lines`) and each creation. Hidden characters
    are made visible (countersign.core.shown), as in the arguments' lines. Shown folded
    (`effect_shown`, `effect_lines`)."""
    lines = [visible(effect.summary)]
    if effect.problem is not None:
        lines.append(visible(f"  would fail: {effect.problem}"))
    if not effect.resolved:
        lines.append("  not resolved: this is what the call was asked to do, not what it will change")
    for change in effect.changes:
        lines.append(
            visible(f"  {'deletes' if change.deleted else 'changes'} {named(change.kind, change.label)}")
        )
        lines.extend(
            visible(f"    {name}: {shown(c.before)} → {shown(c.after)}") for name, c in change.fields.items()
        )
    for message in effect.messages:
        lines.extend(message_lines(message))
    for created in effect.creates:
        lines.append(visible(f"  creates {named(created.kind, created.label)}"))
        for name, value in created.fields.items():
            if isinstance(value, str) and "\n" in value:
                lines.append(f"    {visible(name)}:")
                lines.extend(_text_lines(value, "      "))
            else:
                lines.append(visible(f"    {name}: {shown(value)}"))
    return lines


def effect_shown(effect: Effect) -> Folded:
    """The effect's lines as a card shows them: each long one folded with its mark, the rests beside
    (countersign.core.shown: nothing is cut silently)."""
    return folded(effect_text(effect))


def effect_lines(effect: Effect) -> list[str]:
    """The effect's lines as shown (`effect_shown(effect).lines`)."""
    return effect_shown(effect).lines


def effect_warnings(effect: Effect) -> list[str]:
    """What in the effect could deceive its reader: look-alike addresses, hidden characters."""
    found: list[str] = []
    for message in effect.messages:
        for address in message.to:
            found.extend(string_warnings(f"effect: {message.channel} to", address))
        if message.subject is not None:
            found.extend(string_warnings(f"effect: {message.channel} subject", message.subject))
        found.extend(string_warnings(f"effect: {message.channel} body", message.body))
        if message.html is not None:
            html = readable(message.html)
            if html.hides:
                found.append(
                    f"effect: {message.channel} HTML hides text from its reader (shown as [hidden: …])"
                )
            found.extend(string_warnings(f"effect: {message.channel} HTML", html.text))
        for attached in message.attachments:
            found.extend(string_warnings(f"effect: {message.channel} attachment", attached.name))
    for change in effect.changes:
        for name, c in change.fields.items():
            if isinstance(c.after, str):
                found.extend(string_warnings(f"effect: {change.kind} {name}", c.after))
    return capped(found)
