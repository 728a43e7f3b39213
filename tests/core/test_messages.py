"""The chat messages the workflow keeps (countersign.core.messages), as plain functions: what one
model reply may put into a conversation, conversation-wide call ids, usage sums and the OpenAI wire
shape."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from countersign.core.messages import (
    KEPT_CHARS,
    MAX_ARGUMENTS_CHARS,
    MAX_REPLY_CHARS,
    MAX_TOOL_NAME_CHARS,
    ChatMessage,
    ToolCall,
    Usage,
    capped_reply,
    numbered,
)


def test_a_call_within_bounds_is_kept_whole() -> None:
    call = ToolCall.capped("x", "get_lead", "a" * MAX_ARGUMENTS_CHARS)
    assert (call.name, len(call.arguments), call.arguments_chars) == ("get_lead", MAX_ARGUMENTS_CHARS, None)


def test_oversized_arguments_keep_their_start_and_say_how_long_they_were() -> None:
    call = ToolCall.capped("x", "send_email", "b" * (MAX_ARGUMENTS_CHARS + 1))
    assert call.arguments == "b" * KEPT_CHARS and call.arguments_chars == MAX_ARGUMENTS_CHARS + 1


def test_an_overlong_tool_name_is_cut_and_says_so() -> None:
    name = "n" * (MAX_TOOL_NAME_CHARS + 36)
    capped = ToolCall.capped("x", name, "{}").name
    assert capped == "n" * MAX_TOOL_NAME_CHARS + f"...({len(name)} characters)"
    assert ToolCall.capped("x", "n" * MAX_TOOL_NAME_CHARS, "{}").name == "n" * MAX_TOOL_NAME_CHARS


def test_an_overlong_reply_is_cut_with_a_marker() -> None:
    assert capped_reply("fine") == "fine"
    long = capped_reply("r" * (MAX_REPLY_CHARS + 5))
    assert long.startswith("r" * MAX_REPLY_CHARS)
    assert long.endswith(f"\n[truncated: the model replied {MAX_REPLY_CHARS + 5} characters]")


@given(after=st.integers(0, 10_000), count=st.integers(0, 6))
def test_calls_are_numbered_after_the_conversations_last(after: int, count: int) -> None:
    """The model's own ids may repeat across turns; the conversation's never do."""
    message = ChatMessage(
        role="assistant", tool_calls=[ToolCall(id="call_0", name=f"t{i}") for i in range(count)]
    )
    renamed = numbered(message, after)
    assert [c.id for c in renamed.tool_calls] == [f"c{after + i}" for i in range(1, count + 1)]
    assert [c.name for c in renamed.tool_calls] == [c.name for c in message.tool_calls]
    assert [c.id for c in message.tool_calls] == ["call_0"] * count  # the original is left alone


@given(
    a=st.tuples(*[st.integers(0, 10**6)] * 4),
    b=st.tuples(*[st.integers(0, 10**6)] * 4),
)
def test_usage_adds_up_field_by_field(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> None:
    def usage(v: tuple[int, int, int, int]) -> Usage:
        return Usage(prompt_tokens=v[0], completion_tokens=v[1], model_calls=v[2], tool_calls=v[3])

    total = usage(a).plus(usage(b))
    assert total == usage((a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]))
    assert total.total_tokens == a[0] + a[1] + b[0] + b[1]


def test_messages_as_the_openai_api_expects_them() -> None:
    call = ToolCall(id="c1", name="get_lead", arguments='{"lead": "jane"}')
    assert ChatMessage(role="assistant", content=None, tool_calls=[call]).to_openai() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_lead", "arguments": '{"lead": "jane"}'},
            }
        ],
    }
    assert ChatMessage(role="tool", tool_call_id="c1", name="get_lead", content="{}").to_openai() == {
        "role": "tool",
        "content": "{}",
        "tool_call_id": "c1",
    }
    assert ChatMessage(role="user", name="alice", content="hi").to_openai() == {
        "role": "user",
        "content": "hi",
    }
