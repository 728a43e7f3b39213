"""The state one run of a conversation shares among the parts of AgentWorkflow.

Each part (workflows/messages.py, approvals.py, tools.py, compensation.py, authority.py) keeps
its own bookkeeping; what more than one of them reads or changes lives here, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from countersign.core.approvals import Approval, PendingCall
    from countersign.core.calls import CallerContext, ToolSpec
    from countersign.core.contract import (
        AgentState,
        ConversationContext,
        Limits,
        PendingQuestion,
        StartConversation,
        SubmitMessage,
        TurnResult,
    )
    from countersign.core.conversation_ref import ConversationRef
    from countersign.core.messages import Usage
    from countersign.core.saga import Saga
    from countersign.core.seal import ConversationInstance
    from countersign.runtime.search_attributes import AGENT_STATUS

from workflows.rules import status_details

# Messages waiting for their turn; more are refused. They are carried across runs: with the
# carried cursor they stay well under the 2 MB payload limit.
MAX_INBOX = 8
# How long a run that continues as new waits for the handlers in flight. A sustained flood of
# signals always has one in flight (each refusal is audited by an activity): waiting for none would
# let the flood keep the run from continuing until the server's history limit terminates it.
HANDLER_GRACE = timedelta(seconds=5)


@dataclass
class Conversation:
    """Who talks, what they have used, and what waits: for a turn, for people, for a rollback."""

    start: StartConversation
    limits: Limits
    usage: Usage
    turn: int
    call_seq: int  # tool calls numbered so far (`c1`, `c2`, …), across runs
    inbox: list[SubmitMessage]
    saga: Saga
    # The conversation instance every stored row and every read names: the first run's id (given
    # by Temporal, the same across continue-as-new; a new start under this workflow id is another
    # instance, which inherits nothing), carried sealed.
    conversation_id: str
    context: ConversationContext | None = None  # loaded from the database at the start of each run
    state: AgentState = "running"
    in_turn: bool = False
    rolling_back: bool = False
    continuing: bool = False  # continuing as new: waiting updates return, so their handlers finish
    ended_by: str | None = None
    last_turn: TurnResult | None = None
    last_error: str | None = None
    approvals: dict[str, Approval] = field(default_factory=dict)
    questions: dict[str, PendingQuestion] = field(default_factory=dict)
    # requests (`end`, `rollback`) whose authorization is still running: rollbacks wait for them
    authorizing: int = 0
    signals: int = 0  # received this run, in history order: each names its audit rows (`acting_for`)

    @staticmethod
    def of(start: StartConversation) -> Conversation:
        """A new conversation, or the next run of one, from its (verified in `run`) carried state."""
        carried = start.carried
        conversation = Conversation(
            start=start,
            limits=start.limits,
            usage=carried.usage if carried else Usage(),
            turn=carried.turn if carried else 0,
            call_seq=carried.call_seq if carried else 0,
            inbox=list(carried.inbox) if carried else [],
            saga=carried.saga if carried else Saga(),
            conversation_id=carried.conversation_id if carried else workflow.info().first_execution_run_id,
            ended_by=carried.ended_by if carried else None,
        )
        if start.message and not carried:
            conversation.inbox.append(SubmitMessage(user_id=start.user_id, text=start.message))
        return conversation

    @property
    def workflow_id(self) -> str:
        return workflow.info().workflow_id

    def ref(self) -> ConversationRef:
        """This conversation's address: every payload that names it is built `.at(conversation.ref())`."""
        return ConversationRef(
            tenant_id=self.start.tenant_id, workflow_id=self.workflow_id, conversation_id=self.conversation_id
        )

    def instance(self) -> ConversationInstance:
        """Whose conversation this instance is, under which workflow id (registered, sealed)."""
        return ConversationInstance.at(self.ref(), user_id=self.start.user_id, agent=self.start.agent)

    def pending_call(self, approval: Approval) -> PendingCall:
        """A pending approval as the worker records it and a decision's proof binds it."""
        return PendingCall.at(
            self.ref(),
            call_id=approval.call_id,
            tool=approval.tool,
            risk=approval.risk,
            nonce=approval.nonce,
        )

    def current_state(self) -> AgentState:
        if self.rolling_back:
            return "rolling_back"
        if self.ended_by is not None and not self.in_turn:
            return "ended"
        if any(a.state == "pending" for a in self.approvals.values()):
            return "awaiting_approval"
        if self.questions:
            return "awaiting_answer"
        return "running" if self.in_turn or self.inbox else "idle"

    def refresh_state(self) -> None:
        """Recompute the state; keep the AgentStatus search attribute and the UI details in step."""
        state = self.current_state()
        if state != self.state:
            workflow.upsert_search_attributes([AGENT_STATUS.value_set(state)])
        self.state = state
        approvals, questions = list(self.approvals.values()), list(self.questions.values())
        workflow.set_current_details(
            status_details(state, self.turn, self.context, self.usage, approvals, questions)
        )

    async def handlers_settled(self) -> None:
        """Wait for the signal and update handlers in flight, up to HANDLER_GRACE; past it, the run
        continues as new anyway (the refusals still being recorded then are carried and recorded by
        the next run: Authority.recording)."""
        if workflow.all_handlers_finished():
            return
        try:
            await workflow.wait_condition(
                workflow.all_handlers_finished, timeout=HANDLER_GRACE, timeout_summary="handlers in flight"
            )
        except TimeoutError:
            workflow.logger.warning("continuing as new with handlers in flight (a flood of signals?)")

    def inbox_refusal(self) -> str | None:
        """Why one more message cannot wait for its turn now, if it cannot."""
        if self.ended_by is None and len(self.inbox) >= MAX_INBOX:
            return f"{MAX_INBOX} messages already wait for their turn; send this one later"
        return None

    def tools(self) -> dict[str, ToolSpec]:
        """The agent's snapshotted specs by name: the one lookup screening, the argument check, the
        card and execution all use (a tool is its (server, tool); the snapshot has one spec a name)."""
        return {t.name: t for t in self.context.tools} if self.context else {}

    def spec(self, tool: str) -> ToolSpec | None:
        """The agent's snapshotted spec of `tool` (None for a tool it does not have)."""
        return self.tools().get(tool)

    def mcp_spec(self, tool: str) -> ToolSpec | None:
        """The snapshotted spec of an MCP tool (its input schema checks an approver's edits), else None."""
        spec = self.spec(tool)
        return spec if spec is not None and spec.mcp is not None else None

    def caller(self) -> CallerContext:
        """Who the conversation's tool calls (and their compensations) act for."""
        context = self.context
        assert context is not None  # loaded before any call
        return CallerContext(
            tenant_id=context.tenant_id,
            user_id=context.user_id,
            roles=context.roles,
            agent=context.agent.name,
        )

    def turns_this_run(self) -> int:
        carried = self.start.carried
        return self.turn - (carried.turn if carried else 0)
