"""Sealing the state a conversation carries across continue-as-new (pure).

The workflow computes `digest(carried)` (SHA-256 of its canonical JSON: deterministic, no I/O); an
activity MACs it with the worker's secret before continue-as-new, bound to whose conversation it is
(tenant, user, agent), the workflow id and the conversation instance (the first run's id, the same
across continue-as-new); the next run's first activity checks the MAC and spends the seal
(`spent_seals`: a seal counts for one run). A client that starts a conversation with `carried` set
cannot produce a valid seal, so invented state (a saga, usage, messages, call ids) is refused; nor
can it reuse a real one: under another tenant, user or agent, under a new instance started with the
same workflow id, or a second time.
Generic over CarriedState: whatever it holds is sealed whole.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from pydantic import BaseModel

from countersign.core.conversation_ref import ConversationRef

SEAL_VERSION = "countersign-carried-v2"


class ConversationInstance(ConversationRef):
    """Whose conversation an instance is: recorded by its first run (`conversations`), checked by
    every later one, and bound into every seal."""

    conversation_id: str  # always an instance: a seal binds it
    user_id: str
    agent: str


class SealRequest(ConversationInstance):
    digest: str


class SealCheck(SealRequest):
    seal: str | None
    # The instance this run belongs to (the server's first run id, "" for a conversation from before
    # instances): the carried state must have been sealed for it.
    run_instance: str


def digest(state: BaseModel) -> str:
    """The state's canonical digest. Fields at their defaults are left out, so a field a later build
    adds (with a default) does not change the digest of state an earlier build sealed: a
    conversation continuing onto a new build still verifies."""
    dumped = state.model_dump(mode="json", exclude_defaults=True)
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "replace")).hexdigest()


def mac(key: bytes, request: SealRequest) -> str:
    fields = (
        SEAL_VERSION,
        request.tenant_id,
        request.user_id,
        request.agent,
        request.workflow_id,
        request.conversation_id,
        request.digest,
    )
    return hmac.new(key, "\n".join(fields).encode("utf-8", "replace"), hashlib.sha256).hexdigest()


def verify(key: bytes, check: SealCheck) -> str:
    """ "" when `check.seal` is the MAC this deployment made for exactly this conversation (tenant,
    user, agent, workflow id, instance) and state, else why not. Spending it is the database's part."""
    if not check.seal:
        return "carried state without a seal: only the conversation itself may carry state"
    if check.conversation_id != check.run_instance:
        return (
            f"carried state of conversation instance {check.conversation_id!r} presented to instance "
            f"{check.run_instance!r}: a conversation started again under a workflow id inherits nothing"
        )
    if not hmac.compare_digest(check.seal, mac(key, check)):
        return (
            "carried state whose seal does not verify (forged, altered, or sealed for another tenant, "
            "user, agent, workflow or conversation instance)"
        )
    return ""
