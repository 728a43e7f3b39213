"""The edge bounds on everything a client or the model sends (countersign.core.bounds), as plain
functions: names refused, text made storable and cut, JSON bounded before it is parsed further, a
key twice refused, and any JSON made what PostgreSQL and Temporal payloads can hold."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from countersign.core.bounds import (
    MAX_ID_CHARS,
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_TEXT_CHARS,
    BoundedJson,
    DuplicateKey,
    Identifier,
    Text,
    cut,
    dumps_storable,
    encodable,
    has_control,
    json_depth_refusal,
    json_text_refusal,
    load_arguments_or_raw,
    loads_bounded,
    loads_object,
    loads_strict,
    storable,
    storable_json,
    unstorable_refusal,
)

IDENTIFIER = TypeAdapter(Identifier)
TEXT = TypeAdapter(Text)
BOUNDED = TypeAdapter(BoundedJson)
# Any JSON-like value, with what outside JSON may hold and PostgreSQL may not: NUL, lone
# surrogates, NaN and the infinities.
ODD_TEXT = st.text(st.characters(codec=None, categories=None) | st.sampled_from("\x00\ud800\udfff"))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ODD_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ODD_TEXT, children, max_size=4),
    max_leaves=20,
)


def nested(depth: int) -> Any:
    """`depth` lists, one inside the other."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


# --- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bob", "conv-acme-1", "b" * MAX_ID_CHARS, "zoë"])
def test_a_name_within_bounds_is_kept_as_is(name: str) -> None:
    assert IDENTIFIER.validate_python(name) == name


@pytest.mark.parametrize(
    "name", ["", "b" * (MAX_ID_CHARS + 1), "bob\x00", "bob\nadmin", "tab\there", "del\x7f", "lone\ud800"]
)
def test_a_name_out_of_bounds_is_refused_never_altered(name: str) -> None:
    with pytest.raises(ValidationError):
        IDENTIFIER.validate_python(name)


@given(st.text())
def test_has_control_is_exactly_the_c0_controls_del_and_surrogates(text: str) -> None:
    expected = any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in text)
    assert has_control(text) == expected


# --- free text -----------------------------------------------------------------------------------


@given(ODD_TEXT)
def test_storable_text_holds_no_nul_and_no_lone_surrogate_and_keeps_the_rest(text: str) -> None:
    kept = storable(text)
    assert "\x00" not in kept and not any(0xD800 <= ord(c) <= 0xDFFF for c in kept)
    assert len(kept) == len(text)
    assert all(a == b or b == "\ufffd" for a, b in zip(text, kept, strict=True))
    kept.encode("utf-8")  # no lone surrogate left to fail the encoding


@given(text=st.text(max_size=3_000), limit=st.integers(100, 2_500))
def test_cut_keeps_the_start_says_how_much_went_and_cutting_again_changes_nothing(
    text: str, limit: int
) -> None:
    once = cut(text, limit)
    if len(text) <= limit:
        assert once == text
    else:
        assert len(once) <= limit
        kept = once.index("…[cut: ")
        assert text.startswith(once[:kept])
        assert once.endswith(f"of {len(text)} characters, over the {limit}-character limit]")
    assert cut(once, limit) == once  # the client and the worker both apply the bound


def test_a_message_is_made_storable_then_cut_to_its_bound() -> None:
    assert TEXT.validate_python("hi\x00") == "hi\ufffd"
    long = TEXT.validate_python("x" * (MAX_TEXT_CHARS + 1))
    assert len(long) <= MAX_TEXT_CHARS and long.endswith("-character limit]")


# --- JSON from outside -----------------------------------------------------------------------------


def test_depth_is_counted_on_values_up_to_the_limit() -> None:
    assert json_depth_refusal(nested(MAX_JSON_DEPTH)) is None
    assert json_depth_refusal(nested(MAX_JSON_DEPTH + 1)) == f"nested deeper than {MAX_JSON_DEPTH} levels"
    assert json_depth_refusal({"a": {"b": [1]}}, limit=2) == "nested deeper than 2 levels"


def test_depth_of_a_value_far_too_deep_for_recursion_is_counted_without_it() -> None:
    assert json_depth_refusal(nested(100_000)) is not None


def test_json_text_is_measured_before_any_parser_recurses_into_it() -> None:
    assert json_text_refusal("[" * 10_000) == f"nested deeper than {MAX_JSON_DEPTH} levels"
    assert json_text_refusal(json.dumps(nested(MAX_JSON_DEPTH))) is None
    assert json_text_refusal(json.dumps(nested(MAX_JSON_DEPTH + 1))) is not None
    too_big = json.dumps({"body": "é" * MAX_JSON_BYTES})  # counted in UTF-8 bytes, not characters
    assert (
        json_text_refusal(too_big)
        == f"{len(too_big.encode())} bytes, more than the {MAX_JSON_BYTES}-byte limit"
    )


