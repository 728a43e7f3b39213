"""Approvals: the state of a call waiting for a human, and the pure rules for deciding it.

Who may decide is a policy table by risk; four-eyes (the requester may not approve their own call)
applies to high risk. Anything the rules cannot confirm is refused: fail closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from countersign.core.authority import ADMIN
from countersign.core.bounds import BoundedJson, Identifier, Proof, Reason
from countersign.core.calls import ApproverEdit, PolicyDecision, Risk, ToolSpec
from countersign.core.conversation_ref import ConversationRef
from countersign.core.effects import FieldChange
from countersign.core.grants import GrantTerms

ApprovalState = Literal["pending", "approved", "rejected", "expired"]
DecisionKind = Literal["approve", "reject"]

# Roles that may decide a call of each risk.
APPROVER_ROLES: dict[Risk, frozenset[str]] = {
    "low": frozenset({"sales", "reviewer", ADMIN}),
    "medium": frozenset({"reviewer", ADMIN}),
    "high": frozenset({"reviewer", ADMIN}),
}
FOUR_EYES: frozenset[Risk] = frozenset({"high"})


def decision_note(approver: str, decision: str, reason: str | None, changes: dict[str, Any] | None) -> str:
    """What the requester is told of an accepted decision (`approval_decisions`: its `changes` as
    stored, {name: {before, after}}): who decided, what they changed of the call (from what to
    what) and why; for an edit, the line the model reads with the call's result."""
    if changes:
        changed = {name: FieldChange.model_validate(change) for name, change in changes.items()}
        return ApproverEdit(approver=approver, changes=changed, reason=reason).note()
    verb = "approved" if decision == "approve" else "rejected"
    return f"{approver} {verb} it" + (f" (reason: {reason})" if reason else " (no reason given)")


def approvals_required(quorum: PolicyDecision | None) -> int:
    """A policy's @approvals("N"), or the one approval every other call needs."""
    return quorum.approvals if quorum else 1


Reasons = Mapping[str, str | None]  # each approver's reason, by approver (None: none given)


def quorum_line(required: int, approved_by: list[str], reasons: Reasons | None = None) -> str:
    """ "1 of 2 approved (bob)": a quorum's card line, as everything a person sees says it (CLI,
    inbox, chat page, notices, audit); "" for a call that needs one approver. With `reasons` (each
    approver's, as recorded: countersign.db.quorum), every approver's reason beside their name:
    "2 of 3 approved (bob: checked the account; carol)"."""
    if required < 2:
        return ""
    reasons = reasons or {}
    named = [f"{a}: {reasons[a]}" if reasons.get(a) else a for a in approved_by]
    said = f" ({('; ' if any(reasons.get(a) for a in approved_by) else ', ').join(named)})" if named else ""
    return f"{len(approved_by)} of {required} approved{said}"


def quorum_outcome(required: int, approved_by: list[str], reasons: Reasons | None = None) -> str:
    """A quorum short of its number as a person reads it: who approved so far (and why), and how
    many more are needed: "1 of 2 approved (bob: checked it); 1 more approval needed"."""
    more = required - len(approved_by)
    needed = f"{more} more approval{'s' if more != 1 else ''} needed"
    line = quorum_line(required, approved_by, reasons)
    return f"{line}; {needed}" if line else needed


