"""The edge bounds: every value a client (CLI, Temporal client, inbox API) or the model sends.

One place per kind of input, as reusable annotated pydantic types, used by the start input, the
signal and update payloads, the CLI and the model's replies (see docs/explanation/security.md):

- `Identifier`: user ids, approvers, call ids, tenant and agent names. 1..200 characters, no control
  characters (NUL included): refused, never altered, because an id names someone.
- `Text` / `Reason`: free text (messages, answers, reasons). Made storable (NUL and lone surrogates
  become U+FFFD, which PostgreSQL and payloads can hold) and cut at a size, with a marker saying so.
- Numbers in `Limits`: finite, non-negative, under sensible maxima (`Seconds`, `Count`).
- JSON from outside (edited arguments, the model's arguments, every client payload): `loads_bounded`
  and `BoundedJson` bound depth and size before anything parses it further, and `loads_strict`
  refuses an object that names a key twice (parsers disagree on which one counts: a reviewer shown
  the first `to` would approve the last); `loads_object` is arguments' text as such an object,
  `load_arguments_or_raw` the audit's reading of it; `storable_json` is what any JSON becomes in the database.

Everything here is pure and raises only pydantic `ValidationError`s (or returns a refusal string).
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, StringConstraints

MAX_ID_CHARS = 200
MAX_WORKFLOW_ID_CHARS = 300
MAX_TEXT_CHARS = 32_000  # a user message or an answer: about ten pages
MAX_REASON_CHARS = 2_000
MAX_PROOF_CHARS = 4_096  # an Ed25519 JWT with its claims is under 1 000
MAX_JSON_DEPTH = 32  # tool arguments are a few levels deep at most
MAX_JSON_BYTES = 64_000  # as chat.MAX_ARGUMENTS_CHARS: the largest real arguments are ~20 000
# Timeouts: a day for a turn, a year for waits on people (beyond, timedelta and timers overflow
# long before the server minds; nobody waits a year on an approval).
MAX_TURN_S = 86_400.0
MAX_WAIT_S = 366 * 86_400.0
MAX_COUNT = 10_000  # iterations, tool calls, turns per run
MAX_TOKENS = 100_000_000
# What one payload (a signal, an update, an activity's input or result, a start input) may weigh.
# The Temporal server is configured to refuse anything heavier (`SERVER_LIMITS`: the embedded dev
# server and compose's deploy/dynamicconfig.yaml) before it reaches history: a flood of oversized
# signals is refused at the door, not recorded. Countersign's own payloads stay under it: a signal
# is at most a 32 000-character text, a model reply at most activities/model.py's MAX_REPLY_BYTES.
MAX_PAYLOAD_BYTES = 1_048_576
# Per run: the server suggests continuing as new at this history size and length (the workflow
# honours it while idle and while it waits for people, countersign.core.history.continue_suggested),
# and takes at most MAX_SIGNALS_PER_RUN signals, refusing more at its door (issue 40). Every signal
# adds an event, so a run has been told to continue long before it meets the cap; a burst that
# keeps it from continuing (its workflow tasks force-closed, FORCE_CLOSE_COMMAND) is then refused
# before history instead of growing it to the server's 51 200 events. Bytes are not bounded this
# way: 50 MB of history is about 50 signals of 1 MiB (docs/explanation/security.md, "Floods").
SUGGEST_CONTINUE_BYTES = 4 * 1024 * 1024
SUGGEST_CONTINUE_EVENTS = 4096
MAX_SIGNALS_PER_RUN = 5000
# The Temporal server's dynamic config keys that enforce MAX_PAYLOAD_BYTES (warn at half) and the
# per-run limits above: the embedded dev server and compose's deploy/dynamicconfig.yaml. The blob
# size limit does not cover an update's request: the bound on the requests of a run's updates in
# flight does (one update over MAX_PAYLOAD_BYTES is refused at the door, as a signal is, instead of
# reaching the worker, whose SDK fails the workflow tasks that would answer it; docs/explanation/security.md).
# Countersign's own updates are far lighter: a decision is at most MAX_JSON_BYTES of edited
# arguments and a reason, a turn or reply wait a number or an id.
SERVER_LIMITS: dict[str, int] = {
    "limit.blobSize.error": MAX_PAYLOAD_BYTES,
    "limit.blobSize.warn": MAX_PAYLOAD_BYTES // 2,
    "history.maxInFlightUpdatePayloads": MAX_PAYLOAD_BYTES,
    "limit.historySize.suggestContinueAsNew": SUGGEST_CONTINUE_BYTES,
    "limit.historyCount.suggestContinueAsNew": SUGGEST_CONTINUE_EVENTS,
    "history.maximumSignalsPerExecution": MAX_SIGNALS_PER_RUN,
}


# NUL (PostgreSQL text cannot hold it) and lone surrogates (UTF-8 cannot encode them).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """`text` with what PostgreSQL text and JSON payloads cannot hold (NUL, lone surrogates)
    replaced by U+FFFD."""
    return UNSTORABLE.sub("\ufffd", text)


def storable_json(value: Any) -> Any:
    """`value` as JSON that PostgreSQL's jsonb accepts, whoever produced it (the model's arguments, an
    MCP server's result, an approver's edit): strings and keys made `storable`, and the NaN and
    infinities Python's JSON parser reads written as the strings "NaN", "Infinity", "-Infinity"
    (JSON has no such numbers, and jsonb refuses them)."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # NaN, Infinity, -Infinity
    if isinstance(value, dict):
        return {
            storable_json(k) if isinstance(k, str | float) else k: storable_json(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [storable_json(v) for v in value]
    return value


def encodable(value: Any) -> Any:
    """`value` (a pydantic model, JSON-like data, ...) with every lone surrogate in a string or key
    replaced by U+FFFD: what UTF-8, and so every Temporal payload and protobuf string, can carry.
    A model becomes its `model_dump()`. NUL and NaN stay (a JSON payload holds them)."""
    if isinstance(value, BaseModel):
        return encodable(value.model_dump())
    if isinstance(value, str):
        return SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(v) for v in value]
    return value


def unstorable_refusal(value: Any) -> str | None:
    """Why a decoded JSON value from outside may not be used, or None: a NUL (PostgreSQL cannot
    hold it) or a lone surrogate (no UTF-8 text can: not the MCP server's request, not a payload)
    in any string or key. Refused, not replaced: arguments name things, and a changed name is
    another thing. Iterative, like `json_depth_refusal`."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return "may not contain NUL characters (U+0000)"
            if SURROGATE.search(node):
                return "may not contain lone surrogates (U+D800-U+DFFF), which no UTF-8 text can hold"
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


# In JSON text with ASCII escapes: a NUL or a surrogate (a pair too: the slow path keeps it as is).
UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def dumps_storable(value: Any) -> str:
    """The JSON text of `storable_json(value)`: what the engine writes into every JSON column.

    Most values need no change: plain `json.dumps` says so (no NaN, no escape of a NUL or a
    surrogate) at a fifth of the cost of walking the value."""
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError:  # NaN or an infinity
        return json.dumps(storable_json(value), allow_nan=False)
    return json.dumps(storable_json(value), allow_nan=False) if UNSTORABLE_ESCAPE.search(text) else text


def cut(text: str, limit: int) -> str:
    """`text`, or its start and a marker saying how much was cut, `limit` characters in all (so
    cutting again changes nothing: the client and the worker both apply the bound)."""
    if len(text) <= limit:
        return text
    marker = f"…[cut: {{}} of {len(text)} characters, over the {limit}-character limit]"
    kept = max(0, limit - len(marker) - 10)
    return text[:kept] + marker.format(len(text) - kept)


def has_control(value: str) -> bool:
    """Whether `value` holds a control character (NUL, newlines, ...) or a lone surrogate: what a
    name of someone (an id, a claim) may not carry."""
    return any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in value)


def _no_control(value: str) -> str:
    if has_control(value):
        raise ValueError("may not contain control characters (NUL, newlines, ...) or lone surrogates")
    return value


def _text(limit: int) -> AfterValidator:
    return AfterValidator(lambda v: cut(storable(v), limit))


Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS), AfterValidator(_no_control)
]
# A conversation's workflow id as a client names it (a batch decision's item): a key's, with a prefix.
WorkflowId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_WORKFLOW_ID_CHARS), AfterValidator(_no_control)
]
# A proof (APPROVER_AUTH=signed) is a compact JWT: refused, never cut, when it is not one.
Proof = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_PROOF_CHARS), AfterValidator(_no_control)
]
Text = Annotated[str, _text(MAX_TEXT_CHARS)]
Reason = Annotated[str, _text(MAX_REASON_CHARS)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PositiveCount = Annotated[int, Field(ge=1, le=MAX_COUNT)]  # model calls or turns: 0 would do nothing
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
# At least a second: a timer or activity timeout that rounds to zero is an error in workflow code.
TurnSeconds = Annotated[float, Field(ge=1, le=MAX_TURN_S, allow_inf_nan=False)]
WaitSeconds = Annotated[float, Field(ge=1, le=MAX_WAIT_S, allow_inf_nan=False)]


def json_depth_refusal(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Why a decoded JSON value nests too deep, or None. Iterative: no recursion to exhaust."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return f"nested deeper than {limit} levels"
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return None


def json_text_refusal(
    text: str, limit_bytes: int = MAX_JSON_BYTES, depth: int = MAX_JSON_DEPTH
) -> str | None:
    """Why JSON text from outside may not be parsed further, or None: too large, or nested too deep
    (counted on the text, before any parser recurses into it)."""
    size = len(text.encode("utf-8", "replace"))
    if size > limit_bytes:
        return f"{size} bytes, more than the {limit_bytes}-byte limit"
    level = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            level += 1
            deepest = max(deepest, level)
        elif c in "]}":
            level -= 1
    return f"nested deeper than {depth} levels" if deepest > depth else None


class DuplicateKey(ValueError):
    """A JSON object names the same key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(f"the key {storable(key)[:100]!r} appears more than once in one object")
            seen.add(key)
    return value


def loads_strict(text: str | bytes) -> Any:
    """`json.loads`, refusing an object with a key twice (`DuplicateKey`, a `ValueError`): the one
    parse of JSON from outside, so what a person is shown and what runs are the same value."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def loads_bounded(text: str) -> tuple[Any, str | None]:
    """(value, None) for bounded, valid JSON text with no key twice in an object, else (None, why
    not). Never raises."""
    refusal = json_text_refusal(text)
    if refusal is not None:
        return None, refusal
    try:
        return loads_strict(text), None
    except DuplicateKey as exc:
        return None, str(exc)
    except (ValueError, RecursionError) as exc:
        return None, f"not valid JSON ({exc})"


def loads_object(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """(object, None) for arguments' JSON text that is a bounded object the database can store (the
    empty text is `{}`), else (None, why not: "refused: …", "must be a JSON object", or what in it
    cannot be stored). Never raises."""
    value, refusal = loads_bounded(text or "{}")
    if refusal is not None:
        return None, f"refused: {refusal}"
    if not isinstance(value, dict):
        return None, "must be a JSON object"
    unstorable = unstorable_refusal(value)
    if unstorable is not None:
        return None, unstorable
    return value, None


def load_arguments_or_raw(text: str) -> dict[str, Any]:
    """Arguments' JSON text as an object for the audit, even when it is none: then `{"_raw": …}`,
    its first 2 000 characters (what the audit keeps of a call whose arguments were refused)."""
    value, _ = loads_object(text)
    return value if value is not None else {"_raw": text[:2000]}


class Unreadable(BaseModel):
    """A payload that did not decode as its handler's type (wrong types, a bound broken, not JSON).

    Handlers declare `Model | Unreadable`: the worker's payload converter (countersign.runtime.payloads)
    hands them this instead of dropping the signal, so the refusal is recorded, and a start input
    that cannot be read fails its workflow once with `unreadable` as the reason. `unreadable` is a
    field no real payload has, so a plain pydantic converter still decodes the real model.
    """

    unreadable: str  # why it was refused
    excerpt: str = ""  # the start of the payload, for the audit


def _bounded_json(value: dict[str, object]) -> dict[str, object]:
    refusal = json_depth_refusal(value)
    if refusal is None:
        encoded = json.dumps(value, default=str)
        size = len(encoded.encode("utf-8", "replace"))
        if size > MAX_JSON_BYTES:
            refusal = f"{size} bytes, more than the {MAX_JSON_BYTES}-byte limit"
        else:  # NUL: the audit row would fail; a lone surrogate: no server or payload can carry it
            refusal = unstorable_refusal(value)
    if refusal is not None:
        raise ValueError(refusal)
    return value


# A JSON object from a client (an approver's edited arguments): depth and size bounded.
BoundedJson = Annotated[dict[str, object], AfterValidator(_bounded_json)]
