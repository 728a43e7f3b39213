"""The window and budget rules of the conversation store, as plain functions (no server)."""

from __future__ import annotations

from countersign.core.envelopes import (
    Envelope,
    WindowPolicy,
    budget_refusal,
    message_envelope,
    remember_answer,
    select_window,
    units,
)
from countersign.core.messages import ChatMessage, ToolCall


def turn(first_seq: int, calls: int) -> list[Envelope]:
    """A user message, an assistant message calling `calls` tools, their results, a reply."""
    ids = [f"c{first_seq}-{i}" for i in range(calls)]
    log = [Envelope(seq=first_seq, role="user", tokens=10)]
    log.append(Envelope(seq=first_seq + 1, role="assistant", tokens=5, call_ids=ids))
    log += [
        Envelope(seq=first_seq + 2 + i, role="tool", tokens=100, tool_call_id=c, name="query_records")
        for i, c in enumerate(ids)
    ]
    log.append(Envelope(seq=first_seq + 2 + calls, role="assistant", tokens=5))
    return log


def test_a_tool_result_stays_with_its_call() -> None:
    log = turn(1, 3) + turn(7, 3)
    assert [len(u) for u in units(log)] == [1, 4, 1, 1, 4, 1]
    for size in range(1, len(log) + 1):
        kept = select_window(log, WindowPolicy(window_messages=size))
        first = kept[0]
        assert first.role != "tool", f"window of {size} starts with a tool result"
        assert len(kept) <= max(size, 1)


def test_admin_assistant_window_keeps_the_last_20_messages() -> None:
    log = [e for t in range(10) for e in turn(1 + t * 6, 3)]  # 60 messages
    kept = select_window(log, WindowPolicy(window_messages=20))
    assert 17 <= len(kept) <= 20 and kept[-1] == log[-1]
    assert [e.seq for e in kept] == [e.seq for e in log[-len(kept) :]]


def test_token_window_drops_old_units_but_keeps_the_newest() -> None:
    log = turn(1, 2) + turn(6, 2)
    kept = select_window(log, WindowPolicy(window_tokens=212))
    assert [e.seq for e in kept] == [7, 8, 9, 10]  # the call with its two results and the reply
    assert select_window(log, WindowPolicy(window_tokens=1)) == [log[-1]]


def test_without_a_policy_the_model_sees_at_most_200_messages() -> None:
    log = [Envelope(seq=i, role="user") for i in range(1, 301)]
    assert len(select_window(log, WindowPolicy())) == 200


def test_conversation_budget() -> None:
    assert budget_refusal(WindowPolicy(), 10**9) is None
    assert budget_refusal(WindowPolicy(conversation_tokens=100), 99) is None
    refusal = budget_refusal(WindowPolicy(conversation_tokens=100), 100)
    assert refusal is not None and "budget is 100" in refusal


def test_envelope_keeps_ids_and_sizes_not_bodies() -> None:
    call = ToolCall(id="c1", name="get_lead")
    message = ChatMessage(role="assistant", content="x" * 4000, tool_calls=[call])
    envelope = message_envelope(3, message)
    assert envelope.call_ids == ["c1"] and envelope.tokens > 1000
    assert "xxxx" not in envelope.model_dump_json()


def test_answered_ids_are_bounded() -> None:
    answered: dict[str, int] = {}
    for i in range(250):
        remember_answer(answered, f"m{i}", i)
    assert len(answered) == 200 and "m0" not in answered and answered["m249"] == 249


def test_folding_into_the_summary_keeps_half_the_window() -> None:
    log = [Envelope(seq=i, role="user", tokens=10) for i in range(1, 22)]
    policy = WindowPolicy(window_messages=20, window_tokens=1000, summarize=True)
    assert len(select_window(log, policy)) == 20
    assert [e.seq for e in select_window(log, policy, fold=True)] == list(range(12, 22))
    assert len(select_window(log, WindowPolicy(window_tokens=100), fold=True)) == 5
