"""countersign/core/guards.py on its own: truncation at 50 rows and 8,000 characters, every redaction rule,
and that no tool returning rows can be asked for more than the guard lets through."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from pydantic import ValidationError

from countersign.core.bounds import storable
from countersign.core.guards import (
    MAX_CHARS,
    MAX_ROWS,
    REDACTED,
    TruncationLimits,
    redact,
    sanitize,
    truncate,
)
from tools.arguments import parse_arguments
from tools.registry import REGISTRY

# --- truncation ------------------------------------------------------------------------------------


def test_the_limits_are_fifty_rows_and_eight_thousand_characters() -> None:
    assert (MAX_ROWS, MAX_CHARS) == (50, 8_000)
    assert TruncationLimits() == TruncationLimits(max_rows=50, max_chars=8_000, max_string=2_000)


def test_fifty_rows_pass_and_the_fifty_first_is_cut_with_a_marker() -> None:
    rows = [{"id": i} for i in range(MAX_ROWS)]
    assert truncate(rows) == rows
    cut = truncate([*rows, {"id": 50}, {"id": 51}])
    assert cut[:MAX_ROWS] == rows
    assert cut[MAX_ROWS:] == ["[truncated: 2 more of 52 rows]"]


def test_rows_are_cut_in_nested_lists_too() -> None:
    result = truncate({"data": {"records": list(range(60))}})
    assert result["data"]["records"][:MAX_ROWS] == list(range(MAX_ROWS))
    assert result["data"]["records"][-1] == "[truncated: 10 more of 60 rows]"


def test_a_long_string_is_cut_to_its_own_limit() -> None:
    assert truncate("x" * 2_000) == "x" * 2_000
    assert truncate("x" * 2_500) == "x" * 2_000 + "…[truncated 500 chars]"


def test_a_result_over_eight_thousand_characters_becomes_a_marker_with_a_prefix() -> None:
    just_fits = {"a": "y" * (MAX_CHARS - len(json.dumps({"a": ""})))}
    assert len(json.dumps(just_fits)) == MAX_CHARS
    assert truncate(just_fits, TruncationLimits(max_string=MAX_CHARS)) == just_fits

    too_big = {"rows": [{"n": i, "text": "z" * 300} for i in range(40)]}
    text = json.dumps(too_big)
    assert len(text) > MAX_CHARS
    cut = truncate(too_big)
    assert cut == {"truncated": True, "total_chars": len(text), "preview": text[:MAX_CHARS]}
    assert len(cut["preview"]) == MAX_CHARS


# --- redaction -------------------------------------------------------------------------------------

SECRET_KEYS = [
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "api_key",
    "api-key",
    "apiKey",
    "apikey",
    "access_key",
    "private_key",
    "authorization",
    "auth",
    "credential",
    "credentials",
    "session_id",
    "cookie",
    "db_password",
    "refresh-token",
    "smtp.secret",
    "PASSWORD",
]
# Whole words of the key only: these merely contain a secret word.
PLAIN_KEYS = ["author", "tokens_used", "secretary", "passwordless_login_hint", "cookies_eaten", "pwdx"]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_named_keys_are_redacted_at_any_depth(key: str) -> None:
    assert redact({key: "hunter2"}) == {key: REDACTED}
    assert redact({"rows": [{"inner": {key: {"nested": "x"}}}]}) == {"rows": [{"inner": {key: REDACTED}}]}


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_keys_that_only_contain_a_secret_word_are_kept(key: str) -> None:
    assert redact({key: "visible"}) == {key: "visible"}


SECRET_TEXTS = {
    "openai key": "sk-" + "A1b2C3d4E5f6G7h8I9j0",
    "aws access key id": "AKIA" + "ABCDEFGHIJKLMNOP",
    "aws session key id": "ASIA" + "ABCDEFGHIJKLMNOP",
    "github token": "ghp_" + "a" * 36,
    "github server token": "ghs_" + "B" * 30,
    "bearer header": "Bearer " + "eyJhbGciOiJIUzI1NiJ9.payload",
    "password assignment": "password: hunter2",
    "api key assignment": "api key=abc123",
    "secret assignment": "SECRET=topsecret",
    "token assignment": "token = xyz",
}


@pytest.mark.parametrize("secret", SECRET_TEXTS.values(), ids=SECRET_TEXTS.keys())
def test_secret_looking_text_is_redacted_inside_free_text(secret: str) -> None:
    cleaned = redact({"notes": f"Call back tomorrow. {secret} thanks"})
    assert secret not in cleaned["notes"]
    assert REDACTED in cleaned["notes"] and cleaned["notes"].startswith("Call back tomorrow.")


@pytest.mark.parametrize(
    "text",
    ["sk-short", "AKIA1234", "ghp_tooshort", "Bearer abc", "a skeleton key", "passwordless sign-in"],
)
def test_text_that_only_resembles_a_secret_is_kept(text: str) -> None:
    assert redact(text) == text


def test_nul_characters_are_made_storable_in_keys_and_values() -> None:
    assert storable("a\x00b") == "a\ufffdb"
    assert redact({"k\x00": ["v\x00"]}) == {"k\ufffd": ["v\ufffd"]}


def test_redaction_runs_before_truncation_so_no_half_secret_survives() -> None:
    secret = "sk-" + "Q" * 40
    text = "x" * 1_989 + " " + secret  # the 2,000-character cut would keep the key's first ten characters
    cleaned = sanitize({"body": text})
    assert "sk-" not in cleaned["body"] and REDACTED in cleaned["body"]


def test_non_text_values_pass_untouched() -> None:
    value: dict[str, Any] = {"n": 1, "f": 1.5, "b": True, "none": None}
    assert sanitize(value) == value


# --- what tools may ask for ------------------------------------------------------------------------


def test_query_records_cannot_ask_for_more_rows_than_the_guard_passes() -> None:
    tool = REGISTRY["query_records"]
    parse_arguments(tool, {"collection": "leads", "limit": MAX_ROWS})
    with pytest.raises(ValidationError, match="less than or equal to 50"):
        parse_arguments(tool, {"collection": "leads", "limit": MAX_ROWS + 1})


def test_no_tool_offers_a_row_limit_above_the_guard() -> None:
    """Every `limit` argument in the catalog is bounded by MAX_ROWS, so a result is never cut
    silently at the guard after the model asked for more."""
    bounded = []
    for tool in REGISTRY.values():
        field = tool.args_model.model_fields.get("limit")
        if field is None:
            continue
        maxima = [m.le for m in field.metadata if getattr(m, "le", None) is not None]
        assert maxima and maxima[0] <= MAX_ROWS, tool.name
        assert typing.get_origin(field.annotation) is None, tool.name
        bounded.append(tool.name)
    assert {"query_records", "search_leads", "list_tasks"} <= set(bounded)
