"""AgentWorkflow: one conversation between a user and an agent, as deterministic Temporal code.

A turn is the tool-calling loop: call the model (an activity), run the tool calls it asks for
(each an activity, several concurrently, results fed back in call order), and repeat until the
model answers in plain text or a limit stops the turn. Between turns the conversation waits for
the next `submit_message`, an `end`, or its idle timeout.

Everything the loop decides is delegated to pure functions (countersign.policy, countersign.limits);
everything that touches the world is an activity, referenced by name so this module imports no I/O.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from countersign.chat import ChatMessage, ModelReply, ModelRequest, ToolCall, Usage
    from countersign.conversation import (
        WORKFLOW_TYPE,
        AgentState,
        CarriedState,
        ConversationContext,
        ConversationResult,
        EndConversation,
        StartConversation,
        StatusView,
        SubmitMessage,
        TurnResult,
        TurnStop,
    )
    from countersign.limits import before_model_call, tool_call_budget
    from countersign.policy import offered_tools, screen_call
    from countersign.search_attributes import AGENT_NAME, AGENT_STATUS, TENANT_ID
    from countersign.tooling import CallerContext, ToolInvocation, ToolResult, ToolSpec

CONTEXT_RETRY = RetryPolicy(maximum_attempts=5, non_retryable_error_types=["UnknownConversationParty"])
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=6
)
TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500), maximum_interval=timedelta(seconds=10), maximum_attempts=8
)
MODEL_CALL_TIMEOUT = timedelta(seconds=120)
TOOL_CALL_TIMEOUT = timedelta(seconds=60)


def call_summary(call: ToolCall) -> str:
    """A one-line label for the Web UI: `get_lead jane.doe@example.com`."""
    try:
        args = json.loads(call.arguments)
        values = " ".join(str(v) for v in args.values() if v is not None) if isinstance(args, dict) else ""
    except json.JSONDecodeError:
        values = "(invalid JSON arguments)"
    return f"{call.name} {values}"[:200].strip()


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflow:
    @workflow.init
    def __init__(self, start: StartConversation) -> None:
        carried = start.carried
        self._start = start
        self._limits = start.limits
        self._context: ConversationContext | None = carried.context if carried else None
        self._messages: list[ChatMessage] = list(carried.messages) if carried else []
        self._usage = carried.usage if carried else Usage()
        self._turn = carried.turn if carried else 0
        self._call_seq = carried.call_seq if carried else 0
        self._inbox: list[SubmitMessage] = list(carried.inbox) if carried else []
        if start.message and not carried:
            self._inbox.append(SubmitMessage(user_id=start.user_id, text=start.message))
        self._state: AgentState = "running"
        self._last_turn: TurnResult | None = None
        self._ended_by: str | None = None
        self._last_error: str | None = None

    # --- the conversation -------------------------------------------------------------------

    @workflow.run
    async def run(self, start: StartConversation) -> ConversationResult:
        context = self._context or await self._load_context(start)
        workflow.upsert_search_attributes(
            [TENANT_ID.value_set(context.tenant_id), AGENT_NAME.value_set(context.agent.name)]
        )
        while True:
            self._set_state("running" if self._inbox else "idle")
            if not await self._next_message_arrives():
                self._ended_by = self._ended_by or "idle_timeout"
            if self._ended_by:
                break
            await self._run_turn(context, self._inbox.pop(0))
            if start.single_turn:
                self._ended_by = "single_turn"
                break
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carry(context))
        self._set_state("ended")
        await workflow.wait_condition(workflow.all_handlers_finished)
        last = self._last_turn
        return ConversationResult(
            turns=self._turn, last_reply=last.reply if last else None, usage=self._usage, ended_by=self._ended_by
        )

    async def _load_context(self, start: StartConversation) -> ConversationContext:
        context = await workflow.execute_activity(
            "load_conversation_context",
            start,
            result_type=ConversationContext,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=CONTEXT_RETRY,
            summary=f"load {start.tenant_id}/{start.user_id} roles and {start.agent} permissions",
        )
        self._context = context
        self._messages.insert(0, ChatMessage(role="system", content=context.agent.system_prompt))
        return context

    async def _next_message_arrives(self) -> bool:
        try:
            await workflow.wait_condition(
                lambda: bool(self._inbox) or self._ended_by is not None,
                timeout=timedelta(seconds=self._limits.idle_timeout_s),
                timeout_summary="idle timeout",
            )
        except asyncio.TimeoutError:
            return False
        return True

    def _carry(self, context: ConversationContext) -> StartConversation:
        carried = CarriedState(
            context=context,
            messages=self._messages,
            usage=self._usage,
            turn=self._turn,
            call_seq=self._call_seq,
            inbox=self._inbox,
        )
        return self._start.model_copy(update={"message": None, "carried": carried})

    # --- one turn ---------------------------------------------------------------------------

    async def _run_turn(self, context: ConversationContext, message: SubmitMessage) -> None:
        self._turn += 1
        self._set_state("running")
        self._messages.append(ChatMessage(role="user", content=message.text, name=message.user_id))
        tools = {t.name: t for t in context.tools}
        offered = [t.openai_tool() for t in offered_tools(context.tools)]
        started = workflow.now()
        turn = Usage()
        while True:
            elapsed = (workflow.now() - started).total_seconds()
            stop = before_model_call(self._limits, turn, elapsed)
            if stop:
                return self._end_turn(turn, "limit_reached", f"LIMIT_REACHED: {stop}.")
            remaining = timedelta(seconds=self._limits.turn_timeout_s - elapsed)
            try:
                reply = await self._call_model(offered, remaining)
            except ActivityError as err:
                return self._end_turn(turn, *self._failure("model call", err))
            turn = turn.plus(reply.usage)
            self._usage = self._usage.plus(reply.usage)
            assistant = self._number_calls(reply.message)
            self._messages.append(assistant)
            if not assistant.tool_calls:
                return self._end_turn(turn, "completed", assistant.content)
            budget = tool_call_budget(self._limits, turn)
            results = await asyncio.gather(
                *(self._handle_call(context, tools, call, i < budget) for i, call in enumerate(assistant.tool_calls))
            )
            ran = Usage(tool_calls=min(budget, len(results)))
            turn, self._usage = turn.plus(ran), self._usage.plus(ran)
            for call, result in zip(assistant.tool_calls, results, strict=True):
                self._messages.append(
                    ChatMessage(role="tool", tool_call_id=call.id, name=call.name, content=result.to_content())
                )
            if budget < len(results):
                limit = self._limits.max_tool_calls
                return self._end_turn(turn, "limit_reached", f"LIMIT_REACHED: the turn reached max_tool_calls ({limit}).")

    def _failure(self, what: str, err: ActivityError) -> tuple[TurnStop, str]:
        """How an activity that failed for good ends the turn (never the workflow)."""
        if isinstance(err.cause, TemporalTimeoutError):
            return "limit_reached", f"LIMIT_REACHED: the {what} did not finish within turn_timeout_s."
        cause = err.cause.message if isinstance(err.cause, ApplicationError) else str(err.cause or err)
        return "error", f"The turn stopped: the {what} failed ({cause})."

    def _end_turn(self, usage: Usage, stop: TurnStop, reply: str | None) -> None:
        if stop != "completed":
            self._last_error = reply
            self._messages.append(ChatMessage(role="assistant", content=reply))
        self._last_turn = TurnResult(turn=self._turn, reply=reply, stop=stop, usage=usage)

    async def _call_model(self, offered: list[dict[str, object]], remaining: timedelta) -> ModelReply:
        return await workflow.execute_activity(
            "call_model",
            ModelRequest(messages=self._messages, tools=offered),
            result_type=ModelReply,
            start_to_close_timeout=min(MODEL_CALL_TIMEOUT, remaining),
            schedule_to_close_timeout=remaining,
            retry_policy=MODEL_RETRY,
            summary=f"model call (turn {self._turn})",
        )

    def _number_calls(self, message: ChatMessage) -> ChatMessage:
        """Give each tool call a conversation-wide id (`c1`, `c2`, …): reviewers type these, the
        audit and idempotency keys use them, and a model's own ids may repeat across turns."""
        calls = []
        for call in message.tool_calls:
            self._call_seq += 1
            calls.append(call.model_copy(update={"id": f"c{self._call_seq}"}))
        return message.model_copy(update={"tool_calls": calls})

    # --- one tool call ----------------------------------------------------------------------

    async def _handle_call(
        self, context: ConversationContext, tools: dict[str, ToolSpec], call: ToolCall, within_budget: bool
    ) -> ToolResult:
        if not within_budget:
            return ToolResult.failure("LIMIT_REACHED", f"max_tool_calls ({self._limits.max_tool_calls}) reached")
        screening = screen_call(call, tools, context.roles)
        if screening.refusal is not None:
            return screening.refusal
        return await self._execute(context, call)

    async def _execute(self, context: ConversationContext, call: ToolCall) -> ToolResult:
        info = workflow.info()
        invocation = ToolInvocation(
            caller=CallerContext(
                tenant_id=context.tenant_id, user_id=context.user_id, roles=context.roles, agent=context.agent.name
            ),
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            call_id=call.id,
            tool=call.name,
            arguments=call.arguments,
            turn=self._turn,
        )
        try:
            return await workflow.execute_activity(
                "execute_tool",
                invocation,
                result_type=ToolResult,
                start_to_close_timeout=TOOL_CALL_TIMEOUT,
                retry_policy=TOOL_RETRY,
                summary=call_summary(call),
            )
        except ActivityError as err:
            cause = err.cause.message if isinstance(err.cause, ApplicationError) else str(err.cause or err)
            return ToolResult.failure("INTERNAL_ERROR", f"{call.name} failed: {cause}")

    # --- state, signals, queries, updates ---------------------------------------------------

    def _set_state(self, state: AgentState) -> None:
        self._state = state
        workflow.upsert_search_attributes([AGENT_STATUS.value_set(state)])
        context = self._context
        who = f"{context.tenant_id}/{context.user_id} · agent {context.agent.name}" if context else ""
        usage = self._usage
        workflow.set_current_details(
            f"**{state}** · turn {self._turn} · {who}\n\n"
            f"usage: {usage.total_tokens} tokens, {usage.model_calls} model calls, {usage.tool_calls} tool calls"
        )

    @workflow.signal(name="submit_message")
    def submit_message(self, message: SubmitMessage) -> None:
        if message.user_id != self._start.user_id:
            workflow.logger.warning("message from %s refused: not this conversation's user", message.user_id)
            return
        if self._ended_by is None:
            self._inbox.append(message)

    @workflow.signal(name="end")
    def end(self, request: EndConversation) -> None:
        self._ended_by = self._ended_by or f"end by {request.requested_by}"

    @workflow.update(name="wait_turn")
    async def wait_turn(self, turn: int) -> TurnResult | None:
        """Answers when turn `turn` has finished (None if the conversation ended first)."""
        await workflow.wait_condition(
            lambda: (self._last_turn is not None and self._last_turn.turn >= turn) or self._state == "ended"
        )
        last = self._last_turn
        return last if last is not None and last.turn >= turn else None

    @workflow.query(name="status")
    def status(self) -> StatusView:
        return StatusView(
            state=self._state,
            turn=self._turn,
            usage=self._usage,
            limits=self._limits,
            tenant_id=self._start.tenant_id,
            agent=self._start.agent,
            last_error=self._last_error,
        )

    @workflow.query(name="transcript")
    def transcript(self) -> list[ChatMessage]:
        return self._messages
