"""The carried state's digest (countersign.core.seal), a plain function tested without a server.

The seal binds the digest, so the digest decides which state a next run accepts: any change of a
carried value must change it, and a field a later build adds (with a default) must not change the
digest of state an earlier build sealed, or a conversation continuing onto the new build would be
refused as forged.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from countersign.core.contract import CarriedState
from countersign.core.messages import Usage
from countersign.core.seal import digest


class NextBuildsCarriedState(CarriedState):
    """CarriedState as a later build might define it: one more field, with a default."""

    escalations: list[str] = []


def carried(turn: int, call_seq: int, ended_by: str | None) -> CarriedState:
    return CarriedState(
        messages=[], usage=Usage(), turn=turn, call_seq=call_seq, conversation_id="run-1", ended_by=ended_by
    )


@given(turn=st.integers(0, 10_000), call_seq=st.integers(0, 10_000), ended_by=st.none() | st.text())
def test_a_field_a_later_build_adds_leaves_the_digest_of_earlier_state(
    turn: int, call_seq: int, ended_by: str | None
) -> None:
    state = carried(turn, call_seq, ended_by)
    assert digest(NextBuildsCarriedState(**state.model_dump())) == digest(state)
    later = NextBuildsCarriedState(**state.model_dump(), escalations=["bob"])
    assert digest(later) != digest(state)  # a value it carries is covered


@given(
    first=st.tuples(st.integers(0, 50), st.integers(0, 50), st.none() | st.text(max_size=8)),
    second=st.tuples(st.integers(0, 50), st.integers(0, 50), st.none() | st.text(max_size=8)),
)
def test_states_that_differ_have_different_digests(
    first: tuple[int, int, str | None], second: tuple[int, int, str | None]
) -> None:
    assert (digest(carried(*first)) == digest(carried(*second))) == (first == second)
