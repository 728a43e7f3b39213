"""Text a person reads: a tool result as one short line instead of the JSON the model reads, and
counts with their plural (`1 tool call`).

`transcript`, `demo`, `chat` and `start --wait` print these; `--json` keeps the full results.
The summary is generic (no per-tool code): an error's code and message, what a `needs` asks for,
and for data the lists it holds (how many, and the first items by their most telling field) or
the record it is (the same fields). Scheduling slots are listed whole: the agent's reply points at
them ("say book the 10:00 slot").
"""

from __future__ import annotations

import json
from typing import Any

WIDTH = 160  # characters of one summary line before it is cut with …
SHOWN_ITEMS = 5  # items of a list named before "+N more"
# Fields that name a record, most telling first; `user_local` is a scheduling slot in the user's zone.
LABELS = ("user_local", "name", "title", "email", "subject", "message", "id")
DETAILS = ("email", "status", "state", "company", "due_date", "kind")


def counted(n: int, noun: str) -> str:
    """`1 tool call`, `2 tool calls`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def usage_line(model_calls: int, tool_calls: int, tokens: int) -> str:
    """`2 model calls, 1 tool call, 531 tokens`."""
    calls = f"{counted(model_calls, 'model call')}, {counted(tool_calls, 'tool call')}"
    return f"{calls}, {counted(tokens, 'token')}"


def summarize_result(content: str) -> str:
    """One line for a tool message's content (the envelope `{"ok": …}`); other text is cut."""
    try:
        value = json.loads(content)
    except json.JSONDecodeError:
        return _cut(content)
    if not isinstance(value, dict) or "ok" not in value:
        return _cut(content)
    if value.get("error"):
        error = value["error"] if isinstance(value["error"], dict) else {"message": value["error"]}
        return _cut(f"error {error.get('code', '')}: {error.get('message', '')}".replace(" :", ":"))
    if value.get("needs") is not None:
        asked = ", ".join(value["needs"]) if isinstance(value["needs"], dict) else str(value["needs"])
        candidates = value.get("candidates") or []
        which = f": {_items(candidates)}" if isinstance(candidates, list) and candidates else ""
        return _cut(f"needs {asked}{which}")
    data = value.get("data")
    note = _approver_note(data)
    if isinstance(data, dict) and note is not None:  # ran as a reviewer edited it: what, and why
        result = _cut("ok: " + _data(data.get("result")))
        return f"{result} · {' '.join(note.split())}"
    return _cut(f"ok: {_data(data)}")


def _approver_note(data: Any) -> str | None:
    """The note of a result whose call ran with a reviewer's edit (core.calls.result_for_model):
    `bob changed new_status from "qualified" to "contacted" before approving (reason: …)`."""
    edit = data.get("approver_edit") if isinstance(data, dict) else None
    note = edit.get("note") if isinstance(edit, dict) else None
    return note if isinstance(note, str) else None


def _data(data: Any) -> str:
    if isinstance(data, list):
        return _items(data)
    if not isinstance(data, dict):
        return json.dumps(data, default=str)
    lists = {k: v for k, v in data.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
    if lists:
        key, items = max(lists.items(), key=lambda kv: len(kv[1]))
        return f"{len(items)} {key}: {_items(items)}"
    nested = [v for v in data.values() if isinstance(v, dict)]
    if not _label(data) and nested:  # `{"lead": {…}, "changed": true}`: the record it is about
        return _data(nested[0]) + _flags(data)
    if _label(data):
        return _describe(data) + _flags(data)
    if isinstance(data.get("text"), str):  # an MCP server's text content
        return str(data["text"])
    return ", ".join(f"{k} {v}" for k, v in data.items() if not isinstance(v, dict | list)) or "{}"


def _items(items: list[Any]) -> str:
    named = [_describe(i) if isinstance(i, dict) else str(i) for i in items[:SHOWN_ITEMS]]
    more = f", +{len(items) - SHOWN_ITEMS} more" if len(items) > SHOWN_ITEMS else ""
    return "; ".join(named) + more


def _label(record: dict[str, Any]) -> str | None:
    return next((str(record[k]) for k in LABELS if record.get(k) not in (None, "")), None)


def _describe(record: dict[str, Any]) -> str:
    found = record.get("record")
    if isinstance(found, dict):  # a search hit: the record it found, in its collection (`7 hits: 3; 1`)
        return (f"{record['collection']}: " if record.get("collection") else "") + _describe(found)
    label = _label(record) or json.dumps(record, default=str)
    details = [str(record[k]) for k in DETAILS if record.get(k) not in (None, "") and str(record[k]) != label]
    index = f"{record['index']}. " if isinstance(record.get("index"), int) else ""
    return f"{index}{label}" + (f" ({', '.join(details)})" if details else "")


def _flags(data: dict[str, Any]) -> str:
    """What a write's answer says it changed: `, was new`."""
    before = data.get("previous_status")
    return f", was {before}" if before not in (None, "") and before != data.get("new_status") else ""


def _cut(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"