class Approval(BaseModel):
    call_id: str
    tool: str
    args: str  # the exact arguments the model asked for (JSON text)
    risk: Risk
    requested_by: str
    requested_at: datetime
    expires_at: datetime
    state: ApprovalState = "pending"
    decided_by: str | None = None
    reason: str | None = None
    edited_args: str | None = None  # what the approver changed the arguments to, validated
    edit_changes: dict[str, FieldChange] | None = None  # with edited_args: each argument changed
    hints: str | None = None  # an MCP server's own claims about the tool, for reviewers (never authority)
    # Drawn by the conversation (workflow.uuid4()) for this approval: a decision's proof names it, so
    # a proof is for this request of this call, never for another instance's call of the same id.
    nonce: str = ""
    # Asked again: who approved the earlier request of this call, voided because the call's effect
    # changed between that decision and its execution.
    voided_by: str | None = None
    # Approved unasked: the grant that covered the call (countersign.core.grants), whose approver
    # is `decided_by`.
    grant_id: int | None = None
    # A policy's quorum (`@approvals("N")`, `@approvers("role,…")`): the call runs after N distinct
    # approvals; `approvals` are the approvers so far, in order. None: one approval, as ever.
    quorum: PolicyDecision | None = None
    approvals: list[str] = []
    reasons: dict[str, str | None] = {}  # a quorum's approvers' reasons, by approver

    @property
    def approvals_required(self) -> int:
        """How many distinct approvers the call needs (approval_requests.approvals_required)."""
        return approvals_required(self.quorum)

    def progress(self) -> str:
        return quorum_line(self.approvals_required, self.approvals, self.reasons)

    def outcome(self) -> str:
        """What a decision left, as a person reads it: "approved by bob", or, a quorum's approval
        that is not the last, "1 of 2 approved (bob); 1 more approval needed" (never "by None")."""
        if self.state == "pending":
            return quorum_outcome(self.approvals_required, self.approvals, self.reasons)
        return f"{self.state} by {self.decided_by}" if self.decided_by else self.state


class Decision(BaseModel):
    """The `decide` update's payload; the `approve` / `reject` signals map onto it."""

    call_id: Identifier
    decision: DecisionKind
    approver: Identifier
    reason: Reason | None = None
    args: BoundedJson | None = None  # edited arguments (approve only)
    proof: Proof | None = None  # APPROVER_AUTH=signed: the inbox's proof for exactly this decision
    grant: GrantTerms | None = None  # approve only: the same again, for a while (the proof binds it)


class ApproveSignal(BaseModel):
    call_id: Identifier
    approver: Identifier
    reason: Reason | None = None
    args: BoundedJson | None = None
    proof: Proof | None = None
    grant: GrantTerms | None = None

    def decision(self) -> Decision:
        return Decision(decision="approve", **self.model_dump())


class RejectSignal(BaseModel):
    call_id: Identifier
    approver: Identifier
    reason: Reason | None = None
    proof: Proof | None = None

    def decision(self) -> Decision:
        return Decision(decision="reject", **self.model_dump())


class PendingCall(ConversationRef):
    """A call waiting for a decision, as the worker recorded it (`approval_requests`; the workflow's
    own pending approval): what a decision's proof binds (countersign.identity.proofs.Binding)."""

    conversation_id: str  # always an instance: recorded since instances exist
    call_id: str
    tool: str
    risk: Risk
    nonce: str


class DecisionRecord(ConversationRef):
    """What the decision activity verifies and audits. `refusal` is set when the workflow already
    refused the decision from its own state (unknown call, already decided, expired)."""

    tool: str
    risk: Risk
    requested_by: str
    decision: Decision
    refusal: str | None = None
    args: str | None = None  # the pending call's arguments (JSON text): what an unedited proof binds
    # An MCP tool as the conversation snapshotted it: edited arguments are checked against its schema.
    mcp_spec: ToolSpec | None = None
    nonce: str = ""  # the pending approval's (Approval.nonce)
    quorum: PolicyDecision | None = None  # Approval.quorum
    approved_by: list[str] = []  # the quorum's approvers so far (Approval.approvals)

    def pending_call(self) -> PendingCall:
        """The call as the conversation itself holds it: what the decision's proof must name."""
        return PendingCall.at(
            self, call_id=self.decision.call_id, tool=self.tool, risk=self.risk, nonce=self.nonce
        )


class RecordedApproval(PendingCall):
    """An approval request as the worker writes it to `approval_requests`: what reviewers see."""

    agent: str
    args: str
    requested_by: str
    requested_at: datetime
    expires_at: datetime
    hints: str | None = None
    description: str | None = None  # an MCP tool's, from the conversation's snapshot
    parameters: dict[str, Any] | None = None
    voided_by: str | None = None  # asked again: the approver of the voided earlier request
    quorum: PolicyDecision | None = None  # the policy asking for N approvers

    @property
    def approvals_required(self) -> int:
        return approvals_required(self.quorum)


