"""Proofs as pure functions: what a valid proof is bound to, and every way a forged or misused one
is refused (no server: keys and clock are arguments)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.core.approvals import PendingCall
from countersign.identity.proofs import (
    PROOF_TTL,
    Binding,
    ProofRefused,
    args_digest,
    load_private_key,
    load_public_key,
    mint_proof,
    verify_proof,
)
from countersign.server.auth import Reviewer, issue_session, read_session

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
KEY = Ed25519PrivateKey.generate()
ARGS = '{"lead": "jane.doe@example.com", "new_status": "qualified", "reason": "Budget confirmed"}'
CALL = PendingCall(
    tenant_id="acme",
    workflow_id="conv-1",
    conversation_id="run-1",
    call_id="c1",
    tool="update_lead_status",
    risk="high",
    nonce="n-1",
)
EFFECT = "a" * 64  # the digest of the effect the approval request recorded
BOUND = Binding.decision(CALL, "approve", ARGS, EFFECT)


def decision(
    kind: Literal["approve", "reject"] = "approve", args: Any = ARGS, effect: str = EFFECT, **other: str
) -> Binding:
    return Binding.decision(CALL.model_copy(update=other), kind, args, effect)


def test_a_proof_for_exactly_the_decision_verifies() -> None:
    token = mint_proof(KEY, "bob", BOUND, NOW)
    claims = verify_proof(KEY.public_key(), token, BOUND, NOW + timedelta(seconds=30))
    assert (claims.sub, claims.tenant, claims.wf, claims.act, claims.tgt) == (
        "bob", "acme", "conv-1", "approve", "c1"
    )  # fmt: skip
    assert claims.args == args_digest(ARGS) and claims.effect == EFFECT


def test_the_arguments_hash_ignores_spelling_not_content() -> None:
    respelled = '{"reason":"Budget confirmed","new_status":"qualified","lead":"jane.doe@example.com"}'
    assert args_digest(respelled) == args_digest(ARGS)
    assert args_digest(
        {"lead": "jane.doe@example.com", "new_status": "qualified", "reason": "Budget confirmed"}
    ) == (args_digest(ARGS))
    assert args_digest(ARGS.replace("qualified", "converted")) != args_digest(ARGS)


@pytest.mark.parametrize(
    ("bound_to", "reason"),
    [
        (decision(tenant_id="globex"), "another tenant"),
        (decision(workflow_id="conv-2"), "another conversation"),
        (decision(conversation_id="run-2"), "another conversation instance"),
        (decision("reject"), "another action"),
        (decision(call_id="c2"), "another target"),
        (decision(tool="get_lead"), "another tool"),
        (decision(risk="low"), "another risk"),
        (decision(nonce="n-2"), "another approval nonce"),
        (decision(args={"lead": "x"}), "another arguments"),
        (decision(effect="b" * 64), "another effect"),
        (decision(effect=""), "another effect"),
        (Binding.answer("acme", "conv-1", "run-1", "c1", "yes"), "another action"),
        (Binding.end("acme", "conv-1", "run-1"), "another action"),
    ],
)
def test_a_proof_for_something_else_is_refused(bound_to: Binding, reason: str) -> None:
    token = mint_proof(KEY, "bob", bound_to, NOW)
    with pytest.raises(ProofRefused, match=reason):
        verify_proof(KEY.public_key(), token, BOUND, NOW)


REQUESTER_BINDINGS: dict[str, Any] = {
    "answer": lambda instance: Binding.answer("acme", "conv-1", instance, "c1", "Jane of acme"),
    "rollback": lambda instance: Binding.rollback("acme", "conv-1", instance, "call", "c1"),
    "end": lambda instance: Binding.end("acme", "conv-1", instance),
}


@settings(max_examples=60, deadline=None)
@given(
    action=st.sampled_from(sorted(REQUESTER_BINDINGS)),
    issued_for=st.text(min_size=1, max_size=40),
    presented_to=st.text(min_size=1, max_size=40),
)
def test_a_requesters_proof_names_its_conversation_instance(
    action: str, issued_for: str, presented_to: str
) -> None:
    """An answer's, a rollback's or an end's proof counts only in the instance it was issued for:
    a keyed conversation's next instance under the same workflow id does not take it (issue 26)."""
    make = REQUESTER_BINDINGS[action]
    token = mint_proof(KEY, "alice", make(issued_for), NOW)
    if issued_for == presented_to:
        verify_proof(KEY.public_key(), token, make(presented_to), NOW)
        return
    with pytest.raises(ProofRefused, match="another conversation instance"):
        verify_proof(KEY.public_key(), token, make(presented_to), NOW)


def test_an_expired_proof_is_refused() -> None:
    token = mint_proof(KEY, "bob", BOUND, NOW)
    verify_proof(KEY.public_key(), token, BOUND, NOW + PROOF_TTL)  # still within its life
    with pytest.raises(ProofRefused, match="expired"):
        verify_proof(KEY.public_key(), token, BOUND, NOW + PROOF_TTL + timedelta(seconds=10))


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (None, "no proof"),
        ("", "no proof"),
        ("garbage", "invalid proof"),
        ("x" * 5000, "longer than"),
        (mint_proof(Ed25519PrivateKey.generate(), "bob", BOUND, NOW), "invalid proof: Signature"),
        # the inbox's session token (another audience) is no proof
        (issue_session(KEY, Reviewer(tenant_id="acme", user_id="bob"), NOW, "s1"), "invalid proof"),
        # an unsigned token ("alg": "none") with the right claims
        (
            jwt.encode(
                jwt.decode(mint_proof(KEY, "bob", BOUND, NOW), options={"verify_signature": False}),
                key="",
                algorithm="none",
            ),
            "invalid proof",
        ),
    ],
)
def test_forged_proofs_are_refused(token: str | None, reason: str) -> None:
    with pytest.raises(ProofRefused, match=reason):
        verify_proof(KEY.public_key(), token, BOUND, NOW)


def test_a_proof_is_not_a_session() -> None:
    assert read_session(KEY.public_key(), mint_proof(KEY, "bob", BOUND, NOW)) is None
    session = issue_session(KEY, Reviewer(tenant_id="acme", user_id="bob"), datetime.now(UTC), "s1")
    claims = read_session(KEY.public_key(), session)
    assert claims is not None
    assert (claims.reviewer, claims.session_id) == (Reviewer(tenant_id="acme", user_id="bob"), "s1")


def test_the_embedded_stack_key_pair_is_made_once(tmp_path: Path) -> None:
    signing = load_private_key(None, tmp_path)
    verifying = load_public_key(None, tmp_path)
    assert load_private_key(None, tmp_path).private_bytes_raw() == signing.private_bytes_raw()
    token = mint_proof(signing, "bob", BOUND, NOW)
    assert verify_proof(verifying, token, BOUND, NOW).sub == "bob"
    assert (tmp_path / "proof-keys" / "private.pem").stat().st_mode & 0o077 == 0
