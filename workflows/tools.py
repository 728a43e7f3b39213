"""ToolCalls: one batch of the model's tool calls, each screened, checked, approved or asked, and run.

A call the model asks for is never trusted: the pure policy (countersign.core.policy.screen_call)
refuses unknown, blocked and forbidden tools; its arguments are validated by an activity
(`check_arguments`, `check_mcp_arguments`); a call that needs approval waits at the ApprovalGate.
Every call that does not run is audited (`record_unexecuted_call`), and every result, run or
refused, is stored as the tool message at the sequence number allocated for it when the model
asked: workflow history carries only its envelope (`StoredResult`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import (
        CHECK_ARGUMENTS,
        CHECK_MCP_ARGUMENTS,
        EVALUATE_POLICY,
        EXECUTE_MCP_TOOL,
        EXECUTE_TOOL,
        RECORD_UNEXECUTED_CALL,
    )
    from countersign.core.approvals import Approval
    from countersign.core.calls import (
        ApproverEdit,
        CheckedCall,
        McpCall,
        PolicyDecision,
        StoredResult,
        ToolInvocation,
        ToolResult,
        ToolSpec,
        UnexecutedCall,
    )
    from countersign.core.contract import WaitingTurn
    from countersign.core.envelopes import tool_message
    from countersign.core.history import continue_suggested
    from countersign.core.messages import ToolCall
    from countersign.core.policy import PolicyCheck, Screening, forbidden, screen_call

from workflows.approvals import ApprovalGate
from workflows.conversation import Conversation
from workflows.emails import EmailOutbox
from workflows.messages import MessageStore
from workflows.options import (
    DB_OUTAGE_TOLERANCE,
    DB_RETRY,
    HEARTBEAT_TIMEOUT,
    TOOL_CALL_TIMEOUT,
    bookkeeping,
    execute,
    execute_local,
)
from workflows.rules import call_summary, execution_failure


class Parked(Exception):  # not an error: the turn continues in the next run
    """The batch waits for people and the run continues as new, carrying `waiting`."""

    def __init__(self, waiting: WaitingTurn) -> None:
        super().__init__("the turn continues as new while it waits for people")
        self.waiting = waiting


async def _done(result: StoredResult) -> StoredResult:
    return result


class ToolCalls:
    def __init__(
        self,
        conversation: Conversation,
        store: MessageStore,
        gate: ApprovalGate,
        outbox: EmailOutbox,
        unparkable: Callable[[], bool],
    ) -> None:
        self.conversation = conversation
        self.store = store
        self.gate = gate
        self.outbox = outbox
        # what must finish in this run, so the batch may not park: a rollback accepted mid-turn (it
        # runs after the turn and is never carried), a client's served call (workflows/served.py)
        self.unparkable = unparkable

    async def run(self, calls: list[ToolCall], budget: int) -> list[StoredResult]:
        """Run a batch concurrently; results in call order. Calls past `budget` are refused.

        Raises `Parked` when the run must continue as new (its history grew, a flood of signals)
        while every unfinished call waits for people: the next run resumes the batch (`resume`)."""
        # allocated in call order before any call runs: each result is stored where it belongs
        seqs = [self.store.next_seq() for _ in calls]
        batch = WaitingTurn(calls=calls, seqs=seqs, budget=budget, results=[None] * len(calls))
        return await self._gather(
            batch,
            [self._handle(c, i < budget, seq) for i, (c, seq) in enumerate(zip(calls, seqs, strict=True))],
        )

    async def resume(self, batch: WaitingTurn) -> list[StoredResult]:
        """Finish a batch the previous run carried: its calls that waited for people wait again
        (their deadlines unchanged), the finished ones keep their results."""
        self.gate.restore(batch)
        questions = {q.call_id: q for q in batch.questions}
        handling: list[Coroutine[Any, Any, StoredResult]] = []
        for call, seq, result in zip(batch.calls, batch.seqs, batch.results, strict=True):
            invocation = self._invocation(call, seq)
            handling.append(
                _done(result)
                if result is not None
                else self._ask_human(invocation, questions[call.id].question)
                if call.id in questions
                else self._run_after_approval(invocation, self._spec_of(call.name))
            )
        return await self._gather(batch, handling)

    async def _gather(
        self, batch: WaitingTurn, handling: list[Coroutine[Any, Any, StoredResult]]
    ) -> list[StoredResult]:
        tasks = [asyncio.create_task(h) for h in handling]
        while True:
            await workflow.wait_condition(
                lambda: all(t.done() for t in tasks) or self._parkable(batch, tasks)
            )
            if all(t.done() for t in tasks):
                return [t.result() for t in tasks]
            # settle what is in flight (handlers, notices), then look again: a decision may have landed
            self.conversation.continuing = True
            await self.conversation.handlers_settled()
            await self.gate.notices_sent()
            if self._parkable(batch, tasks):
                raise Parked(self._waiting(batch, tasks))
            self.conversation.continuing = False

    def _parkable(self, batch: WaitingTurn, tasks: list[asyncio.Task[StoredResult]]) -> bool:
        """Whether the run should, and can, continue as new mid-batch: its history is past the
        budget, and every unfinished call only waits for people (no activity of it in flight)."""
        unfinished = {c.id for c, t in zip(batch.calls, tasks, strict=True) if not t.done()}
        return (
            continue_suggested(workflow.info())
            and unfinished <= self.gate.parked()
            and self.conversation.authorizing == 0
            and not self.unparkable()
        )

    def _waiting(self, batch: WaitingTurn, tasks: list[asyncio.Task[StoredResult]]) -> WaitingTurn:
        waiting = {c.id for c, t in zip(batch.calls, tasks, strict=True) if not t.done()}
        return batch.model_copy(
            update={
                "results": [t.result() if t.done() else None for t in tasks],
                **self.gate.waiting_on(waiting),
            }
        )

    def _spec_of(self, tool: str) -> ToolSpec:
        spec = self.conversation.spec(tool)
        assert spec is not None  # it was screened and waited for approval in the previous run
        return spec

    async def one(self, call: ToolCall) -> StoredResult:
        """A call a client asked for directly (workflows/served.py): the same path as a model's
        call, as a batch of one within no turn's budget; its result stored at the next seq."""
        return await self._handle(call, True, self.store.next_seq())

    async def _handle(self, call: ToolCall, within_budget: bool, seq: int) -> StoredResult:
        """Screen, check, approve or ask, and run one call; `seq`: where its result is stored."""
        conversation = self.conversation
        assert conversation.context is not None
        invocation = self._invocation(call, seq)
        if not within_budget:
            limit = ToolResult.failure(
                "LIMIT_REACHED", f"max_tool_calls ({conversation.limits.max_tool_calls}) reached"
            )
            return await self._unexecuted(invocation, limit)
        screening = screen_call(call, conversation.tools(), conversation.context.roles)
        if screening.refusal is not None:
            return await self._unexecuted(invocation, screening.refusal)
        quorum = None
        # Runs that loaded `has_policies` (before the activities read the rules in force) keep this
        # step, so that their histories replay; runs load it False now.
        if conversation.context.has_policies and screening.action in ("run", "approve"):
            assert screening.spec is not None
            decision = await bookkeeping(
                EVALUATE_POLICY,
                PolicyCheck(invocation=invocation, spec=screening.spec),
                f"policies on {call.name}",
            )
            if decision.outcome != "no_match":  # the tiers did not decide: the audit row says who did
                invocation = invocation.model_copy(update={"policy": decision})
            if decision.outcome == "forbid":
                return await self._unexecuted(
                    invocation, forbidden(decision, call.name), f"forbidden by policy {decision.policy}"
                )
            if decision.outcome == "permit_run":
                return await self._execute(invocation)
            if decision.outcome == "permit_approvals":
                screening, quorum = Screening(action="approve", spec=screening.spec), decision
        if screening.action == "run":
            result = await self._execute(invocation)
            # The rules in force ask for an approval the snapshot did not (a tier set since, a
            # policy's quorum): nothing ran, and the call is checked and asked below. Recorded
            # histories never have this answer.
            if result.code != "APPROVAL_REQUIRED":
                return result
            screening = Screening(action="approve", spec=screening.spec)
        checked = await self._check_arguments(invocation)
        rules = checked.rules  # the rules in force now (None in results recorded before them)
        policy = rules.policy if rules is not None else None
        if policy is not None:  # the audit row and the approval request name the set that decided
            invocation = invocation.model_copy(update={"policy": policy})
        if not checked.ok:
            why = f"forbidden by policy {policy.policy}" if policy and policy.outcome == "forbid" else None
            return await self._unexecuted(invocation, checked.envelope_result(), why)
        if screening.action == "ask_human":
            return await self._ask_human(invocation, str(checked.data["question"]))
        assert screening.spec is not None
        if rules is not None and quorum is None:
            if policy is not None and policy.outcome == "permit_approvals":
                quorum = policy
            elif policy is not None or rules.tier == "always_allow":  # permit_run, or the tier now
                result = await self._execute(invocation)
                if result.code != "APPROVAL_REQUIRED":
                    return result
                # the rules changed again between the check and the run: asked, as they say now
        return await self._run_after_approval(invocation, screening.spec, quorum)

    def _invocation(self, call: ToolCall, seq: int) -> ToolInvocation:
        info = workflow.info()
        return ToolInvocation(
            caller=self.conversation.caller(),
            workflow_id=info.workflow_id,
            conversation_id=self.conversation.conversation_id,
            run_id=info.run_id,
            call_id=call.id,
            tool=call.name,
            arguments=call.arguments,
            turn=self.conversation.turn,
            store_seq=seq,
        )

    async def _unexecuted(
        self, invocation: ToolInvocation, result: ToolResult, reason: str | None = None
    ) -> StoredResult:
        """Audit a call that did not run and store its result with the audit row (a local activity:
        its input, the result, is not recorded in history); the model gets the envelope."""
        await bookkeeping(
            RECORD_UNEXECUTED_CALL,
            UnexecutedCall(invocation=invocation, result=result, reason=reason),
            f"audit {invocation.tool} ({result.error.code if result.error else 'not run'})",
        )
        return tool_message(invocation, result)[1]

    async def _check_arguments(self, invocation: ToolInvocation) -> CheckedCall:
        spec = self.conversation.mcp_spec(invocation.tool)
        summary = f"validate {invocation.tool} arguments"
        if spec is not None:
            return await bookkeeping(CHECK_MCP_ARGUMENTS, McpCall(invocation=invocation, spec=spec), summary)
        return await bookkeeping(CHECK_ARGUMENTS, invocation, summary)

    async def _run_after_approval(
        self, invocation: ToolInvocation, spec: ToolSpec, quorum: PolicyDecision | None = None
    ) -> StoredResult:
        """`quorum`: the policy that asks for several approvers (one otherwise)."""
        approval = await self.gate.approval(invocation, spec, quorum=quorum)
        while approval.state == "approved":
            result = await self._execute(self._approved(invocation, approval))
            # Only a call whose effect changed since it was approved answers EFFECT_CHANGED (nothing
            # ran, nothing was stored): it is asked again. Histories from before never take this branch.
            if result.code != "EFFECT_CHANGED":
                return result
            approval = await self.gate.approval(invocation, spec, voided=approval, quorum=quorum)
        if approval.state == "rejected":
            why = f": {approval.reason}" if approval.reason else ""
            refusal = ToolResult.failure("REJECTED", f"{approval.decided_by} rejected {spec.name}{why}")
            return await self._unexecuted(invocation, refusal, f"rejected by {approval.decided_by}{why}")
        expired = ToolResult.failure(
            "EXPIRED", f"nobody decided on {spec.name} before {approval.expires_at.isoformat()}"
        )
        return await self._unexecuted(invocation, expired, "no decision before expiry")

    @staticmethod
    def _approved(invocation: ToolInvocation, approval: Approval) -> ToolInvocation:
        """The call as approved: the approver's edit (the model is told of it by the tool activity
        that stores the result) and who approved it."""
        edit = (
            {
                "model_arguments": invocation.arguments,
                "approver_edit": ApproverEdit(
                    approver=approval.decided_by or "",
                    changes=approval.edit_changes or {},
                    reason=approval.reason,
                ),
            }
            if approval.edited_args is not None
            else {}
        )
        quorum = {"policy": approval.quorum} if approval.quorum else {}  # also when carried across runs
        return invocation.model_copy(
            update={
                "arguments": approval.edited_args or invocation.arguments,
                "approved_by": approval.decided_by,
                "grant_id": approval.grant_id,
                **edit,
                **quorum,
            }
        )

    async def _ask_human(self, invocation: ToolInvocation, question: str) -> StoredResult:
        answer = await self.gate.answer_to(invocation.call_id, question)
        if not answer.ok:
            return await self._unexecuted(invocation, answer)
        message, stored = tool_message(invocation, answer)  # the answer arrived by signal: stored here
        await self.store.append([message])
        return stored

    async def _execute(self, invocation: ToolInvocation) -> StoredResult:
        spec = self.conversation.spec(invocation.tool)
        entry = None
        # before the forward step: a commit that then times out is undone too. An MCP call is
        # registered too, so that a rollback reports it (irreversible: it declares no compensation).
        if spec is not None and (spec.compensable or spec.mcp is not None):
            entry = self.conversation.saga.register(
                invocation.call_id, invocation.tool, self.conversation.turn, invocation.arguments
            )
        options: dict[str, Any] = {
            "start_to_close_timeout": TOOL_CALL_TIMEOUT,
            "schedule_to_close_timeout": DB_OUTAGE_TOLERANCE,
            "retry_policy": DB_RETRY,
            "summary": call_summary(invocation.tool, invocation.arguments),
            # on cancellation, learn how the step ended before compensating it
            "cancellation_type": workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        }
        try:
            if spec is not None and spec.local:
                result = await execute_local(EXECUTE_TOOL, invocation, **options)
            elif spec is not None and spec.mcp is not None:
                mcp_call = McpCall(invocation=invocation, spec=spec)
                result = await execute(
                    EXECUTE_MCP_TOOL, mcp_call, heartbeat_timeout=HEARTBEAT_TIMEOUT, **options
                )
            else:
                result = await execute(
                    EXECUTE_TOOL, invocation, heartbeat_timeout=HEARTBEAT_TIMEOUT, **options
                )
        except ActivityError as err:  # audited, said without internals (a row already written stays)
            failure = ToolResult.failure(
                "INTERNAL_ERROR", f"{invocation.tool} {execution_failure(err)}; it did not run"
            )
            return await self._unexecuted(invocation, failure)
        if entry is not None and result.code in ("EFFECT_CHANGED", "APPROVAL_REQUIRED"):  # did not run: asked
            self.conversation.saga.withdraw(entry)
            return result
        # a compensation reads the result from the call's audit row; emails wait for the undo window
        if entry is not None and result.ok:
            self.outbox.queued.extend(result.outbox)
        return result
