"""AgentWorkflow: one conversation between a user and an agent, as deterministic Temporal code.

Read top to bottom: `run` loads who acts and what the agent may do, then `converse` waits for the
next message (or an `end`, a rollback, the idle timeout) and runs a turn for it. A turn is the
tool-calling loop: call the model (an activity), run the tool calls it asks for (each an activity,
several concurrently, results fed back in call order), and repeat until the model answers in plain
text or a limit stops the turn. A long conversation continues as new, carrying a small sealed state.

The parts it composes, one concern each:
- workflows/conversation.py  the state the parts share, and the status the UI shows
- workflows/messages.py      the message store: sequence numbers, the context window, replies
- workflows/tools.py         one batch of tool calls: screened, checked, approved or asked, run
- workflows/approvals.py     the approval gate: reviewers' decisions and notices, the user's answers
- workflows/compensation.py  rollbacks and the saga's compensations
- workflows/emails.py        emails delivered once their undo window has passed
- workflows/authority.py     who may act on a client's signal, recorded either way
- workflows/handlers.py      the signals, updates and queries (inherited by AgentWorkflow)
- workflows/rules.py, options.py  pure rules; activity timeouts and retries
Pure decisions are plain functions (countersign.core.limits, countersign.core.policy, workflows/rules.py);
everything that touches the world is an activity, referenced by name.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import CALL_MODEL, LOAD_CONVERSATION_CONTEXT, SEAL_CARRIED
    from countersign.core.bounds import Unreadable
    from countersign.core.contract import (
        WORKFLOW_TYPE,
        CarriedState,
        ConversationContext,
        ConversationResult,
        StartConversation,
        TurnResult,
        TurnStop,
        WaitingTurn,
    )
    from countersign.core.direct import conversational, is_marker
    from countersign.core.envelopes import budget_refusal
    from countersign.core.history import continue_suggested
    from countersign.core.limits import before_model_call, tool_call_budget, within_agent_bounds
    from countersign.core.messages import (
        ChatMessage,
        ModelCaller,
        ModelReply,
        ModelRequest,
        StoredInput,
        ToolCall,
        Usage,
    )
    from countersign.core.policy import offered_tools
    from countersign.core.seal import SealRequest, digest
    from countersign.observability.workflow_metrics import record_turn
    from countersign.runtime.search_attributes import AGENT_NAME, TENANT_ID

from workflows.approvals import ApprovalGate
from workflows.authority import Authority
from workflows.compensation import Rollbacks
from workflows.conversation import Conversation
from workflows.emails import EmailOutbox
from workflows.handlers import Handlers
from workflows.messages import MessageStore
from workflows.options import (
    BOOKKEEPING_TIMEOUT,
    CONTEXT_RETRY,
    DB_OUTAGE_TOLERANCE,
    HEARTBEAT_TIMEOUT,
    MODEL_CALL_TIMEOUT,
    MODEL_RETRY,
    acting_for,
    bookkeeping,
    execute,
)
from workflows.rules import failed_write, turn_failure
from workflows.served import ServedCalls
from workflows.tools import Parked, ToolCalls


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflow(Handlers):
    @workflow.init
    def __init__(self, start: StartConversation | Unreadable) -> None:
        # An unreadable start input fails the run at once (see `run`); the placeholder only lets
        # the handlers and queries that may run first see a well-formed, empty conversation.
        self.unreadable_start = start if isinstance(start, Unreadable) else None
        if isinstance(start, Unreadable):
            start = StartConversation(tenant_id="-", user_id="-", agent="-")
        self.conversation = Conversation.of(start)
        self.outbox = EmailOutbox(start.carried.outbox if start.carried else [])
        self.store = MessageStore(self.conversation)
        self.gate = ApprovalGate(self.conversation)
        self.authority = Authority(self.conversation)
        self.rollbacks = Rollbacks(self.conversation, self.store)
        self.tools = ToolCalls(
            self.conversation,
            self.store,
            self.gate,
            self.outbox,
            lambda: bool(self.rollbacks.requested) or self.served.busy(),
        )
        self.served = ServedCalls(self.conversation, self.tools)

    # --- the conversation -------------------------------------------------------------------

    @workflow.run
    async def run(self, start: StartConversation | Unreadable) -> ConversationResult:
        acting_for("run")  # the run's own bookkeeping, apart from any input's
        if self.unreadable_start is not None:
            raise ApplicationError(
                f"the start input was refused: {self.unreadable_start.unreadable}",
                type="InvalidStartInput",
                non_retryable=True,
            )
        conversation = self.conversation
        if conversation.start.carried is None:  # a continued run: its seal vouches for it
            refusal = await self.authority.start_refusal(conversation.start)
            if refusal:
                raise ApplicationError(
                    f"the start was refused: {refusal}", type="UnprovenStart", non_retryable=True
                )
        await self.authority.verify_carried(conversation.start)
        if conversation.start.carried is not None:
            await self.authority.record_carried(conversation.start.carried.refusals)
        context = await self._load_context(conversation.start)
        workflow.upsert_search_attributes(
            [TENANT_ID.value_set(context.tenant_id), AGENT_NAME.value_set(context.agent.name)]
        )
        try:
            await self._converse()
        except asyncio.CancelledError:
            # A cancel stops the conversation; it is not an (unproven) undo: what was approved
            # stays. Rollbacks accepted before it still run, shielded from the cancellation.
            await asyncio.shield(asyncio.ensure_future(self.rollbacks.run_requested()))
            raise
        conversation.ended_by = conversation.ended_by or "ended"
        conversation.refresh_state()
        await self.outbox.delivered()
        await self.gate.notices_sent()
        await workflow.wait_condition(workflow.all_handlers_finished)
        last = conversation.last_turn
        return ConversationResult(
            turns=conversation.turn,
            last_reply=last.reply if last else None,
            usage=conversation.usage,
            ended_by=conversation.ended_by,
        )

    async def _load_context(self, start: StartConversation) -> ConversationContext:
        """Who acts and what the agent may do, from the database, in every run: never carried."""
        try:
            context = await execute(
                LOAD_CONVERSATION_CONTEXT,
                start,
                start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                schedule_to_close_timeout=DB_OUTAGE_TOLERANCE,
                retry_policy=CONTEXT_RETRY,
                summary=f"load {start.tenant_id}/{start.user_id} roles and {start.agent} permissions",
            )
        except ActivityError as err:  # say who is unknown, not only that the workflow failed
            if isinstance(err.cause, ApplicationError) and err.cause.type == "UnknownConversationParty":
                raise ApplicationError(err.cause.message, type=err.cause.type, non_retryable=True) from err
            raise
        self.conversation.context = context
        self.conversation.limits = within_agent_bounds(self.conversation.limits, context.agent_limits)
        await self.authority.register()
        await self.store.store_prompt(context.agent.system_prompt)
        return context

    async def _converse(self) -> None:
        """Between turns: run what rollbacks were asked for, then the next message's turn (first,
        the turn the previous run carried while it waited for people, if any)."""
        conversation = self.conversation
        carried = conversation.start.carried
        if carried is not None and carried.waiting is not None:
            await self._turn_for(carried.waiting.message_id, carried.waiting)
            if conversation.start.single_turn:
                conversation.ended_by = "single_turn"
                return
        while True:
            conversation.refresh_state()
            if not await self._next_message_arrives():
                conversation.ended_by = conversation.ended_by or "idle_timeout"
            await self.rollbacks.run_requested()
            if conversation.ended_by:
                if self.served.busy():  # a client's call in flight finishes (or fails closed) first
                    await workflow.wait_condition(lambda: not self.served.busy())
                return
            if not conversation.inbox:
                if (
                    continue_suggested(workflow.info()) and not self.served.busy()
                ):  # signals alone filled it: continue while idle
                    await self._continue_as_new()
                continue
            message = conversation.inbox.pop(0)
            if not await self.store.accept(message):
                continue
            await self._turn_for(message.message_id, direct=conversational(message.text))
            if conversation.start.single_turn:
                conversation.ended_by = "single_turn"
                return
            if (
                continue_suggested(workflow.info())
                or conversation.turns_this_run() >= conversation.limits.max_turns_per_run
                or workflow.info().is_target_worker_deployment_version_changed()  # a new build is current
            ):
                await self._continue_as_new()

    async def _next_message_arrives(self) -> bool:
        conversation = self.conversation
        try:
            await workflow.wait_condition(
                lambda: (
                    bool(conversation.inbox)
                    or bool(self.rollbacks.requested)
                    or conversation.ended_by is not None
                    or (continue_suggested(workflow.info()) and not self.served.busy())
                ),
                timeout=timedelta(seconds=conversation.limits.idle_timeout_s),
                timeout_summary="idle timeout",
            )
        except TimeoutError:
            return self.served.busy()  # not idle while a client's call is in flight
        return True

    async def _continue_as_new(self, waiting: WaitingTurn | None = None) -> None:
        """Carry the small state (counters, inbox, saga, cursor, undelivered emails, a turn that
        waits for people), sealed: the next run verifies the seal before it trusts any of it.

        An `end` accepted before (during the turn, or while its handler settles here) is never
        dropped: between turns this run does not continue, it returns and the conversation ends;
        mid-turn the end is carried, and the next run ends once it has finished the turn."""
        conversation = self.conversation
        conversation.continuing = True  # lets waiting updates return, so the handlers can finish
        await conversation.handlers_settled()
        await self.gate.notices_sent()
        if waiting is None and conversation.ended_by is not None:
            conversation.continuing = False
            return
        if waiting is None:  # mid-turn (`Parked`), none were: rollbacks run after the turn
            await self.rollbacks.run_requested()  # accepted during the turn: not carried, so run now
        carried = CarriedState(
            messages=[],
            cursor=self.store.cursor,
            usage=conversation.usage,
            turn=conversation.turn,
            call_seq=conversation.call_seq,
            inbox=conversation.inbox,
            saga=conversation.saga,
            outbox=self.outbox.undelivered,
            conversation_id=conversation.conversation_id,
            waiting=waiting,
            ended_by=conversation.ended_by,
            refusals=list(self.authority.recording.values()),
        )
        seal = await bookkeeping(
            SEAL_CARRIED,
            SealRequest(**conversation.instance().model_dump(), digest=digest(carried)),
            "seal the carried state",
        )
        # A versioned worker's conversation is pinned to its build (worker.py, docs/how-to/
        # deploy-a-new-build.md); its next run starts on the deployment's current build. State crosses builds
        # only here: StartConversation and CarriedState stay readable by the next build.
        versioned = workflow.info().get_current_deployment_version() is not None
        workflow.continue_as_new(
            conversation.start.model_copy(update={"message": None, "carried": carried, "seal": seal}),
            initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
            if versioned
            else None,
        )

    # --- one turn ---------------------------------------------------------------------------

    async def _turn_for(
        self, message_id: str | None, waiting: WaitingTurn | None = None, direct: bool = False
    ) -> None:
        """Run the turn for a message (or finish the one `waiting`), and say it replied; continue
        as new mid-turn when history grew while the turn waited for people (`Parked`)."""
        try:
            await self._run_turn(waiting, direct)
        except Parked as parked:
            emails = {"message_id": message_id, "emails": self.outbox.queued}
            await self._continue_as_new(parked.waiting.model_copy(update=emails))
        if message_id and self.conversation.last_turn is not None:
            self.store.replied(message_id, self.conversation.last_turn)

    async def _run_turn(self, waiting: WaitingTurn | None, direct: bool) -> None:
        conversation = self.conversation
        if waiting is None:  # a carried turn was counted by the run that started it
            conversation.turn += 1
        conversation.in_turn, self.gate.human_wait_s = True, 0.0
        conversation.refresh_state()
        if waiting is not None:  # emails it queued before: delivered after it, as any turn's
            self.outbox.queued.extend(waiting.emails)
        try:
            await self._turn_loop(waiting, direct)
        finally:
            conversation.in_turn = False
        assert conversation.context is not None
        self.outbox.deliver_turn(conversation.context.email_delivery_delay_s)

    async def _turn_loop(self, waiting: WaitingTurn | None, direct: bool) -> None:
        """Model, tools, model, … until a plain answer or a limit; a carried turn starts with its
        waiting batch. `direct`: the first call goes without tools (countersign.core.direct); if
        the model wants them, it is asked again with them."""
        conversation = self.conversation
        context = conversation.context
        assert context is not None
        started = waiting.started if waiting and waiting.started else workflow.now()
        turn = waiting.usage if waiting else Usage()
        while True:
            if waiting is None:
                asked = await self._ask_model(turn, started, direct)
                if asked is None:  # the turn ended: an answer, a limit or a failed call
                    return
                turn, calls, budget = asked
                direct = False
            else:
                calls, budget = waiting.calls, waiting.budget
            try:
                results = await (self.tools.resume(waiting) if waiting else self.tools.run(calls, budget))
            except Parked as parked:  # what the next run needs to finish this turn
                what = {"usage": turn, "started": started, "human_wait_s": self.gate.waited_s()}
                parked.waiting = parked.waiting.model_copy(update=what)
                raise
            waiting = None
            ran = Usage(tool_calls=min(budget, len(results)))
            turn, conversation.usage = turn.plus(ran), conversation.usage.plus(ran)
            self.store.keep_results(calls, results)
            failed = failed_write(conversation.tools(), calls, results)
            if failed and context.agent.atomic_turns:
                undo = conversation.saga.to_undo("turn", conversation.turn)
                await self.rollbacks.compensate(undo, f"atomic turn: {failed} failed")
                return await self._end_turn(
                    turn, "error", f"The turn stopped: {failed} failed, so its writes were undone."
                )
            if budget < len(results):
                limit = conversation.limits.max_tool_calls
                return await self._end_turn(
                    turn, "limit_reached", f"LIMIT_REACHED: the turn reached max_tool_calls ({limit})."
                )

    async def _ask_model(
        self, turn: Usage, started: datetime, direct: bool
    ) -> tuple[Usage, list[ToolCall], int] | None:
        """Call the model until it asks for tools: the turn's usage with the calls, and how many may
        run. A direct call's reply wanting tools asks again, with them. None when the turn ended
        here: a plain answer, a limit, or a model call that failed."""
        conversation = self.conversation
        context = conversation.context
        assert context is not None
        while True:
            elapsed = (workflow.now() - started).total_seconds() - self.gate.human_wait_s
            stop = before_model_call(conversation.limits, turn, elapsed)
            stop = stop or budget_refusal(context.policy, conversation.usage.total_tokens)
            if stop:
                await self._end_turn(turn, "limit_reached", f"LIMIT_REACHED: {stop}.")
                return None
            try:
                reply = await self._call_model(
                    timedelta(seconds=conversation.limits.turn_timeout_s - elapsed), direct
                )
            except ActivityError as err:
                await self._end_turn(turn, *turn_failure("model call", err))
                return None
            turn = turn.plus(reply.usage)
            conversation.usage = conversation.usage.plus(reply.usage)
            direct = False
            if is_marker(reply.message):  # the direct call's reply asks for the tools: ask again
                continue
            if not reply.message.tool_calls:
                await self._end_turn(turn, "completed", reply.message.content)
                return None
            return turn, reply.message.tool_calls, tool_call_budget(conversation.limits, turn)

    async def _call_model(self, remaining: timedelta, direct: bool) -> ModelReply:
        """The model call: its input is sequence numbers and tool names; the activity reads the
        messages from the store and stores the reply (its tool calls numbered from `call_seq`).
        A direct call offers no tools; its reply asking for them stays out of the window."""
        conversation = self.conversation
        assert conversation.context is not None
        offered = offered_tools(conversation.context.tools)
        seqs = await self.store.model_seqs()
        reply_seq = self.store.next_seq()
        request = StoredInput.at(
            conversation.ref(),
            seqs=seqs,
            reply_seq=reply_seq,
            call_seq=conversation.call_seq,
            tool_names=[] if direct else [t.name for t in offered if t.mcp is None],
            mcp_tools=[] if direct else [t.openai_tool() for t in offered if t.mcp is not None],
            direct=direct,
        )
        caller = ModelCaller(
            tenant_id=conversation.start.tenant_id, agent=conversation.start.agent, turn=conversation.turn
        )
        reply = await execute(
            CALL_MODEL,
            ModelRequest(stored=request, caller=caller, agent=conversation.start.agent),
            start_to_close_timeout=min(MODEL_CALL_TIMEOUT, remaining),
            schedule_to_close_timeout=remaining,
            retry_policy=MODEL_RETRY,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            summary=f"model call (turn {conversation.turn}, {len(seqs)} messages)",
        )
        conversation.call_seq += len(reply.message.tool_calls)
        if not is_marker(reply.message):
            self.store.record(reply.message, seq=reply_seq)
        return reply

    async def _end_turn(self, usage: Usage, stop: TurnStop, reply: str | None) -> None:
        """Finish the turn; a turn that did not complete leaves a note naming how it stopped."""
        conversation = self.conversation
        if stop != "completed":
            conversation.last_error = reply
            await self.store.note(ChatMessage(role="assistant", content=reply, name=stop))
        conversation.last_turn = TurnResult(turn=conversation.turn, reply=reply, stop=stop, usage=usage)
        record_turn(conversation.start.agent, stop)
