"""The carried state's digest and seal (countersign.core.seal), plain functions tested without a server.

The seal binds the digest, so the digest decides which state a next run accepts: any change of a
carried value must change it, and a field a later build adds (with a default) must not change the
digest of state an earlier build sealed, or a conversation continuing onto the new build would be
refused as forged.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.core.contract import CarriedState
from countersign.core.messages import Usage
from countersign.core.seal import UNBOUND_SEAL_VERSION, SealCheck, SealRequest, digest, mac, verify


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


# --- the seal: bound to whose conversation it is, to this instance and to the run that made it ---

KEY = b"worker-secret"
INSTANCE = {
    "conversation_id": "run-1",
    "workflow_id": "conv-acme-1",
    "tenant_id": "acme",
    "user_id": "alice",
    "agent": "lead-qualifier",
}


def sealed(**changes: str) -> SealCheck:
    request = SealRequest(**INSTANCE, digest=digest(carried(3, 5, None)))
    return SealCheck(
        **request.model_dump(), seal=mac(KEY, request, "run-0"), run_instance="run-1", continued_from="run-0"
    ).model_copy(update=changes)


def test_a_seal_made_for_this_conversation_and_state_verifies() -> None:
    assert verify(KEY, sealed()) == ""


@pytest.mark.parametrize("seal", [None, ""])
def test_carried_state_without_a_seal_is_refused(seal: str | None) -> None:
    assert verify(KEY, sealed().model_copy(update={"seal": seal})) == (
        "carried state without a seal: only the conversation itself may carry state"
    )


def test_a_seal_presented_to_another_instance_of_the_workflow_id_is_refused() -> None:
    refusal = verify(KEY, sealed(run_instance="run-9"))
    assert refusal.startswith("carried state of conversation instance 'run-1' presented to instance 'run-9'")


@given(
    field=st.sampled_from(["workflow_id", "tenant_id", "user_id", "agent", "digest"]),
    value=st.text(min_size=1, max_size=12),
)
def test_a_seal_for_anything_else_does_not_verify(field: str, value: str) -> None:
    check = sealed()
    if getattr(check, field) != value:
        assert verify(KEY, check.model_copy(update={field: value})).startswith(
            "carried state whose seal does not verify"
        )


def test_a_seal_moved_to_another_instance_with_its_id_does_not_verify() -> None:
    """Naming the new instance in the check is not enough: the MAC binds the one it was made for."""
    assert verify(KEY, sealed(conversation_id="run-9", run_instance="run-9")) != ""


def test_only_the_deployments_key_makes_a_seal() -> None:
    assert verify(b"another-secret", sealed()) != ""
    request = SealRequest(**INSTANCE, digest="0" * 64)
    assert mac(KEY, request, "run-0") != mac(b"another-secret", request, "run-0")
    assert len(mac(KEY, request, "run-0")) == 64
    assert mac(KEY, request, "run-0") == mac(KEY, request, "run-0")


def check(seal: str, continued_from: str, state: CarriedState) -> SealCheck:
    return SealCheck(
        **INSTANCE, digest=digest(state), seal=seal, run_instance="run-1", continued_from=continued_from
    )


@given(runs=st.lists(st.uuids().map(str), min_size=2, max_size=10, unique=True))
def test_the_same_state_sealed_by_successive_runs_never_repeats_a_seal(runs: list[str]) -> None:
    """Refused inputs change nothing carried: an idle conversation continuing as new again and again
    seals the same state each time. Each run's seal is its own, and verifies only for the run that
    continued from it."""
    state = carried(3, 4, None)
    request = SealRequest(**INSTANCE, digest=digest(state))
    seals = [mac(KEY, request, run) for run in runs]
    assert len(set(seals)) == len(runs)
    for sealer, seal in zip(runs, seals, strict=True):
        assert verify(KEY, check(seal, sealer, state)) == ""
        other = next(r for r in runs if r != sealer)
        assert "does not verify" in verify(KEY, check(seal, other, state))
        assert "does not verify" in verify(KEY, check(seal, "", state))  # a client's start


def test_a_seal_an_earlier_build_made_without_its_run_still_verifies() -> None:
    """A conversation sealed before seals named their run continues onto this build (its seal is
    spent once, as any other)."""
    state = carried(1, 0, None)
    bound = ("tenant_id", "user_id", "agent", "workflow_id", "conversation_id")
    fields = (UNBOUND_SEAL_VERSION, *(INSTANCE[k] for k in bound), digest(state))
    old = hmac.new(KEY, "\n".join(fields).encode(), hashlib.sha256).hexdigest()
    assert verify(KEY, check(old, "run-7", state)) == ""
    assert "does not verify" in verify(KEY, check(old, "run-7", carried(2, 0, None)))
