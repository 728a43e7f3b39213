"""Deciding a waiting call (countersign.core.approvals), as plain functions: what the conversation's
own state refuses, who may decide a call of each risk (four-eyes for high risk), and the shapes a
decision takes on its way (signals, the decision record, what reviewers see)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from countersign.core.approvals import (
    APPROVER_ROLES,
    FOUR_EYES,
    Approval,
    ApproveSignal,
    Decision,
    DecisionKind,
    DecisionRecord,
    RejectSignal,
    approver_refusal,
    decision_note,
    decision_state_refusal,
    quorum_line,
    quorum_outcome,
    quorum_refusal,
)
from countersign.core.calls import McpTool, PolicyDecision, Risk, ToolSpec
from countersign.core.contract import PendingApproval
from countersign.db.quorum import Approvals

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
RISKS: tuple[Risk, ...] = ("low", "medium", "high")


def waiting(**changes: object) -> Approval:
    approval = Approval(
        call_id="c1",
        tool="update_lead_status",
        args='{"lead": "jane.doe@example.com"}',
        risk="high",
        requested_by="alice",
        requested_at=NOW - timedelta(hours=1),
        expires_at=NOW + timedelta(hours=23),
        nonce="n-1",
    )
    return approval.model_copy(update=changes)


def decision(kind: DecisionKind = "approve", **changes: object) -> Decision:
    return Decision(call_id="c1", decision=kind, approver="bob").model_copy(update=changes)


# --- what the conversation's own state refuses ---------------------------------------------------


def test_a_pending_call_before_its_deadline_may_be_decided_either_way() -> None:
    assert decision_state_refusal(waiting(), decision("approve"), NOW) is None
    assert decision_state_refusal(waiting(), decision("reject"), NOW) is None
    assert decision_state_refusal(waiting(), decision("approve", args={"lead": "x"}), NOW) is None


def test_an_unknown_call_is_refused() -> None:
    assert decision_state_refusal(None, decision(call_id="c9"), NOW) == (
        "unknown call id 'c9': no approval was requested for it"
    )


@pytest.mark.parametrize("state", ["approved", "rejected", "expired"])
def test_a_decided_call_is_not_decided_again(state: str) -> None:
    assert decision_state_refusal(waiting(state=state, decided_by="carol"), decision(), NOW) == (
        f"call c1 was already {state} by carol"
    )
    assert decision_state_refusal(waiting(state=state), decision(), NOW) == f"call c1 was already {state}"


def test_the_deadline_itself_is_too_late() -> None:
    deadline = NOW + timedelta(hours=23)
    assert decision_state_refusal(waiting(), decision(), deadline - timedelta(microseconds=1)) is None
    assert (
        decision_state_refusal(waiting(), decision(), deadline)
        == f"call c1 expired at {deadline.isoformat()}"
    )


def test_edited_arguments_come_only_with_an_approval() -> None:
    assert decision_state_refusal(waiting(), decision("reject", args={"lead": "x"}), NOW) == (
        "edited arguments come only with an approval"
    )


def test_the_first_reason_wins_a_decided_call_past_its_deadline_says_it_was_decided() -> None:
    late = NOW + timedelta(days=2)
    refusal = decision_state_refusal(
        waiting(state="approved", decided_by="carol"), decision("reject", args={}), late
    )
    assert refusal == "call c1 was already approved by carol"


# --- who may decide --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "risk", "approver", "roles", "refusal"),
    [
        ("approve", "low", "dave", ["sales"], None),
        ("approve", "low", "alice", ["sales"], None),  # four-eyes is for high risk only
        (
            "approve",
            "medium",
            "dave",
            ["sales"],
            "dave may not decide medium-risk calls (needs one of: admin, reviewer)",
        ),
        ("approve", "medium", "alice", ["reviewer"], None),
        ("approve", "high", "bob", ["reviewer"], None),
        ("approve", "high", "carol", ["admin"], None),
        (
            "approve",
            "high",
            "alice",
            ["sales"],
            "alice may not decide high-risk calls (needs one of: admin, reviewer)",
        ),
        (
            "approve",
            "high",
            "alice",
            ["admin", "reviewer"],
            "alice requested this high-risk call and may not approve it (four-eyes rule)",
        ),
        ("reject", "high", "alice", ["sales"], None),  # withdrawing one's own call is always safe
        (
            "reject",
            "high",
            "dave",
            ["sales"],
            "dave may not decide high-risk calls (needs one of: admin, reviewer)",
        ),
        ("reject", "high", "alice", None, "'alice' is not a user of this tenant"),
        ("approve", "low", "eve", None, "'eve' is not a user of this tenant"),
        (
            "approve",
            "low",
            "eve",
            [],
            "eve may not decide low-risk calls (needs one of: admin, reviewer, sales)",
        ),
    ],
)
def test_who_may_decide(
    kind: DecisionKind, risk: Risk, approver: str, roles: list[str] | None, refusal: str | None
) -> None:
    assert approver_refusal(kind, risk, "alice", approver, roles) == refusal


@given(
    kind=st.sampled_from(["approve", "reject"]),
    risk=st.sampled_from(RISKS),
    requester=st.sampled_from(["alice", "bob"]),
    approver=st.sampled_from(["alice", "bob", "carol"]),
    roles=st.none() | st.lists(st.sampled_from(["sales", "reviewer", "admin", "Admin", "owner", "approver"])),
)
def test_a_decision_is_allowed_exactly_by_the_policy_table(
    kind: DecisionKind, risk: Risk, requester: str, approver: str, roles: list[str] | None
) -> None:
    """Fail closed: nothing but a known role for the risk (or withdrawing one's own call) allows, and
    nobody approves their own high-risk call whatever roles they hold."""
    allowed = approver_refusal(kind, risk, requester, approver, roles) is None
    if roles is None:
        expected = False
    elif kind == "reject" and approver == requester:
        expected = True
    else:
        expected = bool(APPROVER_ROLES[risk] & set(roles)) and not (
            risk in FOUR_EYES and approver == requester
        )
    assert allowed == expected


def test_only_high_risk_needs_four_eyes_and_sales_decides_only_low_risk() -> None:
    assert FOUR_EYES == {"high"}
    assert [risk for risk in RISKS if "sales" in APPROVER_ROLES[risk]] == ["low"]


# --- the shapes a decision takes -------------------------------------------------------------------


def test_the_signals_become_the_decision_they_stand_for() -> None:
    approve = ApproveSignal(call_id="c1", approver="bob", reason="ok", args={"lead": "x"}, proof="a.b.c")
    assert approve.decision() == Decision(
        call_id="c1", decision="approve", approver="bob", reason="ok", args={"lead": "x"}, proof="a.b.c"
    )
    reject = RejectSignal(call_id="c1", approver="bob", reason="no")
    assert reject.decision() == Decision(call_id="c1", decision="reject", approver="bob", reason="no")


@pytest.mark.parametrize(
    "payload",
    [
        {"call_id": "", "decision": "approve", "approver": "bob"},
        {"call_id": "c1", "decision": "approve", "approver": "bob\nadmin"},
        {"call_id": "c1", "decision": "approve", "approver": "b" * 201},
        {"call_id": "c1", "decision": "maybe", "approver": "bob"},
        {"call_id": "c1", "decision": "approve", "approver": "bob", "args": {"to": "a\x00"}},
    ],
)
def test_a_decision_out_of_bounds_is_refused_not_altered(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Decision.model_validate(payload)


def test_a_long_reason_is_cut_with_a_marker_not_refused() -> None:
    reason = Decision(call_id="c1", decision="reject", approver="bob", reason="x" * 5_000).reason
    assert reason is not None and len(reason) <= 2_000 and reason.endswith("-character limit]")


def test_the_call_a_proof_must_name_is_the_pending_one_of_this_instance() -> None:
    record = DecisionRecord(
        tenant_id="acme",
        workflow_id="conv-1",
        conversation_id="run-1",
        tool="update_lead_status",
        risk="high",
        requested_by="alice",
        decision=decision(call_id="c7"),
        nonce="n-7",
    )
    call = record.pending_call()
    assert (call.tenant_id, call.workflow_id, call.conversation_id) == ("acme", "conv-1", "run-1")
    assert (call.call_id, call.tool, call.risk, call.nonce) == ("c7", "update_lead_status", "high", "n-7")


def test_reviewers_see_times_as_text_and_an_mcp_tools_own_description_and_schema() -> None:
    view = PendingApproval.of(waiting(hints="MCP server web says (unverified): read-only"))
    assert view.requested_at == (NOW - timedelta(hours=1)).isoformat()
    assert view.expires_at == (NOW + timedelta(hours=23)).isoformat()
    assert (view.description, view.parameters, view.hints) == (
        None,
        None,
        "MCP server web says (unverified): read-only",
    )
    spec = ToolSpec(
        name="mcp__web__fetch",
        description="Fetch a page",
        parameters={"type": "object", "properties": {"url": {"type": "string"}}},
        risk="medium",
        category="external",
        tier="needs_approval",
        mcp=McpTool(server="web", tool="fetch", fingerprint="f"),
    )
    shown = PendingApproval.of(waiting(), spec)
    assert (shown.description, shown.parameters) == (spec.description, spec.parameters)


def test_a_decision_note_says_who_decided_what_they_changed_and_why() -> None:
    """What the requester reads of a decision (issue 41): the reason, and an edit from what to what
    (as `approval_decisions.changes` stores it), in the words the model reads with the result."""
    assert decision_note("bob", "approve", "ok", None) == "bob approved it (reason: ok)"
    assert decision_note("bob", "reject", None, {}) == "bob rejected it (no reason given)"
    changes = {"new_status": {"before": "qualified", "after": "contacted"}}
    assert decision_note("bob", "approve", "only contacted", changes) == (
        'bob changed new_status from "qualified" to "contacted" before approving (reason: only contacted)'
    )


# --- a policy's quorum (@approvals("N"), @approvers("role,…")) -----------------------------------


def quorum(n: int, roles: tuple[str, ...] = ()) -> PolicyDecision:
    return PolicyDecision(outcome="permit_approvals", policy="q", approvals=n, approvers=list(roles))


people = st.sampled_from(["alice", "bob", "carol", "dave", "erin"])


@given(requester=people, approvers=st.lists(people, max_size=8), n=st.integers(1, 5))
def test_the_requester_never_counts_and_nobody_counts_twice(
    requester: str, approvers: list[str], n: int
) -> None:
    """Whatever order people approve in, the approvals that count are distinct and never the requester's."""
    counted: list[str] = []
    for approver in approvers:
        decision = Decision(call_id="c1", decision="approve", approver=approver)
        if quorum_refusal(quorum(n), decision, requester, counted, ["reviewer"]) is None:
            counted.append(approver)
    assert requester not in counted
    assert len(counted) == len(set(counted))


def test_a_quorum_narrows_who_approves_and_is_approved_as_asked() -> None:
    by_bob = Decision(call_id="c1", decision="approve", approver="bob")
    assert quorum_refusal(quorum(2, ("admin",)), by_bob, "alice", [], ["reviewer"]) == (
        "policy q needs approvers with one of the roles: admin"
    )
    assert quorum_refusal(quorum(2, ("admin", "reviewer")), by_bob, "alice", [], ["reviewer"]) is None
    edited = Decision(call_id="c1", decision="approve", approver="bob", args={"x": 1})
    assert "approved as asked" in (quorum_refusal(quorum(2), edited, "alice", [], ["reviewer"]) or "")
    rejection = Decision(call_id="c1", decision="reject", approver="alice")
    assert quorum_refusal(quorum(2, ("admin",)), rejection, "alice", ["alice"], []) is None


def test_a_quorums_card_says_how_far_it_is() -> None:
    approval = Approval(
        call_id="c1", tool="t", args="{}", risk="high", requested_by="alice", requested_at=NOW,
        expires_at=NOW + timedelta(hours=1), quorum=quorum(2), approvals=["bob"],
    )  # fmt: skip
    assert (approval.approvals_required, approval.progress()) == (2, "1 of 2 approved (bob)")
    single = approval.model_copy(update={"quorum": None, "approvals": []})
    assert (single.approvals_required, single.progress()) == (1, "")


def test_a_quorums_first_approval_reads_as_how_far_it_is_never_by_none() -> None:
    """Issue 50 item 5: after the first of two approvals, the decide answer (CLI `approve`, the
    inbox's notice) says who approved and how many are still needed."""
    first = Approval(
        call_id="c1", tool="t", args="{}", risk="high", requested_by="alice", requested_at=NOW,
        expires_at=NOW + timedelta(hours=1), quorum=quorum(2), approvals=["bob"],
    )  # fmt: skip
    assert first.outcome() == "1 of 2 approved (bob); 1 more approval needed"
    done = first.model_copy(
        update={"state": "approved", "decided_by": "carol", "approvals": ["bob", "carol"]}
    )
    assert done.outcome() == "approved by carol"


def test_a_quorums_line_gives_every_approvers_reason() -> None:
    """Issue 50: who approved so far, each one's reason beside their name, and how many more."""
    reasons = {"bob": "checked the account", "carol": None}
    assert quorum_line(3, ["bob", "carol"], reasons) == "2 of 3 approved (bob: checked the account; carol)"
    assert quorum_outcome(3, ["bob"], reasons) == (
        "1 of 3 approved (bob: checked the account); 2 more approvals needed"
    )
    assert quorum_line(2, ["bob", "carol"]) == "2 of 2 approved (bob, carol)"
    assert quorum_line(1, ["bob"], reasons) == ""


def test_the_decide_answer_of_a_quorum_gives_each_approvers_reason() -> None:
    first = Approval(
        call_id="c1", tool="t", args="{}", risk="high", requested_by="alice", requested_at=NOW,
        expires_at=NOW + timedelta(hours=1), quorum=quorum(3), approvals=["bob", "carol"],
        reasons={"bob": "checked the account", "carol": None},
    )  # fmt: skip
    assert first.outcome() == "2 of 3 approved (bob: checked the account; carol); 1 more approval needed"


def test_the_audit_keeps_every_approvers_reason() -> None:
    both = Approvals(["bob", "carol"], {"bob": "checked the account", "carol": None})
    assert both.reason_text() == "bob: checked the account; carol (no reason given)"
    assert Approvals(["bob"], {"bob": "ok"}).reason_text() == "ok"  # one approver: the reason alone
    assert Approvals().reason_text() is None
