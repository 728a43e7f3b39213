"""Sealing the state a conversation carries across continue-as-new (pure).

The workflow computes `digest(carried)` (SHA-256 of its canonical JSON: deterministic, no I/O); an
activity MACs it with the worker's secret, bound to the workflow id, before continue-as-new; the
next run's first activity checks the MAC. A client that starts a conversation with `carried` set
cannot produce a valid seal, so invented state (a saga, usage, messages, call ids) is refused.
Generic over CarriedState: whatever it holds is sealed whole.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from pydantic import BaseModel


class SealRequest(BaseModel):
    workflow_id: str
    digest: str


class SealCheck(BaseModel):
    tenant_id: str
    user_id: str
    workflow_id: str
    digest: str
    seal: str | None


def digest(state: BaseModel) -> str:
    canonical = json.dumps(state.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "replace")).hexdigest()


def mac(key: bytes, workflow_id: str, state_digest: str) -> str:
    message = f"countersign-carried-v1\n{workflow_id}\n{state_digest}".encode("utf-8", "replace")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def verify(key: bytes, check: SealCheck) -> str:
    """ "" when `check.seal` is the MAC of this workflow id and digest, else why not."""
    if not check.seal:
        return "carried state without a seal: only the conversation itself may carry state"
    if not hmac.compare_digest(check.seal, mac(key, check.workflow_id, check.digest)):
        return "carried state whose seal does not verify (forged, altered, or from another workflow)"
    return ""