@pytest.mark.parametrize("text", ['"[[[[[[[["', '{"a": "\\"[[[[[[[[\\""}', '["]]]]", "[[[["]'])
def test_brackets_inside_strings_are_not_nesting(text: str) -> None:
    assert json_text_refusal(text, depth=2) is None


def test_a_key_twice_is_refused_at_any_depth() -> None:
    with pytest.raises(DuplicateKey, match="'to' appears more than once"):
        loads_strict('{"to": "a@x", "to": "evil@x"}')
    with pytest.raises(DuplicateKey):
        loads_strict('[{"a": {"b": 1, "b": 1}}]')
    assert loads_strict('{"a": {"b": 1}, "b": {"a": 2}}') == {"a": {"b": 1}, "b": {"a": 2}}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"to": 1, "to": 2}', "appears more than once"),
        ("{not json", "not valid JSON"),
        ("[" * 40 + "]" * 40, "nested deeper than"),
        ('"' + "x" * MAX_JSON_BYTES + '"', "-byte limit"),
    ],
)
def test_loads_bounded_answers_why_not_instead_of_raising(text: str, why: str) -> None:
    value, refusal = loads_bounded(text)
    assert value is None and refusal is not None and why in refusal


@given(JSON_VALUES.filter(lambda v: json_depth_refusal(v) is None))
def test_loads_bounded_reads_back_what_json_wrote(value: Any) -> None:
    text = json.dumps(value)
    if len(text.encode("utf-8", "replace")) <= MAX_JSON_BYTES:
        read, refusal = loads_bounded(text)
        assert refusal is None
        assert json.dumps(read) == text  # NaN is not equal to itself: compare as written


@pytest.mark.parametrize(
    "value",
    [
        {"to": "a\x00b"},
        {"a\x00": 1},
        {"to": ["x", "\ud800"]},
        {"deep": nested(MAX_JSON_DEPTH)},  # one level more with the object that holds it
        {"body": "x" * MAX_JSON_BYTES},
    ],
)
def test_an_edit_that_cannot_be_stored_or_is_too_big_is_refused(value: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        BOUNDED.validate_python(value)


def test_unstorable_refusal_names_what_it_found() -> None:
    assert unstorable_refusal({"a": [{"b": "ok"}], "c": 1.5}) is None
    assert unstorable_refusal({"a": [{"b": "x\x00"}]}) == "may not contain NUL characters (U+0000)"
    assert unstorable_refusal({"\udc80": 1}) is not None and "lone surrogates" in str(
        unstorable_refusal({"\udc80": 1})
    )


# --- JSON for PostgreSQL and Temporal payloads ---------------------------------------------------


def test_numbers_json_has_not_become_the_strings_python_reads() -> None:
    assert storable_json([math.nan, math.inf, -math.inf, 1.5]) == ["NaN", "Infinity", "-Infinity", 1.5]
    assert storable_json({"a\x00": ("x\ud800",)}) == {"a\ufffd": ["x\ufffd"]}


@given(JSON_VALUES)
def test_any_json_value_is_written_as_json_postgresql_accepts(value: Any) -> None:
    text = dumps_storable(value)
    assert text == json.dumps(storable_json(value), allow_nan=False)  # the fast path writes the same
    assert unstorable_refusal(json.loads(text)) is None  # no NUL, no lone surrogate (pairs are fine)


@given(JSON_VALUES)
def test_encodable_values_encode_as_utf8_and_keep_nul_and_nan(value: Any) -> None:
    made = encodable(value)
    json.dumps(made, ensure_ascii=False).encode("utf-8")  # no lone surrogate left anywhere
    if isinstance(value, str):
        assert made.count("\x00") == value.count("\x00")


def test_a_model_is_encoded_as_its_dump() -> None:
    class Note(BaseModel):
        text: str
        tags: list[str]

    assert encodable(Note(text="a\ud800", tags=["\udfff", "ok"])) == {
        "text": "a\ufffd",
        "tags": ["\ufffd", "ok"],
    }


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"a": 1, "a": 2}', "refused: "),
        ("[1]", "must be a JSON object"),
        ("{", "refused: not valid JSON"),
        ('{"to": "\\u0000"}', "NUL"),
    ],
)
def test_arguments_that_are_no_storable_object_say_why_and_the_audit_keeps_their_text(
    text: str, why: str
) -> None:
    value, refusal = loads_object(text)
    assert value is None and refusal is not None and why in refusal
    assert load_arguments_or_raw(text) == {"_raw": text}
    assert load_arguments_or_raw(text * 2000)["_raw"] == (text * 2000)[:2000]


def test_arguments_as_an_object_are_read_and_no_text_is_the_empty_object() -> None:
    assert loads_object('{"to": "jane@example.com"}') == ({"to": "jane@example.com"}, None)
    assert loads_object("") == ({}, None)
    assert load_arguments_or_raw('{"n": 1}') == {"n": 1}
