"""What a conversation carries into its next run and what one model call may send
(countersign.core.history), as pure functions."""

from hypothesis import given
from hypothesis import strategies as st

from countersign.core.history import (
    HISTORY_BYTES_BUDGET,
    HISTORY_EVENTS_BUDGET,
    continue_suggested,
    fit_for_model,
    history_full,
    trim_for_carry,
)
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


# --- what one model call may send (fit_for_model) --------------------------------------------------


def size(messages: list[ChatMessage]) -> int:
    return sum(len(m.model_dump_json().encode()) for m in messages)


def test_a_conversation_within_the_budget_is_sent_whole() -> None:
    messages = [SYSTEM, *turn(1, 2), *turn(2, 1)]
    assert fit_for_model(messages, size(messages)) == messages


def test_over_the_budget_the_oldest_whole_turns_go_first() -> None:
    messages = [SYSTEM, *turn(1, 2), *turn(2, 1), *turn(3, 1)]
    budget = size([SYSTEM, *turn(2, 1), *turn(3, 1)])
    assert fit_for_model(messages, budget) == [SYSTEM, *turn(2, 1), *turn(3, 1)]
    assert fit_for_model(messages, budget - 1) == [SYSTEM, *turn(3, 1)]


def test_a_latest_turn_too_big_for_the_budget_is_cut_message_by_message_with_a_marker() -> None:
    huge = [
        ChatMessage(role="user", content="u" * 50_000),
        ChatMessage(
            role="assistant", tool_calls=[ToolCall(id="c1", name="send_email", arguments="a" * 50_000)]
        ),
        ChatMessage(role="tool", tool_call_id="c1", content="t" * 50_000),
    ]
    kept = fit_for_model([SYSTEM, *turn(1, 0), *huge], 40_000)
    assert kept[0] == SYSTEM and [m.role for m in kept[1:]] == ["user", "assistant", "tool"]
    share = (40_000 - size([SYSTEM])) // (4 * 3)  # equal shares at 4 bytes a character, at worst
    assert kept[1].content == "u" * share + f"…[cut for the model call: {50_000 - share} characters]"
    assert kept[2].tool_calls[0].arguments == "a" * share  # the call keeps its id and name
    assert (kept[2].tool_calls[0].id, kept[3].tool_call_id) == ("c1", "c1")
    assert size(kept) <= 40_000


@given(
    turns=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3_000)), min_size=1, max_size=6),
    budget=st.integers(2_000, 30_000),
)
def test_what_is_sent_starts_at_a_user_message_and_always_holds_the_latest_turn(
    turns: list[tuple[int, int]], budget: int
) -> None:
    messages = [SYSTEM]
    for n, (calls, chars) in enumerate(turns):
        messages += [ChatMessage(role="user", content="q" * chars), *turn(n, calls)[1:]]
    kept = fit_for_model(messages, budget)
    assert kept[0] == SYSTEM and kept[1].role == "user"
    latest = max(i for i, m in enumerate(messages) if m.role == "user")
    assert len(kept) - 1 >= len(messages) - latest  # the latest turn, whole or cut, is there
    if size(messages[latest:]) + size([SYSTEM]) <= budget:
        assert size(kept) <= budget and messages[-len(kept) + 1 :] == kept[1:]


class History:
    def __init__(self, length: int, size: int, suggested: bool = False) -> None:
        self.length, self.size, self.suggested = length, size, suggested

    def get_current_history_length(self) -> int:
        return self.length

    def get_current_history_size(self) -> int:
        return self.size

    def is_continue_as_new_suggested(self) -> bool:
        return self.suggested


def test_a_run_continues_as_new_past_either_budget_or_when_the_server_suggests_it() -> None:
    assert not history_full(History(HISTORY_EVENTS_BUDGET, HISTORY_BYTES_BUDGET))
    assert history_full(History(HISTORY_EVENTS_BUDGET + 1, 0))
    assert history_full(History(0, HISTORY_BYTES_BUDGET + 1))
    assert not continue_suggested(History(10, 1_000))
    assert continue_suggested(History(10, 1_000, suggested=True))
    assert continue_suggested(History(HISTORY_EVENTS_BUDGET + 1, 0))
