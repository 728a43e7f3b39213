"""The conversation's signals, updates and queries (names and payloads: the public contract).

Every handler takes `Model | Unreadable`: a payload that does not decode is refused on the record
(Authority), never dropped and never a failed workflow task. Who sends a signal is checked before
it changes anything: the conversation's user for `submit_message` and `answer` (plus a proof),
the database for `end` and `rollback`, `record_decision` for `approve`, `reject` and `decide`.
AgentWorkflow (workflows/agent.py) inherits these handlers; they act through its parts.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from countersign.core.approvals import Approval, ApproveSignal, Decision, RejectSignal
    from countersign.core.authority import action_state_refusal
    from countersign.core.bounds import Unreadable
    from countersign.core.calls import ToolSpec
    from countersign.core.contract import (
        AnswerSignal,
        EndConversation,
        PendingApproval,
        ServedCall,
        ServedOutcome,
        StatusView,
        SubmitMessage,
        TurnResult,
    )
    from countersign.core.messages import ChatMessage
    from countersign.core.policy import callable_tools
    from countersign.core.saga import RollbackRequest, Saga
    from countersign.observability.workflow_metrics import record_history

from workflows.approvals import CONTINUING, ApprovalGate
from workflows.authority import Authority
from workflows.compensation import Rollbacks
from workflows.conversation import Conversation
from workflows.messages import MessageStore
from workflows.options import acting_for
from workflows.rules import turn_wait_refusal
from workflows.served import ServedCalls

# Updates that only wait (for a turn, a reply): a run that ends first owes them nothing.
ABANDON = workflow.HandlerUnfinishedPolicy.ABANDON


class Handlers:
    """Signal, update and query handlers over the parts AgentWorkflow composes."""

    conversation: Conversation
    store: MessageStore
    gate: ApprovalGate
    authority: Authority
    rollbacks: Rollbacks
    served: ServedCalls

    def _received(self) -> None:
        """A signal's place among the run's signals names its audit rows (`acting_for`); the
        history it grew is measured (a flood shows before it ends the run)."""
        self.conversation.signals += 1
        acting_for(f"signal:{self.conversation.signals}")
        record_history(workflow.info())

    # --- the user's messages and answers ------------------------------------------------------

    @workflow.signal(name="submit_message")
    async def submit_message(self, message: SubmitMessage | Unreadable) -> None:
        self._received()
        if isinstance(message, Unreadable):
            return await self.authority.refuse_unreadable("submit_message", message)
        conversation = self.conversation
        refusal = action_state_refusal("submit_message", message.user_id, conversation.start.user_id)
        queued = any(m.message_id == message.message_id for m in conversation.inbox)
        if (
            refusal is None
            and message.message_id
            and (queued or message.message_id in self.store.cursor.answered)
        ):
            workflow.logger.warning("message %s was delivered before: answered once", message.message_id)
            return
        refusal = refusal or conversation.inbox_refusal() or await self.authority.message_refusal(message)
        if refusal is not None:
            if message.message_id:  # its sender may be waiting for the reply: tell them why not
                self.store.refuse(message.message_id, refusal)
            return await self.authority.refuse("submit_message", message.user_id, refusal)
        if conversation.ended_by is None:
            conversation.inbox.append(message)

    @workflow.signal(name="answer")
    async def answer(self, answer: AnswerSignal | Unreadable) -> None:
        self._received()
        if isinstance(answer, Unreadable):
            return await self.authority.refuse_unreadable("answer", answer)
        refusal = action_state_refusal("answer", answer.user_id, self.conversation.start.user_id)
        if refusal is None and not self.gate.open_question(answer.call_id):
            refusal = f"no question {answer.call_id!r} waits for an answer"
        if refusal is None and self.conversation.continuing:  # the question is being carried, sealed
            refusal = CONTINUING
        if refusal is not None:
            return await self.authority.refuse("answer", answer.user_id, refusal)
        proven = await self.authority.proven(
            "answer", answer.user_id, answer.proof, call_id=answer.call_id, text=answer.text
        )
        # a second answer may have arrived while the proof was checked
        if proven and self.gate.open_question(answer.call_id):
            self.gate.answers[answer.call_id] = answer.text

    @workflow.signal(name="end")
    async def end(self, request: EndConversation | Unreadable) -> None:
        """End the conversation: for its user or a tenant admin (the database says which), with a
        proof in APPROVER_AUTH=signed. A refusal is recorded and changes nothing."""
        self._received()
        if isinstance(request, Unreadable):
            return await self.authority.refuse_unreadable("end", request)
        conversation = self.conversation
        conversation.authorizing += 1  # an end accepted while rollbacks wait still lets them run first
        try:
            refusal = await self.authority.authorize("end", request.requested_by)
            proven = not refusal and await self.authority.proven("end", request.requested_by, request.proof)
        finally:
            conversation.authorizing -= 1
        if proven:
            conversation.ended_by = conversation.ended_by or f"end by {request.requested_by}"

    @workflow.signal(name="rollback")
    async def rollback(self, request: RollbackRequest | Unreadable) -> None:
        """Queue an authorized rollback; it runs between turns. A refusal is audited, nothing else."""
        self._received()
        if isinstance(request, Unreadable):
            return await self.authority.refuse_unreadable("rollback", request)
        if request.scope == "call" and not request.call_id:
            return await self.authority.refuse(
                "rollback", request.requested_by, "a rollback of scope call needs a call_id"
            )
        if request.scope == "call" and not self.conversation.saga.knows(request.call_id or ""):
            return await self.authority.refuse(
                "rollback",
                request.requested_by,
                f"no call {request.call_id!r} this conversation can undo (only its writes can be)",
            )
        await self.rollbacks.request(request)

    # --- reviewers' decisions -----------------------------------------------------------------

    @workflow.signal(name="approve")
    async def approve(self, signal: ApproveSignal | Unreadable) -> None:
        self._received()
        if isinstance(signal, Unreadable):
            return await self.authority.refuse_unreadable("approve", signal)
        await self._decide_quietly(signal.decision())

    @workflow.signal(name="reject")
    async def reject(self, signal: RejectSignal | Unreadable) -> None:
        self._received()
        if isinstance(signal, Unreadable):
            return await self.authority.refuse_unreadable("reject", signal)
        await self._decide_quietly(signal.decision())

    async def _decide_quietly(self, decision: Decision) -> None:
        """A signal has no caller to answer: a refused decision changes nothing and is audited."""
        try:
            await self.gate.decide(decision)
        except ApplicationError as refused:
            workflow.logger.warning(
                "%s of %s refused: %s", decision.decision, decision.call_id, refused.message
            )
        except ActivityError as err:  # the decision could not be recorded: it did not happen
            workflow.logger.error("%s of %s not recorded: %s", decision.decision, decision.call_id, err)

    @workflow.update(name="decide")
    async def decide(self, decision: Decision | Unreadable) -> Approval:
        """Decide a pending approval and answer with the recorded decision, or fail with the reason."""
        if isinstance(decision, Unreadable):
            await self.authority.refuse_unreadable("decide", decision)
            raise ApplicationError(
                f"decision refused: unreadable payload: {decision.unreadable}",
                type="DecisionRefused",
                non_retryable=True,
            )
        return await self.gate.decide(decision)

    # --- a client's own tool calls (Countersign as an MCP server) ------------------------------

    @workflow.update(name="serve_call")
    async def serve_call(self, call: ServedCall | Unreadable) -> ServedOutcome:
        """Run a client's tool call through the conversation's gate, for its user only (with a proof
        in signed mode); answers when it is done or waits for a reviewer (ask again to know more)."""
        if isinstance(call, Unreadable):
            await self.authority.refuse_unreadable("serve_call", call)
            raise ApplicationError(
                f"call refused: unreadable payload: {call.unreadable}", type="CallRefused", non_retryable=True
            )
        refusal = action_state_refusal("serve_call", call.user_id, self.conversation.start.user_id)
        if refusal is not None:
            await self.authority.refuse("serve_call", call.user_id, refusal)
        elif call.call_id not in self.served.calls:  # asking how a proven call stands needs no proof
            refusal = await self.authority.proof_refusal(
                "call", call.user_id, call.proof, call_id=call.call_id, tool=call.tool, text=call.arguments
            )
        if refusal:
            raise ApplicationError(f"call refused: {refusal}", type="CallRefused", non_retryable=True)
        return await self.served.serve(call)

    @workflow.query(name="served_tools")
    def served_tools(self) -> list[ToolSpec]:
        """The tools a client may call here (`tools/list`): the agent's, as its model sees them,
        less those the user's roles cannot call (empty until the context is loaded)."""
        context = self.conversation.context
        return callable_tools(context.tools, context.roles) if context else []

    # --- waiting for a turn or a reply ----------------------------------------------------------

    @workflow.update(name="wait_turn", unfinished_policy=ABANDON)
    async def wait_turn(self, turn: int) -> TurnResult | None:
        """Answers when turn `turn` has finished (None if the conversation ended, or continued-as-new,
        first: ask the new run)."""
        conversation = self.conversation

        def finished() -> bool:
            return conversation.last_turn is not None and conversation.last_turn.turn >= turn

        await workflow.wait_condition(
            lambda: finished() or conversation.state == "ended" or conversation.continuing
        )
        return conversation.last_turn if finished() else None

    @wait_turn.validator
    def _turn_asked_for(self, turn: int) -> None:
        """Refused before it is accepted (nothing in history): a wait for a turn never asked for."""
        conversation = self.conversation
        queued = len(conversation.inbox) + self.authority.checking
        refusal = turn_wait_refusal(turn, conversation.turn, queued)
        if refusal is not None:
            raise ApplicationError(f"wait refused: {refusal}", type="WaitRefused", non_retryable=True)

    @workflow.update(name="wait_reply", unfinished_policy=ABANDON)
    async def wait_reply(self, message_id: str) -> TurnResult | None:
        """Answers with the turn that replied to the message sent with `message_id` (None if the
        conversation ended, or continued-as-new, first: ask the new run)."""
        conversation = self.conversation
        await workflow.wait_condition(
            lambda: self.store.settled(message_id) or conversation.state == "ended" or conversation.continuing
        )
        if message_id in self.store.refused:
            raise ApplicationError(
                f"message refused: {self.store.refused[message_id]}",
                type="MessageRefused",
                non_retryable=True,
            )
        return await self.store.reply_to(message_id)

    # --- queries ------------------------------------------------------------------------------

    @workflow.query(name="status")
    def status(self) -> StatusView:
        conversation = self.conversation
        start, context = conversation.start, conversation.context
        return StatusView(
            state=conversation.state,
            turn=conversation.turn,
            usage=conversation.usage,
            limits=conversation.limits,
            tenant_id=start.tenant_id,
            user_id=start.user_id,
            agent=start.agent,
            last_error=conversation.last_error,
            pending_approvals=[
                PendingApproval.of(a, conversation.mcp_spec(a.tool))
                for a in conversation.approvals.values()
                if a.state == "pending"
            ],
            pending_questions=list(conversation.questions.values()),
            compensation_failures=conversation.saga.failures(),
            policy=context.policy if context else None,
        )

    @workflow.query(name="transcript")
    def transcript(self) -> list[ChatMessage]:
        """This run's prompt and latest messages; earlier runs' are in PostgreSQL:
        `starter.py transcript WF` reads the whole conversation from there."""
        return self.store.transcript

    @workflow.query(name="saga")
    def saga(self) -> Saga:
        return self.conversation.saga
