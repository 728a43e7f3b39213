"""The saga as workflow state (countersign.core.saga), without a server: which writes a rollback of
each scope undoes (newest first, never one already undone), and how a compensation's outcome is
recorded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from countersign.core.saga import EntryState, RollbackRequest, Saga, Scope, undo_state

STATES: list[EntryState] = ["registered", "done", "skipped", "irreversible", "failed"]


def saga_of(*entries: tuple[str, int, EntryState]) -> Saga:
    saga = Saga()
    for call_id, turn, state in entries:
        saga.register(call_id, "update_lead_status", turn, "{}").state = state
    return saga


def ids(saga: Saga, scope: Scope, turn: int, call_id: str | None = None) -> list[str]:
    return [e.call_id for e in saga.to_undo(scope, turn, call_id)]


def test_an_entry_is_registered_undoable_with_what_ran() -> None:
    saga = Saga()
    entry = saga.register("c1", "create_task", 2, '{"title": "x"}')
    assert saga.entries == [entry]
    assert (entry.state, entry.turn, entry.arguments, entry.result, entry.error) == (
        "registered",
        2,
        '{"title": "x"}',
        None,
        None,
    )


def test_a_turns_rollback_undoes_that_turns_writes_newest_first() -> None:
    saga = saga_of(("c1", 1, "registered"), ("c2", 2, "registered"), ("c3", 2, "registered"))
    assert ids(saga, "turn", 2) == ["c3", "c2"]
    assert ids(saga, "turn", 1) == ["c1"]
    assert ids(saga, "turn", 3) == []


def test_a_conversations_rollback_undoes_every_write_newest_first() -> None:
    saga = saga_of(("c1", 1, "registered"), ("c2", 2, "registered"), ("c3", 3, "registered"))
    assert ids(saga, "conversation", 3) == ["c3", "c2", "c1"]


def test_a_calls_rollback_undoes_that_call_only() -> None:
    saga = saga_of(("c1", 1, "registered"), ("c2", 1, "registered"))
    assert ids(saga, "call", 1, "c1") == ["c1"]
    assert ids(saga, "call", 1, "c9") == []
    assert ids(saga, "call", 1, None) == []


@pytest.mark.parametrize("state", ["done", "skipped", "irreversible", "failed"])
def test_nothing_is_undone_twice(state: EntryState) -> None:
    saga = saga_of(("c1", 1, state), ("c2", 1, "registered"))
    assert ids(saga, "conversation", 1) == ["c2"]
    assert ids(saga, "call", 1, "c1") == []
    assert saga.knows("c1")  # still a write of this conversation: a rollback of it is not refused


@given(
    entries=st.lists(
        st.tuples(st.sampled_from(["c1", "c2", "c3", "c4"]), st.integers(1, 4), st.sampled_from(STATES)),
        max_size=12,
    ),
    scope=st.sampled_from(["turn", "conversation", "call"]),
    turn=st.integers(1, 4),
    call_id=st.sampled_from(["c1", "c2", "c9"]),
)
def test_a_rollback_undoes_the_registered_entries_of_its_scope_in_reverse_order(
    entries: list[tuple[str, int, EntryState]], scope: Scope, turn: int, call_id: str
) -> None:
    saga = saga_of(*entries)
    wanted = [
        e
        for e in saga.entries
        if e.state == "registered"
        and (e.call_id == call_id if scope == "call" else scope == "conversation" or e.turn == turn)
    ]
    undo = saga.to_undo(scope, turn, call_id)
    assert [id(e) for e in undo] == [id(e) for e in reversed(wanted)]  # the entries themselves
    assert saga.knows(call_id) == any(e.call_id == call_id for e in saga.entries)


def test_failures_name_each_failed_compensation_with_its_error() -> None:
    saga = saga_of(("c1", 1, "done"), ("c2", 1, "failed"), ("c3", 2, "failed"))
    saga.entries[1].error = "lead 7 is locked"
    assert saga.failures() == ["c2 update_lead_status: lead 7 is locked", "c3 update_lead_status: None"]
    assert Saga().failures() == []


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        ("undone", "done"),
        ("already_undone", "done"),
        ("never_happened", "skipped"),
        ("irreversible", "irreversible"),
        ("", "irreversible"),
        ("UNDONE", "irreversible"),  # an outcome nobody defined is never taken for undone
    ],
)
def test_a_compensations_outcome_as_the_saga_records_it(outcome: str, state: EntryState) -> None:
    assert undo_state(outcome) == state


@pytest.mark.parametrize(
    "payload",
    [
        {"requested_by": ""},
        {"requested_by": "alice\x00"},
        {"requested_by": "alice", "scope": "everything"},
        {"requested_by": "alice", "scope": "call", "call_id": "c\n1"},
    ],
)
def test_a_rollback_request_out_of_bounds_is_refused(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RollbackRequest.model_validate(payload)


def test_a_rollback_request_undoes_the_latest_turn_unless_it_says_otherwise() -> None:
    assert RollbackRequest(requested_by="alice").scope == "turn"
