"""The payloads that address a conversation carry one `ConversationRef`, and their JSON did not change.

Each of these is recorded in workflow histories (activity inputs, the rollback workflow's input) or
checked by a proof: the keys and which of them are required are pinned here as they were before they
shared the type, so a history recorded earlier still decodes and a payload an older worker reads
still has every key it expects.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from countersign.core.approvals import (
    ApprovalNotice,
    ApprovalReminder,
    Decision,
    DecisionRecord,
    PendingCall,
    RecordedApproval,
)
from countersign.core.authority import ProofRequest
from countersign.core.conversation_ref import ConversationRef
from countersign.core.envelopes import AppendMessages, SummaryRequest
from countersign.core.messages import StoredInput
from countersign.core.saga import RollbackAuthorization, RollbackRequest
from countersign.core.seal import ConversationInstance, SealCheck, SealRequest
from countersign.identity.proofs import Binding

A = "conversation_id tenant_id workflow_id"  # the address
T = "tenant_id workflow_id"  # what of it was required (before instances, no conversation_id)
# payload: (its keys, the required ones), as they were before they shared ConversationRef
PAYLOADS: dict[type[BaseModel], tuple[str, str]] = {
    PendingCall: (f"{A} call_id nonce risk tool", f"{A} call_id nonce risk tool"),
    # voided_by: asked again after its effect changed (issue 34), added with a default; quorum: a
    # policy's @approvals (issue 35), added with a default
    RecordedApproval: (
        f"{A} agent args call_id description expires_at hints nonce parameters quorum requested_at"
        " requested_by risk tool voided_by",
        f"{A} agent args call_id expires_at nonce requested_at requested_by risk tool",
    ),
    # approved_by, quorum: a policy's quorum so far (issue 35), added with defaults
    DecisionRecord: (
        f"{A} approved_by args decision mcp_spec nonce quorum refusal requested_by risk tool",
        f"{T} decision requested_by risk tool",
    ),
    ApprovalReminder: (
        f"{A} args call_id expires_at tool",
        f"{T} args call_id expires_at tool",
    ),
    ApprovalNotice: (
        f"{A} args call_id expires_at kind requested_by risk tool",
        f"{T} args call_id expires_at kind requested_by risk tool",
    ),
    RollbackAuthorization: (
        f"{A} conversation_user request",
        f"{T} conversation_user request",
    ),
    ProofRequest: (
        f"{A} action actor agent call_id content message_id proof text tool",
        f"{T} action actor",
    ),
    StoredInput: (
        f"{A} call_seq direct mcp_tools reply_seq seqs tool_names",
        f"{T} reply_seq seqs",
    ),
    AppendMessages: (f"{A} messages", f"{T} messages"),
    SummaryRequest: (f"{A} agent previous seq seqs", f"{T} previous seq seqs"),
    ConversationInstance: (f"{A} agent user_id", f"{A} agent user_id"),
    SealRequest: (f"{A} agent digest user_id", f"{A} agent digest user_id"),
    # effect_sha256: what the reviewer saw (issue 34), grant: the grant the decision makes (issue 35),
    # both added with a default after the address was shared
    Binding: (
        f"{A} action args_sha256 effect_sha256 grant nonce risk target tool",
        f"{T} action args_sha256 target",
    ),
    # continued_from: the run that sealed it (issue 40), added with a default after the address was shared
    SealCheck: (
        f"{A} agent continued_from digest run_instance seal user_id",
        f"{A} agent digest run_instance seal user_id",
    ),
}


@pytest.mark.parametrize("payload", list(PAYLOADS), ids=lambda payload: payload.__name__)
def test_an_addressed_payload_keeps_its_keys(payload: type[BaseModel]) -> None:
    keys, required = PAYLOADS[payload]
    assert issubclass(payload, ConversationRef)
    fields = payload.model_fields
    assert sorted(fields) == sorted(keys.split())
    assert sorted(k for k, f in fields.items() if f.is_required()) == sorted(required.split())


def test_a_payload_at_an_address_takes_only_the_address() -> None:
    instance = ConversationInstance(
        tenant_id="acme", workflow_id="wf-1", conversation_id="run-1", user_id="alice", agent="sales"
    )
    request = RollbackRequest(requested_by="alice")
    auth = RollbackAuthorization.at(instance, conversation_user="alice", request=request)
    assert auth.model_dump() == {
        "tenant_id": "acme",
        "workflow_id": "wf-1",
        "conversation_id": "run-1",
        "conversation_user": "alice",
        "request": request.model_dump(),
    }
    assert ConversationRef.at(auth) == ConversationRef(
        tenant_id="acme", workflow_id="wf-1", conversation_id="run-1"
    )


def test_a_payload_recorded_before_instances_still_decodes() -> None:
    recorded = {
        "tenant_id": "acme",
        "workflow_id": "wf-1",
        "tool": "send_email",
        "risk": "high",
        "requested_by": "alice",
        "decision": Decision(call_id="c1", decision="approve", approver="bob").model_dump(),
    }
    record = DecisionRecord.model_validate(recorded)
    assert record.conversation_id == ""
    assert record.pending_call().conversation_id == ""
    reminder = ApprovalReminder.model_validate_json(
        '{"tenant_id": "acme", "workflow_id": "wf-1", "call_id": "c1", "tool": "t", "args": "{}",'
        f' "expires_at": "{datetime(2026, 1, 1, tzinfo=UTC).isoformat()}"}}'
    )
    assert ConversationRef.at(reminder) == ConversationRef(tenant_id="acme", workflow_id="wf-1")
