"""A call's arguments as text (tools/arguments.py `load_arguments`): what is no bounded, storable JSON
object is a VALIDATION_ERROR whose message the model reads, worded as it always was."""

from __future__ import annotations

import pytest

from tools.arguments import load_arguments
from tools.registry import ToolFailure


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[1]", "arguments must be a JSON object"),
        ("{", "arguments refused: not valid JSON"),
        ('{"to": "a", "to": "b"}', "arguments refused: "),
        ('{"to": "\\u0000"}', "arguments may not contain NUL characters (U+0000)"),
    ],
)
def test_arguments_that_are_no_storable_object_are_a_validation_error(raw: str, message: str) -> None:
    with pytest.raises(ToolFailure) as refused:
        load_arguments(raw)
    assert refused.value.code == "VALIDATION_ERROR" and refused.value.message.startswith(message)


def test_arguments_as_an_object_are_read_and_no_text_is_the_empty_object() -> None:
    assert load_arguments('{"lead": 7}') == {"lead": 7}
    assert load_arguments("") == {}
