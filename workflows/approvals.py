"""ApprovalGate: where a call waits for people, a reviewer's decision or the user's answer.

A call that needs approval waits until a reviewer decides or it expires (reminding reviewers once
before): fail closed, an expired call does not run. Reviewers hear of each request, reminder and
escalation by email or webhook (`notify_approval`), sent in the background so a slow mail server
never delays the conversation. Every decision, however it arrived (signal or update), is checked
and recorded by `record_decision` before it counts. An `ask_human` call waits for the user's answer.
Time spent waiting for people is kept off the turn's wall-clock budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import (
        NOTIFY_APPROVAL,
        RECORD_APPROVAL_REQUEST,
        RECORD_DECISION,
        SEND_APPROVAL_REMINDER,
    )
    from countersign.core.approvals import (
        Approval,
        ApprovalNotice,
        ApprovalReminder,
        Decision,
        DecisionRecord,
        NoticeKind,
        RecordedApproval,
        decision_state_refusal,
    )
    from countersign.core.calls import PolicyDecision, ToolInvocation, ToolResult, ToolSpec
    from countersign.core.contract import PendingQuestion, WaitingTurn
    from countersign.core.grants import Granted
    from countersign.observability.workflow_metrics import record_approval_wait

from workflows.conversation import Conversation
from workflows.options import DELIVERY_RETRY, HEARTBEAT_TIMEOUT, NOTICE_TIMEOUT, bookkeeping, execute

# How long a conversation that ends (or continues as new) waits for notices still being delivered;
# an unreachable mail server or webhook then leaves them queued in the outboxes, for operators.
NOTICE_GRACE = timedelta(seconds=2)
CONTINUING = "the conversation is continuing as new (its approvals carried): send this again in a moment"


class ApprovalGate:
    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.answers: dict[str, str] = {}  # call id -> the user's answer to its question
        self.human_wait_s = 0.0  # time this turn spent waiting for people
        self._deciding: set[str] = set()  # calls whose decision is being recorded
        self._parked: set[str] = set()  # calls in a pure wait for people (no activity in flight)
        self._resumed: set[str] = set()  # approvals carried from the previous run, still pending
        self._waits: list[datetime] = []  # when each wait for people under way started
        self._notices: list[asyncio.Task[None]] = []  # reviewers' notifications still being sent

    # --- approvals ----------------------------------------------------------------------------

    async def approval(
        self,
        invocation: ToolInvocation,
        spec: ToolSpec,
        voided: Approval | None = None,
        quorum: PolicyDecision | None = None,
    ) -> Approval:
        """Ask reviewers to approve `invocation`; answers once it is approved, rejected or expired.
        `voided`: the call's earlier approval, whose effect changed before the call ran: asked again,
        as a new request (a new nonce and deadline) that names who approved the voided one.
        `quorum`: a policy's `@approvals("N")`: approved once N distinct people approved."""
        conversation = self.conversation
        assert conversation.context is not None
        policy, now = conversation.context.approval, workflow.now()
        timeout = timedelta(seconds=policy.timeout_for(spec.risk, conversation.limits.approval_timeout_s))
        if voided is None and invocation.call_id in self._resumed:  # carried: its deadline stays
            self._resumed.discard(invocation.call_id)
            approval = conversation.approvals[invocation.call_id]
        else:
            approval = Approval(
                call_id=invocation.call_id,
                tool=spec.name,
                args=invocation.arguments,
                risk=spec.risk,
                requested_by=conversation.context.user_id,
                requested_at=now,
                expires_at=now + timeout,
                hints=spec.mcp.hints() if spec.mcp else None,
                nonce=str(workflow.uuid4()),
                voided_by=voided.decided_by if voided else None,
                quorum=quorum,
            )
            conversation.approvals[approval.call_id] = approval
            granted = await self._record_request(approval, spec)
            if granted is not None:  # a reviewer's grant covers it: approved unasked, nobody told
                approval.state, approval.decided_by = "approved", granted.approver
                approval.grant_id = granted.grant_id
                return approval
            self._notify(approval, "request")
        await self._wait_for_people(self._await_decision(approval, timedelta(seconds=policy.reminder_lead_s)))
        waited = (workflow.now() - approval.requested_at).total_seconds()
        record_approval_wait(spec.risk, approval.state, waited)
        return approval

    async def _record_request(self, approval: Approval, spec: ToolSpec) -> Granted | None:
        """Write the request where reviewers see it (`approval_requests`), before anyone is told:
        the inbox lists what this worker recorded, never what a query answers. A live grant that
        covers the call is spent there instead (the answer; None in histories from before grants)."""
        conversation = self.conversation
        assert conversation.context is not None
        return await bookkeeping(
            RECORD_APPROVAL_REQUEST,
            RecordedApproval(
                **conversation.pending_call(approval).model_dump(),
                agent=conversation.context.agent.name,
                args=approval.args,
                requested_by=approval.requested_by,
                requested_at=approval.requested_at,
                expires_at=approval.expires_at,
                hints=approval.hints,
                description=spec.description if spec.mcp else None,
                parameters=spec.parameters if spec.mcp else None,
                voided_by=approval.voided_by,
                quorum=approval.quorum,
            ),
            f"record the approval request of {approval.tool} ({approval.call_id})",
        )

    async def _await_decision(self, approval: Approval, reminder_lead: timedelta) -> None:
        """Wait for a decision until expiry, reminding reviewers once before it. Fail closed:
        at expiry the call is marked expired, unless a decision already in flight accepts it."""
        remind_at = approval.expires_at - reminder_lead
        if remind_at > workflow.now() and not await self._decided_by(remind_at, approval, "reminder"):
            await bookkeeping(
                SEND_APPROVAL_REMINDER,
                ApprovalReminder.at(
                    self.conversation.ref(),
                    call_id=approval.call_id,
                    tool=approval.tool,
                    args=approval.args,
                    expires_at=approval.expires_at,
                ),
                f"remind reviewers: {approval.tool} ({approval.call_id}) expires soon",
                local=False,
            )
            self._notify(approval, "reminder")
        if not await self._decided_by(approval.expires_at, approval, "expires"):
            await workflow.wait_condition(lambda: approval.call_id not in self._deciding)
            if approval.state == "pending":
                approval.state = "expired"
                self._notify(approval, "escalation")

    async def _decided_by(self, moment: datetime, approval: Approval, label: str) -> bool:
        self._parked.add(approval.call_id)
        try:
            await workflow.wait_condition(
                lambda: approval.state != "pending",
                timeout=max(moment - workflow.now(), timedelta(0)),
                timeout_summary=f"approval {approval.call_id} ({approval.tool}) {label}",
            )
        except TimeoutError:
            return False
        finally:
            self._parked.discard(approval.call_id)
        return True

    async def decide(self, decision: Decision) -> Approval:
        """Apply one decision, whichever way it arrived. Refusals raise and are audited too."""
        # one decision at a time per call: a second waits for the first, then meets its outcome
        await workflow.wait_condition(lambda: decision.call_id not in self._deciding)
        conversation = self.conversation
        approval = conversation.approvals.get(decision.call_id)
        refusal = decision_state_refusal(approval, decision, workflow.now())
        if refusal is None and conversation.continuing:  # its approval is being carried, sealed
            refusal = CONTINUING
        if approval is not None and refusal is None:
            self._deciding.add(decision.call_id)
        try:
            verdict = await bookkeeping(
                RECORD_DECISION,
                DecisionRecord.at(
                    conversation.ref(),
                    tool=approval.tool if approval else "?",
                    risk=approval.risk if approval else "high",
                    requested_by=approval.requested_by if approval else conversation.start.user_id,
                    decision=decision,
                    refusal=refusal,
                    args=approval.args if approval else None,
                    mcp_spec=conversation.mcp_spec(approval.tool) if approval else None,
                    nonce=approval.nonce if approval else "",
                    quorum=approval.quorum if approval else None,
                    approved_by=list(approval.approvals) if approval else [],
                ),
                f"{decision.decision} {decision.call_id} by {decision.approver}",
            )
        finally:
            self._deciding.discard(decision.call_id)
        if not verdict.accepted or approval is None:
            raise ApplicationError(
                f"decision refused: {verdict.reason}", type="DecisionRefused", non_retryable=True
            )
        approver = decision.approver
        if approval.quorum is not None and decision.decision == "approve":
            # those that count now (earlier approvers no longer active or entitled dropped); histories
            # from before that answer carry none: this approval is added to the earlier ones
            approval.approvals = (
                verdict.approvals
                if verdict.approvals is not None
                else [*approval.approvals, decision.approver]
            )
            # the reason of each approver who counts, which everything that shows the quorum says
            # beside their name: a dropped approver's goes with them (at most N, each bounded)
            said = {**approval.reasons, decision.approver: decision.reason}
            approval.reasons = {a: said.get(a) for a in approval.approvals}
            if len(approval.approvals) < approval.approvals_required:  # "1 of 2: bob approved": still pending
                return approval
            approver = ", ".join(approval.approvals)
        approval.state = "approved" if decision.decision == "approve" else "rejected"
        approval.decided_by, approval.reason, approval.edited_args, approval.edit_changes = (
            approver,
            decision.reason,
            verdict.args,
            verdict.changes,
        )
        return approval

    # --- reviewers' notices ---------------------------------------------------------------------

    def _notify(self, approval: Approval, kind: NoticeKind) -> None:
        """Tell reviewers (email, webhook) in the background: a slow mail server never delays the
        approval. Sent before the conversation ends or continues as new (`notices_sent`)."""
        notice = ApprovalNotice.at(
            self.conversation.ref(),
            kind=kind,
            call_id=approval.call_id,
            tool=approval.tool,
            args=approval.args,
            risk=approval.risk,
            requested_by=approval.requested_by,
            expires_at=approval.expires_at,
        )

        async def send() -> None:
            try:
                await execute(
                    NOTIFY_APPROVAL,
                    notice,
                    start_to_close_timeout=NOTICE_TIMEOUT,
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                    retry_policy=DELIVERY_RETRY,
                    summary=f"notify reviewers: {kind} {approval.tool} ({approval.call_id})",
                )
            except ActivityError as err:  # stays queued in the outboxes, visible to operators
                workflow.logger.error(
                    "%s notice of %s not delivered: %s", kind, approval.call_id, err.cause or err
                )

        self._notices.append(asyncio.create_task(send()))

    async def notices_sent(self) -> None:
        """Wait (up to NOTICE_GRACE) for the notices still being delivered."""
        if not self._notices:
            return
        try:
            await workflow.wait_condition(
                lambda: all(task.done() for task in self._notices),
                timeout=NOTICE_GRACE,
                timeout_summary="notices still being delivered",
            )
        except TimeoutError:
            workflow.logger.warning("ended with reviewers' notices still queued in the outboxes")

    # --- questions (`ask_human`) ----------------------------------------------------------------

    def open_question(self, call_id: str) -> bool:
        return call_id in self.conversation.questions and call_id not in self.answers

    async def answer_to(self, call_id: str, question: str) -> ToolResult:
        """Ask the user `question`; their answer, or EXPIRED when none came before answer_timeout_s
        (a question carried from the previous run keeps its deadline)."""
        questions = self.conversation.questions
        now = workflow.now()
        if call_id in questions:  # carried (`restore`): its deadline is the sealed one
            expires = datetime.fromisoformat(questions[call_id].expires_at)
        else:
            expires = now + timedelta(seconds=self.conversation.limits.answer_timeout_s)
            questions[call_id] = PendingQuestion(
                call_id=call_id, question=question, asked_at=now.isoformat(), expires_at=expires.isoformat()
            )

        async def answered() -> None:
            self._parked.add(call_id)
            try:
                await workflow.wait_condition(
                    lambda: call_id in self.answers,
                    timeout=max(expires - workflow.now(), timedelta(0)),
                    timeout_summary=f"question {call_id} expires",
                )
            except TimeoutError:
                pass
            finally:
                self._parked.discard(call_id)
                del questions[call_id]

        await self._wait_for_people(answered())
        if call_id not in self.answers:
            return ToolResult.failure("EXPIRED", f"the user did not answer before {expires.isoformat()}")
        return ToolResult.success({"answer": self.answers[call_id]})

    # --- continuing as new while people decide ------------------------------------------------

    def parked(self) -> set[str]:
        """The calls that only wait for people now: nothing of theirs is in flight or just decided."""
        approvals, questions = self.conversation.approvals, self.conversation.questions
        return {
            c
            for c in self._parked
            if c not in self._deciding
            and (
                (c in approvals and approvals[c].state == "pending")
                or (c in questions and c not in self.answers)
            )
        }

    def waiting_on(self, call_ids: set[str]) -> dict[str, Any]:
        """What the next run needs to wait for `call_ids` again: their approvals and questions."""
        approvals, questions = self.conversation.approvals, self.conversation.questions
        return {
            "approvals": [approvals[c] for c in sorted(call_ids) if c in approvals],
            "questions": [questions[c] for c in sorted(call_ids) if c in questions],
        }

    def restore(self, waiting: WaitingTurn) -> None:
        """Take over the approvals and questions the previous run carried (sealed, verified)."""
        for approval in waiting.approvals:
            self.conversation.approvals[approval.call_id] = approval
            self._resumed.add(approval.call_id)
        for question in waiting.questions:
            self.conversation.questions[question.call_id] = question
        self.human_wait_s = waiting.human_wait_s

    # --- the wait itself --------------------------------------------------------------------------

    async def _wait_for_people(self, waiting: Awaitable[None]) -> None:
        """Await a human, with the wait kept off the turn's wall-clock budget and shown in state."""
        started = workflow.now()
        self._waits.append(started)
        self.conversation.refresh_state()
        # Not a `finally`: when a worker evicts the conversation from its cache, the coroutine is
        # closed (GeneratorExit), and no workflow call may run then.
        try:
            await waiting
        except (Exception, asyncio.CancelledError):
            self._waited_since(started)
            raise
        self._waited_since(started)

    def waited_s(self) -> float:
        """The turn's time waiting for people so far, the waits under way included."""
        now = workflow.now()
        return self.human_wait_s + sum((now - started).total_seconds() for started in self._waits)

    def _waited_since(self, started: datetime) -> None:
        self._waits.remove(started)
        self.human_wait_s += (workflow.now() - started).total_seconds()
        self.conversation.refresh_state()
