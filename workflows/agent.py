"""AgentWorkflow: one conversation between a user and an agent, as deterministic Temporal code.

A turn is the tool-calling loop: call the model (an activity), run the tool calls it asks for
(each an activity, several concurrently, results fed back in call order), and repeat until the
model answers in plain text or a limit stops the turn. Between turns the conversation waits for
the next `submit_message`, an `end`, or its idle timeout.

Everything the loop decides is delegated to pure functions (countersign.core.policy, countersign.core.limits);
everything that touches the world is an activity, referenced by name so this module imports no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from countersign.core.approvals import (
        Approval,
        ApprovalNotice,
        ApprovalReminder,
        ApproveSignal,
        Decision,
        DecisionRecord,
        NoticeKind,
        RejectSignal,
        Verdict,
        state_refusal,
    )
    from countersign.core.authority import Action, ActionCheck, ProofRequest
    from countersign.core.authority import state_refusal as action_state_refusal
    from countersign.core.bounds import Unreadable, loads_bounded
    from countersign.core.calls import (
        CallerContext,
        McpCall,
        StoredResult,
        ToolInvocation,
        ToolResult,
        ToolSpec,
        UnexecutedCall,
        queued_emails,
        result_for_model,
    )
    from countersign.core.contract import (
        WORKFLOW_TYPE,
        AgentState,
        AnswerSignal,
        CarriedState,
        ConversationContext,
        ConversationResult,
        EndConversation,
        PendingQuestion,
        StartConversation,
        StatusView,
        SubmitMessage,
        TurnResult,
        TurnStop,
    )
    from countersign.core.envelopes import (
        PROMPT_SEQ,
        AppendMessages,
        Cursor,
        Envelope,
        RepliedTurn,
        StoredMessage,
        Summarized,
        SummaryRequest,
        budget_refusal,
        envelope_of,
        remember_answer,
        select_window,
        stored_envelope,
        tool_message,
    )
    from countersign.core.history import CARRIED_BYTES, fit_for_model, history_full, trim_for_carry
    from countersign.core.limits import before_model_call, tool_call_budget, within_agent_bounds
    from countersign.core.markdown import escape_markdown
    from countersign.core.messages import (
        ChatMessage,
        ModelCaller,
        ModelReply,
        ModelRequest,
        StoredInput,
        ToolCall,
        Usage,
        numbered,
    )
    from countersign.core.policy import offered_tools, screen_call
    from countersign.core.saga import (
        CompensationOutcome,
        CompensationRequest,
        RollbackAuthorization,
        RollbackRequest,
        Saga,
        SagaEntry,
    )
    from countersign.core.seal import SealCheck, SealRequest, digest
    from countersign.observability.workflow_metrics import record_approval_wait, record_turn
    from countersign.runtime.search_attributes import AGENT_NAME, AGENT_STATUS, TENANT_ID

# Activities whose I/O is PostgreSQL retry without an attempt cap for up to DB_OUTAGE_TOLERANCE: a
# database restart or failover delays a call, it does not fail it.
DB_OUTAGE_TOLERANCE = timedelta(minutes=5)
# The maximum interval stays under the SDK's local_retry_threshold (1 min): past it, a local
# activity's retry waits on a server timer under a new activity id, and record_decision keys its
# audit row on the activity id (one row per decision attempt, however often it is retried).
DB_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_interval=timedelta(seconds=10))
CONTEXT_RETRY = RetryPolicy(
    initial_interval=DB_RETRY.initial_interval,
    maximum_interval=DB_RETRY.maximum_interval,
    non_retryable_error_types=["UnknownConversationParty"],
)
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=6
)
REPLIES_KEPT = 100
MODEL_CALL_TIMEOUT = timedelta(seconds=120)
TOOL_CALL_TIMEOUT = timedelta(seconds=60)
# Long-running activities heartbeat every 2 s (activities/heartbeat.py): a worker that dies mid-call
# is noticed after this, not after the call's start-to-close timeout.
HEARTBEAT_TIMEOUT = timedelta(seconds=10)
DELIVERY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2), maximum_interval=timedelta(minutes=5), maximum_attempts=20
)
BOOKKEEPING_TIMEOUT = timedelta(seconds=30)
# Patch id: conversations started since bookkeeping (argument checks, audit rows of unexecuted calls,
# decision checks) became local activities run them locally; older histories replay as they ran.
LOCAL_BOOKKEEPING = "local-bookkeeping"
# Patch id: conversations started since client input became untrusted (docs/security.md) load their
# context in every run, seal what they carry, authorize `end` against the database and record every
# refused signal; older histories replay as they ran.
HOSTILE_INPUT = "hostile-input"
# Messages waiting for their turn; more are refused. They are carried across runs: with the
# carried transcript (history.CARRIED_BYTES) they stay well under the 2 MB payload limit.
MAX_INBOX = 8
# Updates that only wait (for a turn, a reply): a run that ends first owes them nothing.
ABANDON = workflow.HandlerUnfinishedPolicy.ABANDON
# Patch id: conversations started since the message store keep message bodies in PostgreSQL: model
# calls get sequence numbers, continue-as-new carries a cursor. Older histories replay as they ran.
MESSAGE_STORE = "message-store"
# Since the message store, the `transcript` query answers the prompt and this many latest messages
# of the run: a bounded view for the UI and tests; the store has the whole conversation.
TRANSCRIPT_KEPT = 200

# Patch id: conversations started since proofs existed check `answer` and `end` (check_action_proof).
PROVEN_SIGNALS = "proven-signals"
# Patch id: conversations started since then notify reviewers (email, webhook) of each approval.
APPROVAL_NOTICES = "approval-notices"
NOTICE_TIMEOUT = timedelta(seconds=60)
# How long a conversation that ends (or continues as new) waits for notices still being delivered;
# an unreachable mail server or webhook then leaves them queued in the outboxes, for operators.
NOTICE_GRACE = timedelta(seconds=2)

# Patch id: conversations started since tool results left workflow history: the activity that
# produces a call's result (or records its refusal) stores it as the tool message, at a sequence
# number the workflow allocated when the model asked for the call, and answers with a small
# `StoredResult`. Older histories replay as they ran (bodies in activity results).
TOOL_RESULTS_STORED = "tool-results-stored"
# What a tool call gives the turn: the whole result (before TOOL_RESULTS_STORED), or its envelope.
CallResult = ToolResult | StoredResult


def call_summary(tool: str, arguments: str) -> str:
    """A one-line label for the Web UI: `get_lead jane.doe@example.com`. Never raises: the
    arguments come from the model (bounded parsing, countersign.core.bounds)."""
    args, refusal = loads_bounded(arguments)
    if refusal is not None:
        values = "(invalid JSON arguments)"
    else:
        values = (
            " ".join(str(v)[:200] for v in args.values() if v is not None) if isinstance(args, dict) else ""
        )
    return f"{tool} {escape_markdown(values[:200])}"[:400].strip()


async def compensated(request: CompensationRequest) -> bool:
    """Run one compensation and set its entry's state: False when it failed for good (the entry
    then holds the error, for the failure record). Shared by conversations and ConversationRollback."""
    entry = request.entry
    try:
        outcome: CompensationOutcome = await workflow.execute_activity(
            "compensate_call",
            request,
            result_type=CompensationOutcome,
            start_to_close_timeout=TOOL_CALL_TIMEOUT,
            schedule_to_close_timeout=DB_OUTAGE_TOLERANCE,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=DB_RETRY,
            summary=f"undo {call_summary(entry.tool, entry.arguments)} ({entry.call_id})",
        )
    except ActivityError as err:
        entry.state = "failed"
        entry.error = err.cause.message if isinstance(err.cause, ApplicationError) else str(err.cause or err)
        return False
    entry.state = outcome.state
    return True


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflow:
    @workflow.init
    def __init__(self, start: StartConversation | Unreadable) -> None:
        # An unreadable start input fails the run at once (see `run`); the placeholder only lets
        # the handlers and queries that may run first see a well-formed, empty conversation.
        self._unreadable_start = start if isinstance(start, Unreadable) else None
        if isinstance(start, Unreadable):
            start = StartConversation(tenant_id="-", user_id="-", agent="-")
        carried = start.carried
        self._start = start
        self._limits = start.limits
        self._context: ConversationContext | None = carried.context if carried else None
        self._messages: list[ChatMessage] = list(carried.messages) if carried else []
        self._usage = carried.usage if carried else Usage()
        self._turn = carried.turn if carried else 0
        self._call_seq = carried.call_seq if carried else 0
        self._inbox: list[SubmitMessage] = list(carried.inbox) if carried else []
        self._saga = carried.saga if carried else Saga()
        self._rollbacks: list[RollbackRequest] = []  # accepted, not yet run
        self._authorizing = 0  # rollback requests whose authorization is still running
        self._outbox: list[int] = []  # emails this turn queued
        self._deliveries: list[asyncio.Task[None]] = []
        self._notices: list[asyncio.Task[None]] = []  # reviewers' notifications still being sent
        # Asked once, here in the first activation: asked later, after a local activity whose
        # workflow task was heartbeated into the next one, the marker lands where a replay that
        # resolves the local activity at once does not look for it (a nondeterminism error).
        self._notify_reviewers = workflow.patched(APPROVAL_NOTICES)
        self._proof_checked_signals = workflow.patched(PROVEN_SIGNALS)
        self._undelivered: list[int] = []  # queued emails whose delivery has not finished
        if carried and carried.outbox:
            self._deliveries.append(asyncio.create_task(self._deliver_after(0, carried.outbox)))
        self._rolling_back = False
        if start.message and not carried:
            self._inbox.append(SubmitMessage(user_id=start.user_id, text=start.message))
        self._state: AgentState = "running"
        self._in_turn = False
        self._approvals: dict[str, Approval] = {}
        self._questions: dict[str, PendingQuestion] = {}
        self._answers: dict[str, str] = {}
        self._deciding: set[str] = set()
        self._human_wait_s = 0.0  # time this turn spent waiting for people: not charged to turn_timeout_s
        self._last_turn: TurnResult | None = None
        self._continuing = False
        self._replies: dict[str, TurnResult] = {}  # by message id, the most recent REPLIES_KEPT
        self._refused_messages: dict[str, str] = {}  # message id -> why it was refused
        self._ended_by: str | None = None
        self._last_error: str | None = None
        self._stored = False  # message bodies in the conversation store (MESSAGE_STORE); set by run
        # tool results stored by their activities (asked here, like APPROVAL_NOTICES; needs MESSAGE_STORE)
        self._results_stored = workflow.patched(TOOL_RESULTS_STORED)
        self._cursor = carried.cursor if carried and carried.cursor else Cursor(next_seq=PROMPT_SEQ + 1)

    # --- the conversation -------------------------------------------------------------------

    @workflow.run
    async def run(self, start: StartConversation | Unreadable) -> ConversationResult:
        if self._unreadable_start is not None:
            raise ApplicationError(
                f"the start input was refused: {self._unreadable_start.unreadable}",
                type="InvalidStartInput",
                non_retryable=True,
            )
        start = self._start
        self._stored = workflow.patched(MESSAGE_STORE)
        self._results_stored = self._results_stored and self._stored
        if start.carried is None or workflow.patched(HOSTILE_INPUT):
            await self._verify_carried(start)
            context = await self._load_context(start)
        else:  # a run continued before HOSTILE_INPUT: its context was carried
            context = self._context or await self._load_context(start)
        self._limits = within_agent_bounds(self._limits, context.agent_limits)
        if self._stored and self._messages:  # carried by a run from before the store: store it now
            await self._adopt(context)
        workflow.upsert_search_attributes(
            [TENANT_ID.value_set(context.tenant_id), AGENT_NAME.value_set(context.agent.name)]
        )
        try:
            await self._converse(context, start)
        except asyncio.CancelledError:
            # Cancelling a conversation undoes everything it did; shielded so the cancellation
            # itself cannot interrupt the compensations.
            undo = self._saga.to_undo("conversation", self._turn)
            await asyncio.shield(asyncio.ensure_future(self._compensate(context, undo, "workflow cancelled")))
            raise
        self._ended_by = self._ended_by or "ended"
        self._refresh_state()
        await asyncio.gather(*self._deliveries)
        await self._notices_sent()
        await workflow.wait_condition(workflow.all_handlers_finished)
        last = self._last_turn
        return ConversationResult(
            turns=self._turn,
            last_reply=last.reply if last else None,
            usage=self._usage,
            ended_by=self._ended_by,
        )

    async def _converse(self, context: ConversationContext, start: StartConversation) -> None:
        while True:
            self._refresh_state()
            if not await self._next_message_arrives():
                self._ended_by = self._ended_by or "idle_timeout"
            await self._run_rollbacks(context)
            if self._ended_by:
                return
            if not self._inbox:
                if history_full(workflow.info()):  # signals alone filled it: continue while idle
                    await self._continue_as_new(context)
                continue
            message = self._inbox.pop(0)
            if self._stored and not await self._accept(context, message):
                continue
            await self._run_turn(context, message)
            if message.message_id and self._last_turn is not None:
                self._replies[message.message_id] = self._last_turn
                if self._stored:
                    remember_answer(self._cursor.answered, message.message_id, self._last_turn.turn)
                while len(self._replies) > REPLIES_KEPT:
                    del self._replies[next(iter(self._replies))]
            if start.single_turn:
                self._ended_by = "single_turn"
                return
            if (
                workflow.info().is_continue_as_new_suggested()
                or history_full(workflow.info())
                or self._turns_this_run() >= self._limits.max_turns_per_run
            ):
                await self._continue_as_new(context)

    async def _continue_as_new(self, context: ConversationContext) -> None:
        self._continuing = True  # lets waiting updates return, so the handlers can finish
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._notices_sent()
        await self._run_rollbacks(context)  # accepted during the turn: not carried, so run now
        if not workflow.patched(HOSTILE_INPUT):
            workflow.continue_as_new(
                self._start.model_copy(update={"message": None, "carried": self._carry(context)})
            )
        carried = self._carry(None)
        seal: str = await self._bookkeeping(
            "seal_carried",
            SealRequest(workflow_id=workflow.info().workflow_id, digest=digest(carried)),
            "seal the carried state",
            str,
        )
        workflow.continue_as_new(
            self._start.model_copy(update={"message": None, "carried": carried, "seal": seal})
        )

    def _turns_this_run(self) -> int:
        carried = self._start.carried
        return self._turn - (carried.turn if carried else 0)

    async def _verify_carried(self, start: StartConversation) -> None:
        """Fail the run once, on the record, when it was started with state it cannot prove the
        conversation carried itself (a client's invention, or another workflow's)."""
        if start.carried is None:
            return
        check = SealCheck(
            tenant_id=start.tenant_id,
            user_id=start.user_id,
            workflow_id=workflow.info().workflow_id,
            digest=digest(start.carried),
            seal=start.seal,
        )
        refusal: str = await self._bookkeeping("verify_carried", check, "verify the carried state", str)
        if refusal:
            raise ApplicationError(
                f"the start input was refused: {refusal}", type="ForgedCarriedState", non_retryable=True
            )

    async def _load_context(self, start: StartConversation) -> ConversationContext:
        """Who acts and what the agent may do, from the database, in every run: never carried."""
        try:
            context: ConversationContext = await workflow.execute_activity(
                "load_conversation_context",
                start,
                result_type=ConversationContext,
                start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                schedule_to_close_timeout=DB_OUTAGE_TOLERANCE,
                retry_policy=CONTEXT_RETRY,
                summary=f"load {start.tenant_id}/{start.user_id} roles and {start.agent} permissions",
            )
        except ActivityError as err:  # say who is unknown, not only that the workflow failed
            if isinstance(err.cause, ApplicationError) and err.cause.type == "UnknownConversationParty":
                raise ApplicationError(err.cause.message, type=err.cause.type, non_retryable=True) from err
            raise
        self._context = context
        prompt = ChatMessage(role="system", content=context.agent.system_prompt)
        if self._messages and self._messages[0].role == "system":  # carried: today's prompt replaces it
            self._messages[0] = prompt
        else:
            self._messages.insert(0, prompt)
        if self._stored:
            await self._append(context, [StoredMessage(seq=PROMPT_SEQ, message=prompt)])
        return context

    # --- the message store (MESSAGE_STORE) ----------------------------------------------------

    def _record(
        self, message: ChatMessage, error: str | None = None, seq: int | None = None
    ) -> StoredMessage:
        """Give `message` the next sequence number (or `seq`, allocated by `_next_seq` earlier) and
        keep its envelope (the body goes to the store through `_append`, and to this run's
        transcript query)."""
        seq = self._next_seq() if seq is None else seq
        self._cursor.recent.append(envelope_of(seq, message, error))
        self._keep_in_transcript(message)
        return StoredMessage(seq=seq, message=message)

    def _keep_in_transcript(self, message: ChatMessage) -> None:
        """Add `message` to the `transcript` query's latest TRANSCRIPT_KEPT (after the prompt)."""
        self._messages.append(message)
        prompt = 1 if self._messages[0].role == "system" else 0
        del self._messages[prompt : max(prompt, len(self._messages) - TRANSCRIPT_KEPT)]

    def _next_seq(self) -> int:
        self._cursor.next_seq += 1
        return self._cursor.next_seq - 1

    async def _append(self, context: ConversationContext, messages: list[StoredMessage]) -> list[int]:
        """Store `messages`; the seqs refused as redelivered messages. A local activity: its input
        (the bodies) is not recorded in history, only its small result."""
        batch = AppendMessages(
            workflow_id=workflow.info().workflow_id, tenant_id=context.tenant_id, messages=messages
        )
        refused: list[int] = await workflow.execute_local_activity(
            "append_messages",
            batch,
            result_type=list[int],
            start_to_close_timeout=BOOKKEEPING_TIMEOUT,
            schedule_to_close_timeout=DB_OUTAGE_TOLERANCE,
            retry_policy=DB_RETRY,
            summary=f"store {len(messages)} message(s) from seq {messages[0].seq}" if messages else "store",
        )
        return refused

    async def _adopt(self, context: ConversationContext) -> None:
        """Store the transcript a run from before the message store carried, then forget it."""
        carried, self._messages = self._messages, []
        batch = [StoredMessage(seq=PROMPT_SEQ, message=carried[0])] if carried[0].role == "system" else []
        self._messages = carried[:1] if batch else []
        batch += [self._record(m) for m in carried[len(batch) :]]
        await self._append(context, batch)

    async def _accept(self, context: ConversationContext, message: SubmitMessage) -> bool:
        """Store the user's message; False for a redelivered one (its id is stored already)."""
        stored = self._record(ChatMessage(role="user", content=message.text, name=message.user_id))
        stored.message_id = message.message_id
        if await self._append(context, [stored]):
            self._cursor.recent.pop()
            self._messages.pop()
            workflow.logger.warning("message %s was delivered before: answered once", message.message_id)
            return False
        return True

    async def _model_seqs(self, context: ConversationContext) -> list[int]:
        """The sequence numbers the next model call sends: prompt, summary, then the window. What
        falls out of the window is folded into the running summary when the policy asks for one."""
        cursor, policy = self._cursor, context.policy
        kept = select_window(cursor.recent, policy)
        if len(kept) < len(cursor.recent) and policy.summarize:
            kept = select_window(cursor.recent, policy, fold=True)
        dropped = cursor.recent[: len(cursor.recent) - len(kept)]
        cursor.recent = kept
        if dropped and policy.summarize:
            await self._summarize(context, dropped)
        summary = [cursor.summary_seq] if cursor.summary_seq is not None else []
        return [PROMPT_SEQ, *summary, *(e.seq for e in kept)]

    async def _summarize(self, context: ConversationContext, dropped: list[Envelope]) -> None:
        seq = self._next_seq()
        request = SummaryRequest(
            workflow_id=workflow.info().workflow_id,
            tenant_id=context.tenant_id,
            seq=seq,
            previous=self._cursor.summary_seq,
            seqs=[e.seq for e in dropped],
            agent=context.agent.name,
        )
        try:
            done: Summarized = await workflow.execute_activity(
                "summarize_conversation",
                request,
                result_type=Summarized,
                start_to_close_timeout=MODEL_CALL_TIMEOUT,
                retry_policy=MODEL_RETRY,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                summary=f"summarize {len(dropped)} message(s) leaving the window",
            )
        except ActivityError as err:  # the window still holds; only the summary of these is missing
            workflow.logger.error("summary of seqs %s failed: %s", request.seqs, err.cause or err)
            return
        self._cursor.summary_seq = seq
        self._usage = self._usage.plus(done.usage)

    async def _next_message_arrives(self) -> bool:
        try:
            await workflow.wait_condition(
                lambda: (
                    bool(self._inbox)
                    or bool(self._rollbacks)
                    or self._ended_by is not None
                    or history_full(workflow.info())
                ),
                timeout=timedelta(seconds=self._limits.idle_timeout_s),
                timeout_summary="idle timeout",
            )
        except TimeoutError:
            return False
        return True

    def _carry(self, context: ConversationContext | None) -> CarriedState:
        carried = CarriedState(
            context=context,
            messages=[] if self._stored else fit_for_model(trim_for_carry(self._messages), CARRIED_BYTES),
            cursor=self._cursor if self._stored else None,
            usage=self._usage,
            turn=self._turn,
            call_seq=self._call_seq,
            inbox=self._inbox,
            saga=self._saga,
            outbox=self._undelivered,
        )
        return carried

    # --- one turn ---------------------------------------------------------------------------

    async def _run_turn(self, context: ConversationContext, message: SubmitMessage) -> None:
        self._turn += 1
        self._in_turn, self._human_wait_s = True, 0.0
        self._refresh_state()
        try:
            await self._turn_loop(context, message)
        finally:
            self._in_turn = False
        if self._outbox:
            delay = context.email_delivery_delay_s
            self._deliveries.append(asyncio.create_task(self._deliver_after(delay, self._outbox)))
            self._outbox = []

    async def _deliver_after(self, delay_s: float, queued: list[int]) -> None:
        """Deliver a turn's emails once its undo window has passed: a rollback within the window
        cancels them in the outbox, and delivery then finds them cancelled."""
        self._undelivered += queued
        if delay_s > 0:
            await workflow.sleep(delay_s, summary=f"undo window of {len(queued)} email(s)")
        for outbox_id in queued:
            try:
                await workflow.execute_activity(
                    "deliver_email",
                    outbox_id,
                    start_to_close_timeout=timedelta(seconds=60),
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                    retry_policy=DELIVERY_RETRY,
                    summary=f"deliver email {outbox_id} over SMTP",
                )
            except ActivityError as err:  # stays in the outbox, visible to operators; the turn is done
                workflow.logger.error("email %s not delivered: %s", outbox_id, err.cause or err)
            self._undelivered.remove(outbox_id)

    async def _turn_loop(self, context: ConversationContext, message: SubmitMessage) -> None:
        if not self._stored:  # stored by _accept otherwise
            self._messages.append(ChatMessage(role="user", content=message.text, name=message.user_id))
        tools = {t.name: t for t in context.tools}
        offered = [t.openai_tool() for t in offered_tools(context.tools)]
        started = workflow.now()
        turn = Usage()
        while True:
            elapsed = (workflow.now() - started).total_seconds() - self._human_wait_s
            stop = before_model_call(self._limits, turn, elapsed)
            if self._stored:
                stop = stop or budget_refusal(context.policy, self._usage.total_tokens)
            if stop:
                return await self._end_turn(turn, "limit_reached", f"LIMIT_REACHED: {stop}.")
            remaining = timedelta(seconds=self._limits.turn_timeout_s - elapsed)
            try:
                if self._stored:
                    reply, reply_seq = await self._call_stored_model(context, remaining)
                else:
                    reply, reply_seq = await self._call_model(offered, remaining), -1
            except ActivityError as err:
                return await self._end_turn(turn, *self._failure("model call", err))
            turn = turn.plus(reply.usage)
            self._usage = self._usage.plus(reply.usage)
            if self._stored:  # numbered and stored by the model call
                assistant = reply.message
                self._call_seq += len(assistant.tool_calls)
                self._record(assistant, seq=reply_seq)
            else:
                assistant = self._number_calls(reply.message)
                self._messages.append(assistant)
            if not assistant.tool_calls:
                return await self._end_turn(turn, "completed", assistant.content)
            budget = tool_call_budget(self._limits, turn)
            # allocated in call order before any call runs: each result is stored where it belongs
            seqs = [self._next_seq() if self._results_stored else None for _ in assistant.tool_calls]
            results = await asyncio.gather(
                *(
                    self._handle_call(context, tools, call, i < budget, seq)
                    for i, (call, seq) in enumerate(zip(assistant.tool_calls, seqs, strict=True))
                )
            )
            ran = Usage(tool_calls=min(budget, len(results)))
            turn, self._usage = turn.plus(ran), self._usage.plus(ran)
            await self._keep_results(context, assistant.tool_calls, results)
            failed_write = self._failed_write(tools, assistant.tool_calls, results)
            if failed_write and context.agent.atomic_turns:
                undo = self._saga.to_undo("turn", self._turn)
                await self._compensate(context, undo, f"atomic turn: {failed_write} failed")
                return await self._end_turn(
                    turn, "error", f"The turn stopped: {failed_write} failed, so its writes were undone."
                )
            if budget < len(results):
                limit = self._limits.max_tool_calls
                return await self._end_turn(
                    turn, "limit_reached", f"LIMIT_REACHED: the turn reached max_tool_calls ({limit})."
                )

    async def _keep_results(
        self, context: ConversationContext, calls: list[ToolCall], results: list[CallResult]
    ) -> None:
        """Keep a batch's results in call order: the envelope of one its activity stored (since
        TOOL_RESULTS_STORED), else the message, stored here (since MESSAGE_STORE)."""
        batch: list[StoredMessage] = []
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, StoredResult):
                self._cursor.recent.append(stored_envelope(result))
                stub = ChatMessage(role="tool", tool_call_id=call.id, name=call.name, content=result.stub())
                self._keep_in_transcript(stub)
                continue
            message = ChatMessage(
                role="tool", tool_call_id=call.id, name=call.name, content=result.to_content()
            )
            if self._stored:
                batch.append(self._record(message, result.code))
            else:
                self._messages.append(message)
        if batch:
            await self._append(context, batch)

    @staticmethod
    def _failed_write(
        tools: dict[str, ToolSpec], calls: list[ToolCall], results: list[CallResult]
    ) -> str | None:
        """The first write of this batch that failed for good (not a refusal or a question), if any."""
        for call, result in zip(calls, results, strict=True):
            spec = tools.get(call.name)
            failed = result.code in (
                "INTERNAL_ERROR",
                "CONFLICT",
                "NOT_FOUND",
            )
            if spec is not None and spec.category != "read" and failed:
                return f"{call.id} {call.name}"
        return None

    def _failure(self, what: str, err: ActivityError) -> tuple[TurnStop, str]:
        """How an activity that failed for good ends the turn (never the workflow)."""
        if isinstance(err.cause, TemporalTimeoutError):
            return "limit_reached", f"LIMIT_REACHED: the {what} did not finish within turn_timeout_s."
        if isinstance(err.cause, ApplicationError) and err.cause.type == "LimitReached":  # a budget
            return "limit_reached", f"{err.cause.message}."
        cause = err.cause.message if isinstance(err.cause, ApplicationError) else str(err.cause or err)
        return "error", f"The turn stopped: the {what} failed ({cause})."

    async def _end_turn(self, usage: Usage, stop: TurnStop, reply: str | None) -> None:
        if stop != "completed":
            self._last_error = reply
            # since TOOL_RESULTS_STORED the note names how the turn stopped (for `wait_reply`)
            message = ChatMessage(
                role="assistant", content=reply, name=stop if self._results_stored else None
            )
            if self._stored and self._context:
                await self._append(self._context, [self._record(message)])
            else:
                self._messages.append(message)
        self._last_turn = TurnResult(turn=self._turn, reply=reply, stop=stop, usage=usage)
        record_turn(self._start.agent, stop)

    async def _call_model(self, offered: list[dict[str, object]], remaining: timedelta) -> ModelReply:
        reply: ModelReply = await workflow.execute_activity(
            "call_model",
            ModelRequest(
                messages=fit_for_model(self._messages),
                tools=offered,
                caller=self._caller(),
                agent=self._start.agent,
            ),
            result_type=ModelReply,
            start_to_close_timeout=min(MODEL_CALL_TIMEOUT, remaining),
            schedule_to_close_timeout=remaining,
            retry_policy=MODEL_RETRY,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            summary=f"model call (turn {self._turn})",
        )
        return reply

    async def _call_stored_model(
        self, context: ConversationContext, remaining: timedelta
    ) -> tuple[ModelReply, int]:
        """The model call of MESSAGE_STORE: its input is sequence numbers and tool names, its reply
        is stored (numbered from the next call id) by the activity."""
        seqs = await self._model_seqs(context)
        reply_seq = self._next_seq()
        request = StoredInput(
            workflow_id=workflow.info().workflow_id,
            tenant_id=context.tenant_id,
            seqs=seqs,
            reply_seq=reply_seq,
            call_seq=self._call_seq,
            tool_names=[t.name for t in offered_tools(context.tools) if t.mcp is None],
            mcp_tools=[t.openai_tool() for t in offered_tools(context.tools) if t.mcp is not None],
        )
        reply: ModelReply = await workflow.execute_activity(
            "call_model",
            ModelRequest(stored=request, caller=self._caller(), agent=self._start.agent),
            result_type=ModelReply,
            start_to_close_timeout=min(MODEL_CALL_TIMEOUT, remaining),
            schedule_to_close_timeout=remaining,
            retry_policy=MODEL_RETRY,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            summary=f"model call (turn {self._turn}, {len(seqs)} messages)",
        )
        return reply, reply_seq

    def _caller(self) -> ModelCaller:
        return ModelCaller(tenant_id=self._start.tenant_id, agent=self._start.agent, turn=self._turn)

    def _number_calls(self, message: ChatMessage) -> ChatMessage:
        """Give each tool call a conversation-wide id (`c1`, `c2`, …), see `numbered`."""
        message = numbered(message, self._call_seq)
        self._call_seq += len(message.tool_calls)
        return message

    # --- one tool call ----------------------------------------------------------------------

    async def _handle_call(
        self,
        context: ConversationContext,
        tools: dict[str, ToolSpec],
        call: ToolCall,
        within_budget: bool,
        seq: int | None = None,
    ) -> CallResult:
        """Screen, check, approve or ask, and run one call; `seq`: where its result is stored."""
        invocation = self._invocation(context, call, seq)
        if not within_budget:
            limit = ToolResult.failure(
                "LIMIT_REACHED", f"max_tool_calls ({self._limits.max_tool_calls}) reached"
            )
            return await self._unexecuted(invocation, limit)
        screening = screen_call(call, tools, context.roles)
        if screening.refusal is not None:
            return await self._unexecuted(invocation, screening.refusal)
        if screening.action == "run":
            return await self._execute(invocation)
        checked = await self._check_arguments(invocation)
        if not checked.ok:
            return await self._unexecuted(invocation, checked)
        if screening.action == "ask_human":
            return await self._ask_human(context, invocation, str(checked.data["question"]))
        assert screening.spec is not None
        return await self._run_after_approval(context, invocation, screening.spec)

    def _invocation(
        self, context: ConversationContext, call: ToolCall, seq: int | None = None
    ) -> ToolInvocation:
        info = workflow.info()
        return ToolInvocation(
            caller=CallerContext(
                tenant_id=context.tenant_id,
                user_id=context.user_id,
                roles=context.roles,
                agent=context.agent.name,
            ),
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            call_id=call.id,
            tool=call.name,
            arguments=call.arguments,
            turn=self._turn,
            store_seq=seq,
        )

    async def _unexecuted(
        self, invocation: ToolInvocation, result: ToolResult, reason: str | None = None
    ) -> CallResult:
        """Audit a call that did not run, then hand its envelope to the model: since
        TOOL_RESULTS_STORED stored with its audit row (a local activity: its input, the envelope,
        is not recorded in history), and kept as a `StoredResult`."""
        await self._bookkeeping(
            "record_unexecuted_call",
            UnexecutedCall(invocation=invocation, result=result, reason=reason),
            f"audit {invocation.tool} ({result.error.code if result.error else 'not run'})",
        )
        return tool_message(invocation, result)[1] if invocation.store_seq is not None else result

    async def _check_arguments(self, invocation: ToolInvocation) -> ToolResult:
        spec = self._spec(invocation.tool)
        checked: ToolResult = await (
            self._bookkeeping(
                "check_mcp_arguments",
                McpCall(invocation=invocation, spec=spec),
                f"validate {invocation.tool} arguments",
                ToolResult,
            )
            if spec is not None and spec.mcp is not None
            else self._bookkeeping(
                "check_arguments", invocation, f"validate {invocation.tool} arguments", ToolResult
            )
        )
        return checked

    def _spec(self, tool: str) -> ToolSpec | None:
        return next((t for t in self._context.tools if t.name == tool), None) if self._context else None

    def _mcp_spec(self, tool: str) -> ToolSpec | None:
        """The snapshotted spec of an MCP tool (its input schema checks an approver's edits), else None."""
        spec = self._spec(tool)
        return spec if spec is not None and spec.mcp is not None else None

    async def _bookkeeping(
        self, activity: str, arg: object, summary: str, result_type: type | None = None, *, local: bool = True
    ) -> Any:
        """Short bookkeeping: argument checks (no I/O), audit rows, decision checks, reminders.

        The hot ones are local activities (run in the workflow task, recorded as markers, no
        round trip through a task queue) in conversations started since LOCAL_BOOKKEEPING; older
        histories replay the activities they ran.
        """
        options: dict[str, Any] = {
            "result_type": result_type,
            "summary": summary,
            "start_to_close_timeout": BOOKKEEPING_TIMEOUT,
            "schedule_to_close_timeout": DB_OUTAGE_TOLERANCE,
            "retry_policy": DB_RETRY,
        }
        if local and workflow.patched(LOCAL_BOOKKEEPING):
            return await workflow.execute_local_activity(activity, arg, **options)
        return await workflow.execute_activity(activity, arg, **options)

    # --- approvals --------------------------------------------------------------------------

    async def _run_after_approval(
        self, context: ConversationContext, invocation: ToolInvocation, spec: ToolSpec
    ) -> CallResult:
        now = workflow.now()
        timeout = timedelta(seconds=context.approval.timeout_for(spec.risk, self._limits.approval_timeout_s))
        approval = Approval(
            call_id=invocation.call_id,
            tool=spec.name,
            args=invocation.arguments,
            risk=spec.risk,
            requested_by=context.user_id,
            requested_at=now,
            expires_at=now + timeout,
            hints=spec.mcp.hints() if spec.mcp else None,
        )
        self._approvals[approval.call_id] = approval
        self._notify(approval, "request")
        await self._wait_for_people(self._await_decision(context, approval))
        record_approval_wait(spec.risk, approval.state, (workflow.now() - now).total_seconds())
        if approval.state == "approved":
            arguments = approval.edited_args or invocation.arguments
            edit = {"model_arguments": invocation.arguments} if approval.edited_args is not None else {}
            approved = invocation.model_copy(
                update={"arguments": arguments, "approved_by": approval.decided_by, **edit}
            )
            result = await self._execute(approved)
            # the model is told of an approver's edit (by the tool activity, for a stored result)
            return result_for_model(approved, result) if isinstance(result, ToolResult) else result
        if approval.state == "rejected":
            why = f": {approval.reason}" if approval.reason else ""
            refusal = ToolResult.failure("REJECTED", f"{approval.decided_by} rejected {spec.name}{why}")
            return await self._unexecuted(invocation, refusal, f"rejected by {approval.decided_by}{why}")
        expired = ToolResult.failure(
            "EXPIRED", f"nobody decided on {spec.name} before {approval.expires_at.isoformat()}"
        )
        return await self._unexecuted(invocation, expired, "no decision before expiry")

    async def _await_decision(self, context: ConversationContext, approval: Approval) -> None:
        """Wait for a decision until expiry, reminding reviewers once before it. Fail closed:
        at expiry the call is marked expired, unless a decision already in flight accepts it."""
        lead = timedelta(seconds=context.approval.reminder_lead_s)
        remind_at = approval.expires_at - lead
        if remind_at > workflow.now() and not await self._decided_by(remind_at, approval, "reminder"):
            await self._bookkeeping(
                "send_approval_reminder",
                ApprovalReminder(
                    tenant_id=context.tenant_id,
                    workflow_id=workflow.info().workflow_id,
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

    def _notify(self, approval: Approval, kind: NoticeKind) -> None:
        """Tell reviewers (email, webhook) in the background: a slow mail server never delays the
        approval. Sent before the conversation ends or continues as new."""
        if not self._notify_reviewers:
            return
        notice = ApprovalNotice(
            kind=kind,
            tenant_id=self._start.tenant_id,
            workflow_id=workflow.info().workflow_id,
            call_id=approval.call_id,
            tool=approval.tool,
            args=approval.args,
            risk=approval.risk,
            requested_by=approval.requested_by,
            expires_at=approval.expires_at,
        )

        async def send() -> None:
            try:
                await workflow.execute_activity(
                    "notify_approval",
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

    async def _notices_sent(self) -> None:
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

    async def _decided_by(self, moment: datetime, approval: Approval, label: str) -> bool:
        try:
            await workflow.wait_condition(
                lambda: approval.state != "pending",
                timeout=max(moment - workflow.now(), timedelta(0)),
                timeout_summary=f"approval {approval.call_id} ({approval.tool}) {label}",
            )
        except TimeoutError:
            return False
        return True

    async def _wait_for_people(self, waiting: Awaitable[None]) -> None:
        """Await a human, with the wait kept off the turn's wall-clock budget and shown in state."""
        started = workflow.now()
        self._refresh_state()
        # Not a `finally`: when a worker evicts the conversation from its cache, the coroutine is
        # closed (GeneratorExit), and no workflow call may run then.
        try:
            await waiting
        except (Exception, asyncio.CancelledError):
            self._waited_since(started)
            raise
        self._waited_since(started)

    def _waited_since(self, started: datetime) -> None:
        self._human_wait_s += (workflow.now() - started).total_seconds()
        self._refresh_state()

    async def _decide(self, decision: Decision) -> Approval:
        """Apply one decision, whichever way it arrived. Refusals raise and are audited too."""
        # one decision at a time per call: a second waits for the first, then meets its outcome
        await workflow.wait_condition(lambda: decision.call_id not in self._deciding)
        approval = self._approvals.get(decision.call_id)
        refusal = state_refusal(approval, decision, workflow.now())
        if approval is not None and refusal is None:
            self._deciding.add(decision.call_id)
        try:
            verdict: Verdict = await self._bookkeeping(
                "record_decision",
                DecisionRecord(
                    tenant_id=self._start.tenant_id,
                    workflow_id=workflow.info().workflow_id,
                    tool=approval.tool if approval else "?",
                    risk=approval.risk if approval else "high",
                    requested_by=approval.requested_by if approval else self._start.user_id,
                    decision=decision,
                    refusal=refusal,
                    args=approval.args if approval else None,
                    mcp_spec=self._mcp_spec(approval.tool) if approval else None,
                ),
                f"{decision.decision} {decision.call_id} by {decision.approver}",
                Verdict,
            )
        finally:
            self._deciding.discard(decision.call_id)
        if not verdict.accepted or approval is None:
            raise ApplicationError(
                f"decision refused: {verdict.reason}", type="DecisionRefused", non_retryable=True
            )
        approval.state = "approved" if decision.decision == "approve" else "rejected"
        approval.decided_by, approval.reason, approval.edited_args = (
            decision.approver,
            decision.reason,
            verdict.args,
        )
        return approval

    # --- ask_human --------------------------------------------------------------------------

    async def _ask_human(
        self, context: ConversationContext, invocation: ToolInvocation, question: str
    ) -> CallResult:
        call = ToolCall(id=invocation.call_id, name=invocation.tool, arguments=invocation.arguments)
        now = workflow.now()
        expires = now + timedelta(seconds=self._limits.answer_timeout_s)
        self._questions[call.id] = PendingQuestion(
            call_id=call.id, question=question, asked_at=now.isoformat(), expires_at=expires.isoformat()
        )

        async def answered() -> None:
            try:
                await workflow.wait_condition(
                    lambda: call.id in self._answers,
                    timeout=expires - now,
                    timeout_summary=f"question {call.id} expires",
                )
            except TimeoutError:
                pass
            finally:
                del self._questions[call.id]

        await self._wait_for_people(answered())
        if call.id not in self._answers:
            return await self._unexecuted(
                invocation,
                ToolResult.failure("EXPIRED", f"the user did not answer before {expires.isoformat()}"),
            )
        answer = ToolResult.success({"answer": self._answers[call.id]})
        if invocation.store_seq is None:
            return answer
        message, stored = tool_message(invocation, answer)  # the answer arrived by signal: stored once
        await self._append(context, [message])
        return stored

    async def _execute(self, invocation: ToolInvocation) -> CallResult:
        spec = self._spec(invocation.tool)
        entry = None
        # before the forward step: a commit that then times out is undone too. An MCP call is
        # registered too, so that a rollback reports it (irreversible: it declares no compensation).
        if spec is not None and (spec.compensable or spec.mcp is not None):
            entry = self._saga.register(invocation.call_id, invocation.tool, self._turn, invocation.arguments)
        options: dict[str, Any] = {
            "result_type": ToolResult if invocation.store_seq is None else StoredResult,
            "start_to_close_timeout": TOOL_CALL_TIMEOUT,
            "schedule_to_close_timeout": DB_OUTAGE_TOLERANCE,
            "retry_policy": DB_RETRY,
            "summary": call_summary(invocation.tool, invocation.arguments),
            # on cancellation, learn how the step ended before compensating it
            "cancellation_type": workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        }
        try:
            result: CallResult = await (
                workflow.execute_local_activity("execute_tool", invocation, **options)
                if spec is not None and spec.local
                else workflow.execute_activity(
                    "execute_mcp_tool",
                    McpCall(invocation=invocation, spec=spec),
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                    **options,
                )
                if spec is not None and spec.mcp is not None
                else workflow.execute_activity(
                    "execute_tool", invocation, heartbeat_timeout=HEARTBEAT_TIMEOUT, **options
                )
            )
        except ActivityError as err:
            if not workflow.patched(HOSTILE_INPUT):
                cause = (
                    err.cause.message if isinstance(err.cause, ApplicationError) else str(err.cause or err)
                )
                return ToolResult.failure("INTERNAL_ERROR", f"{invocation.tool} failed: {cause}")
            # An unreachable database (after its retries), a timeout, or a statement the database
            # refused (activities/failures.py; its transaction, effect included, rolled back) gets
            # here: say which without internals, and audit the call (a row already written stays).
            why = (
                "timed out"
                if isinstance(err.cause, TemporalTimeoutError)
                else "was refused by the database"
                if isinstance(err.cause, ApplicationError) and err.cause.type == "DatabaseRefused"
                else "could not reach the database"
            )
            failure = ToolResult.failure("INTERNAL_ERROR", f"{invocation.tool} {why}; it did not run")
            return await self._unexecuted(invocation, failure)
        if isinstance(result, StoredResult):  # a compensation reads the result from the call's audit row
            if entry is not None and result.ok:
                self._outbox.extend(result.outbox)
        elif entry is not None and result.ok and isinstance(result.data, dict):
            entry.result = result.data
            self._outbox.extend(queued_emails(invocation.tool, result.data))
        return result

    # --- saga -------------------------------------------------------------------------------

    async def _run_rollbacks(self, context: ConversationContext) -> None:
        """Run every accepted rollback, after those still being authorized: a rollback sent just
        before `end` (or before continue-as-new) is accepted and runs, never dropped."""
        await workflow.wait_condition(lambda: self._authorizing == 0)
        while self._rollbacks:
            await self._roll_back(context, self._rollbacks.pop(0))

    async def _roll_back(self, context: ConversationContext, request: RollbackRequest) -> None:
        scope = f"{request.scope} {request.call_id or ''}".strip()
        undo = self._saga.to_undo(request.scope, self._turn, request.call_id)
        await self._compensate(context, undo, f"rollback ({scope}) by {request.requested_by}")

    async def _compensate(self, context: ConversationContext, entries: list[SagaEntry], why: str) -> None:
        """Undo `entries` in the order given (newest first). A compensation that fails for good is
        recorded with its error and the rest still run: nothing is silently dropped."""
        if not entries:
            return
        self._rolling_back = True
        self._refresh_state()
        caller = self._invocation(context, ToolCall(id="-", name="-")).caller
        for entry in entries:
            request = CompensationRequest(caller=caller, workflow_id=workflow.info().workflow_id, entry=entry)
            if not await compensated(request):
                await self._record_failure(request)
        self._rolling_back = False
        undone = ", ".join(f"{e.call_id} {e.tool}: {e.state}" for e in entries)
        note = ChatMessage(role="system", content=f"Rolled back, {why}: {undone}.")
        if self._stored:
            await self._append(context, [self._record(note)])
        else:
            self._messages.append(note)
        self._refresh_state()

    async def _record_failure(self, request: CompensationRequest) -> None:
        try:
            await self._bookkeeping(
                "record_compensation_failure",
                request,
                f"record failed undo of {request.entry.call_id}",
                local=False,
            )
        except ActivityError:
            workflow.logger.error("could not record the failed compensation of %s", request.entry.call_id)

    @workflow.signal(name="rollback")
    async def rollback(self, request: RollbackRequest | Unreadable) -> None:
        """Queue an authorized rollback; it runs between turns. A refusal is audited, nothing else."""
        if isinstance(request, Unreadable):
            return await self._refuse_unreadable("rollback", request)
        if request.scope == "call" and not request.call_id:
            return await self._refuse(
                "rollback", request.requested_by, "a rollback of scope call needs a call_id"
            )
        self._authorizing += 1
        try:
            refusal: str = await self._bookkeeping(
                "authorize_rollback",
                RollbackAuthorization(
                    tenant_id=self._start.tenant_id,
                    workflow_id=workflow.info().workflow_id,
                    conversation_user=self._start.user_id,
                    request=request,
                ),
                f"authorize rollback ({request.scope}) by {request.requested_by}",
                str,
                local=False,
            )
            if refusal:
                workflow.logger.warning("rollback refused: %s", refusal)
            else:
                self._rollbacks.append(request)
        except ActivityError as err:  # the database stayed out of reach: refused, never a failed workflow
            workflow.logger.error("rollback by %s not authorized: %s", request.requested_by, err.cause or err)
        finally:
            self._authorizing -= 1

    @workflow.query(name="saga")
    def saga(self) -> Saga:
        return self._saga

    # --- state, signals, queries, updates ---------------------------------------------------

    def _current_state(self) -> AgentState:
        if self._rolling_back:
            return "rolling_back"
        if self._ended_by is not None and not self._in_turn:
            return "ended"
        if any(a.state == "pending" for a in self._approvals.values()):
            return "awaiting_approval"
        if self._questions:
            return "awaiting_answer"
        return "running" if self._in_turn or self._inbox else "idle"

    def _refresh_state(self) -> None:
        """Recompute the state; keep the AgentStatus search attribute and the UI details in step."""
        state = self._current_state()
        if state != self._state:
            workflow.upsert_search_attributes([AGENT_STATUS.value_set(state)])
        self._state = state
        context, usage = self._context, self._usage
        who = f"{context.tenant_id}/{context.user_id} · agent {context.agent.name}" if context else ""
        lines = [
            f"**{state}** · turn {self._turn} · {who}",
            f"usage: {usage.total_tokens} tokens, {usage.model_calls} model calls, "
            f"{usage.tool_calls} tool calls",
        ]
        lines += [
            f"- awaiting approval: `{a.call_id}` {call_summary(a.tool, a.args)} "
            f"(risk {a.risk}, expires {a.expires_at:%Y-%m-%d %H:%M} UTC)"
            + (f" · {a.hints}" if a.hints else "")
            for a in self._approvals.values()
            if a.state == "pending"
        ]
        lines += [
            f"- awaiting answer: `{q.call_id}` {escape_markdown(q.question)}"
            for q in self._questions.values()
        ]
        workflow.set_current_details(
            "\n\n".join(lines[:2]) + ("\n\n" + "\n".join(lines[2:]) if lines[2:] else "")
        )

    # Client input is untrusted (docs/security.md): a payload that does not decode arrives as
    # `Unreadable` (countersign.runtime.payloads) and every refusal is recorded by `authorize_action`.

    async def _refuse(self, action: Action, actor: str | None, refusal: str, excerpt: str = "") -> None:
        """Record a refused client input (`input_audit`); it changes nothing else."""
        workflow.logger.warning("%s by %s refused: %s", action, actor, refusal)
        if workflow.patched(HOSTILE_INPUT):
            await self._authorize(action, actor, refusal, excerpt)

    async def _refuse_unreadable(self, action: Action, payload: Unreadable) -> None:
        await self._refuse(action, None, f"unreadable payload: {payload.unreadable}", payload.excerpt)

    async def _authorize(
        self, action: Action, actor: str | None, refusal: str | None = None, excerpt: str = ""
    ) -> str:
        """ "" when the database says `actor` may take `action`, else why not (recorded either way).
        A check that cannot reach the database refuses: fail closed, never a failed workflow."""
        check = ActionCheck(
            tenant_id=self._start.tenant_id,
            workflow_id=workflow.info().workflow_id,
            action=action,
            actor=actor,
            conversation_user=self._start.user_id,
            refusal=refusal,
            excerpt=excerpt,
        )
        try:
            answer: str = await self._bookkeeping(
                "authorize_action", check, f"authorize {action} by {actor}", str
            )
        except ActivityError as err:
            workflow.logger.error("%s by %s could not be checked: %s", action, actor, err.cause or err)
            return "the authority check could not reach the database"
        return answer

    @workflow.signal(name="submit_message")
    async def submit_message(self, message: SubmitMessage | Unreadable) -> None:
        if isinstance(message, Unreadable):
            return await self._refuse_unreadable("submit_message", message)
        refusal = action_state_refusal("submit_message", message.user_id, self._start.user_id)
        queued = any(m.message_id == message.message_id for m in self._inbox)
        if refusal is None and message.message_id and (queued or message.message_id in self._cursor.answered):
            workflow.logger.warning("message %s was delivered before: answered once", message.message_id)
            return
        if refusal is None and self._ended_by is None and len(self._inbox) >= MAX_INBOX:
            refusal = f"{MAX_INBOX} messages already wait for their turn; send this one later"
        if refusal is not None:
            if message.message_id:  # its sender may be waiting for the reply: tell them why not
                self._refused_messages[message.message_id] = refusal
                while len(self._refused_messages) > REPLIES_KEPT:
                    del self._refused_messages[next(iter(self._refused_messages))]
            return await self._refuse("submit_message", message.user_id, refusal)
        if self._ended_by is None:
            self._inbox.append(message)

    @workflow.signal(name="end")
    async def end(self, request: EndConversation | Unreadable) -> None:
        """End the conversation: for its user or a tenant admin (the database says which), with a
        proof in APPROVER_AUTH=signed. A refusal is recorded and changes nothing."""
        if isinstance(request, Unreadable):
            return await self._refuse_unreadable("end", request)
        if not workflow.patched(HOSTILE_INPUT):
            self._ended_by = self._ended_by or f"end by {request.requested_by}"
            return
        self._authorizing += 1  # an end accepted while rollbacks wait still lets them run first
        try:
            refusal = await self._authorize("end", request.requested_by)
            proven = not refusal and await self._proven("end", request.requested_by, request.proof)
        finally:
            self._authorizing -= 1
        if proven:
            self._ended_by = self._ended_by or f"end by {request.requested_by}"

    async def _proven(
        self, action: Literal["answer", "end"], actor: str, proof: str | None, **bound: str
    ) -> bool:
        """Whether a proof shows `actor` may take `action` (in APPROVER_AUTH=names mode, always);
        a refusal is recorded by the activity and logged. Conversations started before proofs
        existed take the action as they did."""
        if not self._proof_checked_signals:
            return True
        refusal: str = await self._bookkeeping(
            "check_action_proof",
            ProofRequest(
                tenant_id=self._start.tenant_id,
                workflow_id=workflow.info().workflow_id,
                action=action,
                actor=actor,
                proof=proof,
                **bound,
            ),
            f"check {actor}'s proof for {action}",
            str,
        )
        if refusal:
            workflow.logger.warning("%s by %s refused: %s", action, actor, refusal)
        return not refusal

    @workflow.signal(name="approve")
    async def approve(self, signal: ApproveSignal | Unreadable) -> None:
        if isinstance(signal, Unreadable):
            return await self._refuse_unreadable("approve", signal)
        await self._decide_quietly(signal.decision())

    @workflow.signal(name="reject")
    async def reject(self, signal: RejectSignal | Unreadable) -> None:
        if isinstance(signal, Unreadable):
            return await self._refuse_unreadable("reject", signal)
        await self._decide_quietly(signal.decision())

    async def _decide_quietly(self, decision: Decision) -> None:
        """A signal has no caller to answer: a refused decision changes nothing and is audited."""
        try:
            await self._decide(decision)
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
            await self._refuse_unreadable("decide", decision)
            raise ApplicationError(
                f"decision refused: unreadable payload: {decision.unreadable}",
                type="DecisionRefused",
                non_retryable=True,
            )
        return await self._decide(decision)

    @workflow.signal(name="answer")
    async def answer(self, answer: AnswerSignal | Unreadable) -> None:
        if isinstance(answer, Unreadable):
            return await self._refuse_unreadable("answer", answer)

        def open_question() -> bool:
            return answer.call_id in self._questions and answer.call_id not in self._answers

        refusal = action_state_refusal("answer", answer.user_id, self._start.user_id)
        if refusal is None and not open_question():
            refusal = f"no question {answer.call_id!r} waits for an answer"
        if refusal is not None:
            return await self._refuse("answer", answer.user_id, refusal)
        proven = await self._proven(
            "answer", answer.user_id, answer.proof, call_id=answer.call_id, text=answer.text
        )
        if proven and open_question():  # a second answer may have arrived while the proof was checked
            self._answers[answer.call_id] = answer.text

    @workflow.update(
        name="wait_turn", unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON
    )  # waits only
    async def wait_turn(self, turn: int) -> TurnResult | None:
        """Answers when turn `turn` has finished (None if the conversation ended, or continued-as-new,
        first: ask the new run)."""
        await workflow.wait_condition(
            lambda: (
                (self._last_turn is not None and self._last_turn.turn >= turn)
                or self._state == "ended"
                or self._continuing
            )
        )
        last = self._last_turn
        return last if last is not None and last.turn >= turn else None

    @workflow.update(
        name="wait_reply", unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON
    )  # waits only
    async def wait_reply(self, message_id: str) -> TurnResult | None:
        """Answers with the turn that replied to the message sent with `message_id` (None if the
        conversation ended, or continued-as-new, first: ask the new run)."""
        await workflow.wait_condition(
            lambda: (
                message_id in self._replies
                or message_id in self._cursor.answered
                or message_id in self._refused_messages
                or self._state == "ended"
                or self._continuing
            )
        )
        if message_id in self._refused_messages:
            raise ApplicationError(
                f"message refused: {self._refused_messages[message_id]}",
                type="MessageRefused",
                non_retryable=True,
            )
        if message_id not in self._replies and message_id in self._cursor.answered:
            # answered in an earlier run: its reply is in the conversation store
            return await self._earlier_reply(message_id, self._cursor.answered[message_id])
        return self._replies.get(message_id)

    async def _earlier_reply(self, message_id: str, turn: int) -> TurnResult:
        """The turn an earlier run answered `message_id` with, read from the conversation store once
        per run (then kept with this run's replies). Before TOOL_RESULTS_STORED: no reply text."""
        if not self._results_stored:
            return TurnResult(turn=turn, reply=None, stop="completed", usage=Usage())
        replied = RepliedTurn(workflow_id=workflow.info().workflow_id, message_id=message_id, turn=turn)
        try:
            result: TurnResult = await self._bookkeeping(
                "load_turn_reply", replied, f"load the reply to message {message_id}", TurnResult
            )
        except ActivityError as err:  # the store stayed out of reach: the turn, without its text
            workflow.logger.error("reply to %s not loaded: %s", message_id, err.cause or err)
            return TurnResult(turn=turn, reply=None, stop="completed", usage=Usage())
        if message_id not in self._replies:
            self._replies[message_id] = result
            while len(self._replies) > REPLIES_KEPT:
                del self._replies[next(iter(self._replies))]
        return result

    @workflow.query(name="status")
    def status(self) -> StatusView:
        return StatusView(
            state=self._state,
            turn=self._turn,
            usage=self._usage,
            limits=self._limits,
            tenant_id=self._start.tenant_id,
            user_id=self._start.user_id,
            agent=self._start.agent,
            last_error=self._last_error,
            pending_approvals=[
                a.pending_view(self._mcp_spec(a.tool))
                for a in self._approvals.values()
                if a.state == "pending"
            ],
            pending_questions=list(self._questions.values()),
            compensation_failures=self._saga.failures(),
            policy=self._context.policy if self._stored and self._context else None,
        )

    @workflow.query(name="transcript")
    def transcript(self) -> list[ChatMessage]:
        """This run's messages. Since the message store, earlier runs' are in PostgreSQL:
        `starter.py transcript WF` reads the whole conversation from there."""
        return self._messages
