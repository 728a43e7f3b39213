"""The continue-as-new trimming rule, as a pure function."""

from countersign.core.history import trim_for_carry
from countersign.core.messages import ChatMessage, ToolCall


def turn(n: int, calls: int) -> list[ChatMessage]:
    msgs = [ChatMessage(role="user", content=f"q{n}")]
    for i in range(calls):
        msgs.append(ChatMessage(role="assistant", tool_calls=[ToolCall(id=f"c{n}.{i}", name="get_lead")]))
        msgs.append(ChatMessage(role="tool", tool_call_id=f"c{n}.{i}", content="{}"))
    msgs.append(ChatMessage(role="assistant", content=f"a{n}"))
    return msgs


SYSTEM = ChatMessage(role="system", content="prompt")


def test_short_history_is_kept_whole() -> None:
    messages = [SYSTEM, *turn(1, 1), *turn(2, 0)]
    assert trim_for_carry(messages, 50) == messages


def test_cut_only_at_turn_boundaries_keeping_the_system_prompt() -> None:
    messages = [SYSTEM, *turn(1, 3), *turn(2, 1), *turn(3, 1)]  # 8 + 4 + 4 messages after the prompt
    kept = trim_for_carry(messages, 10)
    assert kept[0] == SYSTEM and kept[1].content == "q2" and len(kept) == 9
    assert all(
        m.role != "tool" or any(c.id == m.tool_call_id for k in kept for c in k.tool_calls) for m in kept
    )


def test_the_latest_turn_survives_even_when_too_long() -> None:
    messages = [SYSTEM, *turn(1, 0), *turn(2, 10)]
    kept = trim_for_carry(messages, 5)
    assert kept[0] == SYSTEM and kept[1].content == "q2" and len(kept) == 23
