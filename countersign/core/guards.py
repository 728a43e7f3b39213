"""Pure guards applied to every tool result before it reaches the model, workflow history or the audit.

Redaction first (a secret must not survive truncation boundaries), then truncation of rows and
characters. Both are plain functions so unit tests call them without a server.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

from countersign.core.bounds import storable

REDACTED = "[REDACTED]"
# Keys whose values are secrets wherever they appear, matched as whole words of the key.
SECRET_KEY = re.compile(
    r"(^|[_\-.])(password|passwd|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key|private[_\-]?key|"
    r"authorization|auth|credential|credentials|session[_\-]?id|cookie)($|[_\-.])",
    re.IGNORECASE,
)
# Secrets that show up inside free text (notes, email bodies).
SECRET_TEXT = [
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}\b"),  # OpenAI-style keys
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),  # AWS access key ids
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),  # GitHub tokens
    re.compile(r"\bBearer\s+[A-Za-z0-9._\-]{16,}", re.IGNORECASE),
    re.compile(r"(?i)\b(password|passwd|api[_ ]?key|secret|token)\s*[:=]\s*\S+"),
]


MAX_ROWS = 50  # items kept in any list; tools that return rows may not be asked for more
MAX_CHARS = 8_000  # characters of a serialized result


class TruncationLimits(BaseModel):
    max_rows: int = MAX_ROWS
    max_chars: int = MAX_CHARS
    max_string: int = 2_000  # characters of any single string value


def redact(value: Any) -> Any:
    """A copy of `value` with secret-named keys and secret-looking text replaced by REDACTED
    (and every string made storable)."""
    if isinstance(value, dict):
        return {
            storable(str(k)): (REDACTED if SECRET_KEY.search(str(k)) else redact(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        value = storable(value)
        for pattern in SECRET_TEXT:
            value = pattern.sub(REDACTED, value)
        return value
    return value


def _trim(value: Any, limits: TruncationLimits) -> Any:
    if isinstance(value, dict):
        return {k: _trim(v, limits) for k, v in value.items()}
    if isinstance(value, list):
        kept = [_trim(v, limits) for v in value[: limits.max_rows]]
        if len(value) > limits.max_rows:
            kept.append(f"[truncated: {len(value) - limits.max_rows} more of {len(value)} rows]")
        return kept
    if isinstance(value, str) and len(value) > limits.max_string:
        return value[: limits.max_string] + f"…[truncated {len(value) - limits.max_string} chars]"
    return value


def truncate(value: Any, limits: TruncationLimits | None = None) -> Any:
    """Bound a JSON-able value by rows, string length and total serialized size.

    When the whole still exceeds `max_chars`, the result is replaced by a marker holding a prefix of
    its JSON, so the model learns it was cut rather than receiving silently partial data.
    """
    limits = limits or TruncationLimits()
    trimmed = _trim(value, limits)
    text = json.dumps(trimmed, default=str)
    if len(text) <= limits.max_chars:
        return trimmed
    return {"truncated": True, "total_chars": len(text), "preview": text[: limits.max_chars]}


def sanitize(value: Any, limits: TruncationLimits | None = None) -> Any:
    """Redact, then truncate: what every tool result goes through."""
    return truncate(redact(value), limits)
