"""Who approved a call so far, and why: read once from `approval_decisions` for every surface that
shows a quorum (the inbox's card, the chat page's step, the CLI's `approvals list`, the reviewers'
notices, the audit), so each says the same approvers with the same reasons."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.approvals import quorum_line, quorum_outcome
from countersign.db.schema import ApprovalDecision, ApprovalRequest

CallKey = tuple[str, str]  # (conversation instance, call id)


@dataclass(frozen=True)
class Approvals:
    """A call's standing approvals: the approvers that count, in order, and each one's reason."""

    approved_by: list[str] = field(default_factory=list)
    reasons: dict[str, str | None] = field(default_factory=dict)

    def line(self, required: int) -> str:
        """ "1 of 2 approved (bob: checked the account)" ("" for one approver)."""
        return quorum_line(required, self.approved_by, self.reasons)

    def outcome(self, required: int) -> str:
        """ "1 of 2 approved (bob: checked the account); 1 more approval needed"."""
        return quorum_outcome(required, self.approved_by, self.reasons)

    def reason_text(self) -> str | None:
        """Every approver's reason, as the audit row of the call keeps it: the reason alone for one
        approver (None without one); "bob: checked it; carol (no reason given)" for several."""
        if len(self.approved_by) < 2:
            return self.reasons.get(self.approved_by[0]) if self.approved_by else None
        return "; ".join(
            f"{a}: {self.reasons[a]}" if self.reasons.get(a) else f"{a} (no reason given)"
            for a in self.approved_by
        )


async def approvals_of(session: AsyncSession, calls: Iterable[CallKey]) -> dict[CallKey, Approvals]:
    """Who approved each of these calls so far (accepted and not voided), in order, with their
    reasons: those that count, as the latest approval recorded them (`counted`: earlier approvers no
    longer active or entitled left out), else each approver in turn. A call nobody approved is
    missing from the answer."""
    keys = list(dict.fromkeys(calls))
    if not keys:
        return {}
    decisions = await session.execute(
        select(
            ApprovalDecision.conversation_id,
            ApprovalDecision.call_id,
            ApprovalDecision.approver,
            ApprovalDecision.reason,
            ApprovalDecision.counted,
        )
        .where(
            tuple_(ApprovalDecision.conversation_id, ApprovalDecision.call_id).in_(keys),
            ApprovalDecision.decision == "approve",
            ApprovalDecision.accepted.is_(True),
            ApprovalDecision.voided_at.is_(None),
        )
        .order_by(ApprovalDecision.id)
    )
    approved: dict[CallKey, list[str]] = {}
    reasons: dict[CallKey, dict[str, str | None]] = {}
    for conversation_id, call_id, approver, reason, counted in decisions:
        key = (conversation_id, call_id)
        before = approved.get(key, [])
        approved[key] = list(counted) if counted is not None else [*before, approver]
        reasons.setdefault(key, {})[approver] = reason
    return {key: Approvals(names, {a: reasons[key].get(a) for a in names}) for key, names in approved.items()}


async def quorum_said(session: AsyncSession, request: ApprovalRequest | None) -> str:
    """A quorum's call as a notice or the CLI says it: how many distinct approvers, who approved
    so far and why, how many more are needed (the inbox's card says the same); "" for a call one
    approver decides."""
    if request is None:
        return ""
    return (await quorums_said(session, [request])).get((request.conversation_id, request.call_id), "")


async def quorums_said(session: AsyncSession, requests: Iterable[ApprovalRequest]) -> dict[CallKey, str]:
    """`quorum_said` of each of these requests that needs two or more approvers, by (conversation,
    call), their approvals read in one query; a call one approver decides is missing."""
    quorums = [r for r in requests if r.approvals_required >= 2]
    standing = await approvals_of(session, [(r.conversation_id, r.call_id) for r in quorums])
    return {
        (r.conversation_id, r.call_id): (
            f"Needs {r.approvals_required} distinct approvers (policy {(r.policy or {}).get('policy')}), "
            "never the requester: "
            + (standing.get((r.conversation_id, r.call_id)) or Approvals()).outcome(r.approvals_required)
        )
        for r in quorums
    }
