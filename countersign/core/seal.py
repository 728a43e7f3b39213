"""Sealing the state a conversation carries across continue-as-new (pure).

The workflow computes `digest(carried)` (SHA-256 of its canonical JSON: deterministic, no I/O); an
activity MACs it with the worker's secret before continue-as-new, bound to whose conversation it is
(tenant, user, agent), the workflow id, the conversation instance (the first run's id, the same
across continue-as-new) and the run that sealed it (the activity's own workflow run id, never the
workflow's input); the next run's first activity checks the MAC against the run Temporal says it
continued from (`continued_run_id`) and spends the seal (`spent_seals`: a seal counts for one run).
A client that starts a conversation with `carried` set cannot produce a valid seal, so invented
state (a saga, usage, messages, call ids) is refused; nor can it reuse a real one: under another
tenant, user or agent, under a new instance started with the same workflow id, or a second time.
Binding the sealing run makes every seal distinct: a conversation that continues as new twice with
nothing changed (refused inputs change no state) carries the same state twice, under two seals.
Generic over CarriedState: whatever it holds is sealed whole.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from pydantic import BaseModel

from countersign.core.conversation_ref import ConversationRef

SEAL_VERSION = "countersign-carried-v3"
# Seals made before they named the sealing run: a conversation an earlier build sealed still
# continues (once: its seal is spent like any other).
UNBOUND_SEAL_VERSION = "countersign-carried-v2"


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
    # The run this one continued from, as Temporal says (`continued_run_id`; "" for a run a client
    # started): the carried state must have been sealed by it.
    continued_from: str = ""


def digest(state: BaseModel) -> str:
    """The state's canonical digest. Fields at their defaults are left out, so a field a later build
    adds (with a default) does not change the digest of state an earlier build sealed: a
    conversation continuing onto a new build still verifies."""
    dumped = state.model_dump(mode="json", exclude_defaults=True)
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "replace")).hexdigest()


def mac(key: bytes, request: SealRequest, sealed_by: str) -> str:
    """The seal of `request` made by run `sealed_by`."""
    return _mac(key, (SEAL_VERSION, *_bound(request), sealed_by))


def _bound(request: SealRequest) -> tuple[str, ...]:
    return (
        request.tenant_id,
        request.user_id,
        request.agent,
        request.workflow_id,
        request.conversation_id,
        request.digest,
    )


def _mac(key: bytes, fields: tuple[str, ...]) -> str:
    return hmac.new(key, "\n".join(fields).encode("utf-8", "replace"), hashlib.sha256).hexdigest()


def verify(key: bytes, check: SealCheck) -> str:
    """ "" when `check.seal` is the MAC this deployment made for exactly this conversation (tenant,
    user, agent, workflow id, instance) and state, in the run this one continued from (or, made by
    an earlier build, in any run of it), else why not. Spending it is the database's part."""
    if not check.seal:
        return "carried state without a seal: only the conversation itself may carry state"
    if check.conversation_id != check.run_instance:
        return (
            f"carried state of conversation instance {check.conversation_id!r} presented to instance "
            f"{check.run_instance!r}: a conversation started again under a workflow id inherits nothing"
        )
    made = (mac(key, check, check.continued_from), _mac(key, (UNBOUND_SEAL_VERSION, *_bound(check))))
    if not any(hmac.compare_digest(check.seal, m) for m in made):
        return (
            "carried state whose seal does not verify (forged, altered, or sealed for another tenant, "
            "user, agent, workflow, conversation instance or run)"
        )
    return ""