class Verdict(BaseModel):
    accepted: bool
    reason: str | None = None
    args: str | None = None  # validated edited arguments, as JSON text
    changes: dict[str, FieldChange] | None = None  # with args: each argument, as asked and as approved
    # A quorum's accepted approval: the approvals that count with it, in order (earlier approvers no
    # longer active or entitled dropped); None otherwise, and in histories from before it
    approvals: list[str] | None = None


def decision_state_refusal(approval: Approval | None, decision: Decision, now: datetime) -> str | None:
    """Why the conversation's own state refuses a decision, or None."""
    if approval is None:
        return f"unknown call id {decision.call_id!r}: no approval was requested for it"
    if approval.state != "pending":
        by = f" by {approval.decided_by}" if approval.decided_by else ""
        return f"call {approval.call_id} was already {approval.state}{by}"
    if now >= approval.expires_at:
        return f"call {approval.call_id} expired at {approval.expires_at.isoformat()}"
    if decision.args is not None and decision.decision != "approve":
        return "edited arguments come only with an approval"
    return None


def approver_refusal(
    kind: DecisionKind, risk: Risk, requester: str, approver: str, approver_roles: list[str] | None
) -> str | None:
    """Why `approver` may not decide a call of `risk` requested by `requester`, or None.

    `approver_roles` is None when the approver is not a user of the conversation's tenant. The
    requester may always withdraw (reject) their own call: refusing to act is always safe.
    """
    if approver_roles is None:
        return f"{approver!r} is not a user of this tenant"
    if kind == "reject" and approver == requester:
        return None
    allowed = APPROVER_ROLES[risk]
    if not allowed & set(approver_roles):
        return f"{approver} may not decide {risk}-risk calls (needs one of: {', '.join(sorted(allowed))})"
    if risk in FOUR_EYES and approver == requester:
        return f"{approver} requested this {risk}-risk call and may not approve it (four-eyes rule)"
    return None


def quorum_refusal(
    quorum: PolicyDecision, decision: Decision, requester: str, approved_by: list[str], roles: list[str]
) -> str | None:
    """Why a decision may not count toward a policy's quorum, or None: the requester never counts,
    nobody counts twice, `@approvers` narrows who may, and N people approve one thing (no edits).
    Anyone who may decide may still reject: one rejection ends it."""
    if decision.decision == "reject":
        return None
    named = f"policy {quorum.policy}" if quorum.policy else "the tenant's policy"
    if decision.approver == requester:
        return f"{decision.approver} requested this call and never counts toward its quorum ({named})"
    if decision.approver in approved_by:
        return f"{decision.approver} already approved; {named} needs {quorum.approvals} distinct approvers"
    if quorum.approvers and not set(quorum.approvers) & set(roles):
        return f"{named} needs approvers with one of the roles: {', '.join(quorum.approvers)}"
    if decision.args is not None and quorum.approvals > 1:
        return f"a call {named} has {quorum.approvals} people approve is approved as asked, never edited"
    return None


def edit_policy_refusal(
    judged: PolicyDecision, tool: str, approvals: int, approver_roles: list[str]
) -> str | None:
    """Why the tenant's policies refuse a reviewer's edit (`judged`: their decision on the call with
    the edited arguments), or None. An edit is a new call: a forbid refuses it, naming the policy,
    and so does a permit that would want more approvers than the call has (`approvals`), or
    approvers with roles this one lacks."""
    named = f"the tenant's policy {judged.policy or '(unnamed)'}"
    edited, instead = f"this {tool} call as edited", "approve it as asked or reject it"
    if judged.outcome == "forbid":
        why = f" (its evaluation failed: {judged.error})" if judged.error else ""
        return f"{named} forbids {edited}{why}; {instead}"
    if judged.outcome == "permit_approvals":
        if judged.approvals > approvals:
            return f"{named} has {judged.approvals} people approve {edited}; {instead}"
        if judged.approvers and not set(judged.approvers) & set(approver_roles):
            return f"{named} needs approvers with one of the roles {', '.join(judged.approvers)} for {edited}"
    return None


class ApprovalReminder(ConversationRef):
    call_id: str
    tool: str
    args: str
    expires_at: datetime


NoticeKind = Literal["request", "reminder", "escalation"]


class ApprovalNotice(ConversationRef):
    kind: NoticeKind
    call_id: str
    tool: str
    args: str
    risk: Risk
    requested_by: str
    expires_at: datetime
