"""The conversations the benchmark runs, through the workflow and through a plain in-process loop."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from temporalio.client import WorkflowHandle

from activities.context import ContextActivities
from activities.model import ModelActivities
from activities.tools import ToolActivities
from bench.clock import ActivityClock
from bench.history import (
    MODEL_ACTIVITY,
    TOOL_ACTIVITY,
    ActivityRun,
    Step,
    StepParts,
    activity_runs,
    first_started,
    step_parts,
    steps,
)
from bench.scenario import STEPS_MESSAGE, WAIT_MESSAGE, approval_message
from bench.stack import Parts
from countersign.core.approvals import Approval, ApproveSignal, Decision
from countersign.core.calls import CallerContext, ToolInvocation, ToolResult
from countersign.core.contract import ConversationContext, ConversationResult, StartConversation, StatusView
from countersign.core.messages import ChatMessage, ModelRequest
from countersign.core.policy import offered_tools
from countersign.db.engine import session_factory
from countersign.db.ratelimit import UNLIMITED
from workflows.agent import AgentWorkflow

TENANT, REQUESTER, APPROVER, AGENT = "acme", "alice", "bob", "lead-qualifier"
POLL_S = 0.005
# A WAIT_MESSAGE conversation's only tool call: approved by id, since asking the conversation (a
# query) would load it into a worker's cache, which the memory measurement must not do.
WAITING_CALL_ID = "c1"
Handle = WorkflowHandle[AgentWorkflow, ConversationResult]
T = TypeVar("T")


def conversation(message: str) -> StartConversation:
    return StartConversation(
        tenant_id=TENANT, user_id=REQUESTER, agent=AGENT, message=message, single_turn=True
    )


async def start(parts: Parts, message: str) -> Handle:
    return await parts.client.start_workflow(
        AgentWorkflow.run,
        conversation(message),
        id=f"bench-{uuid.uuid4()}",
        task_queue=parts.settings.task_queue,
    )


# --- sequential steps (metrics 1, 5, 6) --------------------------------------------------------------


@dataclass(frozen=True)
class StepsSample:
    """One single-turn conversation of K sequential tool calls, run by the workflow."""

    wall_s: float  # start_workflow called -> result received
    steps: list[Step]
    parts: list[StepParts]
    events: int  # the whole history
    tool_calls: int


async def steps_conversation(parts: Parts) -> StepsSample:
    began = time.perf_counter()
    handle = await start(parts, STEPS_MESSAGE)
    result = await handle.result()
    return await steps_sample(handle, parts.clock, time.perf_counter() - began, result.usage.tool_calls)


async def steps_sample(
    handle: WorkflowHandle[Any, Any],
    clock: ActivityClock,
    wall_s: float,
    tool_calls: int,
    names: tuple[str, str] = (MODEL_ACTIVITY, TOOL_ACTIVITY),
) -> StepsSample:
    """The steps of a finished conversation (any workflow whose model call and tool call are the
    activities `names`), from its history and the worker's clock of its activities."""
    history = await handle.fetch_history()

    def own_s(run: ActivityRun) -> float:
        return clock.of(handle.id, run.activity_id)

    model, tool = names
    betweens = steps(activity_runs(history.events), model)
    return StepsSample(
        wall_s,
        [between.step(own_s, tool) for between in betweens],
        [step_parts(history.events, between, own_s) for between in betweens],
        len(history.events),
        tool_calls,
    )


# --- throughput (metric 3) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    concurrency: int
    conversations: int
    tool_calls: int
    wall_s: float

    @property
    def tool_calls_per_s(self) -> float:
        return self.tool_calls / self.wall_s


async def throughput(parts: Parts, concurrency: int, conversations: int, message: str) -> Throughput:
    """`conversations` conversations of `message`, `concurrency` of them in flight at any time."""

    async def one() -> int:
        return (await (await start(parts, message)).result()).usage.tool_calls

    return await throughput_of(one, concurrency, conversations)


async def throughput_of(
    conversation: Callable[[], Awaitable[int]], concurrency: int, conversations: int
) -> Throughput:
    """`conversations` runs of `conversation` (which answers its tool calls), `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> int:
        async with gate:
            return await conversation()

    began = time.perf_counter()
    calls = await asyncio.gather(*(one() for _ in range(conversations)))
    return Throughput(concurrency, conversations, sum(calls), time.perf_counter() - began)


# --- approvals (metrics 2, 5) --------------------------------------------------------------------------

Via = Literal["update", "signal"]


@dataclass(frozen=True)
class ApprovalSample:
    via: Via
    to_execution_s: float  # decision sent -> execute_tool ActivityTaskStarted
    acknowledged_s: float  # decision sent -> the update answered (the signal: accepted by the server)
    call_events: int  # history events from the requesting model call's completion to the next model call
    events: int  # the whole history of the conversation (one turn, one approved call)


async def wait_for_state(handle: Handle, state: str) -> StatusView:
    """Poll the status query (another process's state: no event to wait on)."""
    while (status := await handle.query(AgentWorkflow.status)).state != state:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    return status


async def decide(handle: Handle, call_id: str, via: Via) -> None:
    if via == "update":
        decision = Decision(call_id=call_id, decision="approve", approver=APPROVER)
        await handle.execute_update("decide", decision, result_type=Approval)
    else:
        await handle.signal(AgentWorkflow.approve, ApproveSignal(call_id=call_id, approver=APPROVER))


async def approval(parts: Parts, status: str, via: Via) -> ApprovalSample:
    handle = await start(parts, approval_message(status))
    pending = (await wait_for_state(handle, "awaiting_approval")).pending_approvals[0]
    return await approve(handle, pending.call_id, via)


async def approve(handle: Handle, call_id: str, via: Via) -> ApprovalSample:
    """Approve `call_id` of a conversation that waits for it, and time it to the call's execution."""
    sent = time.time()
    await decide(handle, call_id, via)
    acknowledged = time.time() - sent
    await handle.result()
    history = await handle.fetch_history()
    runs = activity_runs(history.events)
    executed = first_started(runs, "execute_tool")
    if executed is None:
        raise RuntimeError(f"{handle.id}: the approved call never ran")
    (between,) = steps(runs)
    assert between.model.closed_event_id is not None
    call_events = between.next_model.scheduled_event_id - between.model.closed_event_id
    return ApprovalSample(via, executed - sent, acknowledged, call_events, len(history.events))


# --- conversations waiting on approval (metric 4) ------------------------------------------------------


async def start_waiting(
    parts: Parts, count: int, in_flight: int = 50, wave: int | None = None, stalled_s: float = 60.0
) -> list[Handle]:
    """`count` conversations that stop on an approval, `in_flight` start requests at a time.

    With `wave`, at most that many are on their way at once: each wave is started once every
    conversation before it awaits approval (or their number has not grown for `stalled_s`). Keep
    it under the worker's workflow cache: 10,000 started at once all progress together, every
    workflow task then misses the cache and replays its history in a new sandbox, and a
    conversation comes to wait after about a second of the worker's CPU, not tens of milliseconds.
    A reviewer's queue fills over time, not in one burst, so waves measure the waiting, not a
    thundering herd of starts."""
    gate = asyncio.Semaphore(in_flight)

    async def one() -> Handle:
        async with gate:
            return await start(parts, WAIT_MESSAGE)

    handles: list[Handle] = []
    for first in range(0, count, wave or count):
        size = min(wave or count, count - first)
        handles += await asyncio.gather(*(one() for _ in range(size)))
        if wave:
            await until_awaiting(parts, len(handles), stalled_s)
    return handles


async def until_awaiting(parts: Parts, count: int, stalled_s: float, poll_s: float = 0.5) -> int:
    """How many of the task queue's conversations await approval once `count` do, or once their
    number has not grown for `stalled_s` (a straggler is reported, not waited for)."""
    seen, grew = 0, time.perf_counter()
    while (found := await count_awaiting(parts)) < count:
        if found > seen:
            seen, grew = found, time.perf_counter()
        elif time.perf_counter() - grew > stalled_s:
            break
        await asyncio.sleep(poll_s)
    return found


async def count_awaiting(parts: Parts) -> int:
    query = f'TaskQueue="{parts.settings.task_queue}" AND AgentStatus="awaiting_approval"'
    return (await parts.client.count_workflows(query)).count


async def all_awaiting(parts: Parts, count: int, timeout_s: float) -> float:
    """Seconds until `count` conversations of the task queue await approval (visibility's view)."""
    began = time.perf_counter()
    while await count_awaiting(parts) < count:
        if time.perf_counter() - began > timeout_s:
            raise TimeoutError(f"fewer than {count} conversations awaited approval after {timeout_s:.0f}s")
        await asyncio.sleep(0.5)
    return time.perf_counter() - began


# --- the same conversation without Temporal (metric 6) ---------------------------------------------------


@dataclass(frozen=True)
class LoopSample:
    wall_s: float
    step_s: list[float]  # model call started -> next model call started
    tool_calls: int


class InProcessLoop:
    """The tool-calling loop as plain awaits of the same activity code: no workflow, no history."""

    def __init__(self, parts: Parts) -> None:
        sessions = session_factory(parts.engine)
        self._context = ContextActivities(sessions)
        self._model = ModelActivities(parts.settings)
        self._tools = ToolActivities(sessions, rate_limits=UNLIMITED)

    async def converse(self, message: str) -> LoopSample:
        began = time.perf_counter()
        start = conversation(message)
        context = await self._context.load_conversation_context(start)
        messages = [ChatMessage(role="system", content=context.agent.system_prompt)]
        messages.append(ChatMessage(role="user", content=message, name=start.user_id))
        offered = [t.openai_tool() for t in offered_tools(context.tools)]
        marks, calls, run_id = [], 0, str(uuid.uuid4())
        while True:
            marks.append(time.perf_counter())
            reply = await self._model.call_model(ModelRequest(messages=messages, tools=offered))
            messages.append(reply.message)
            if not reply.message.tool_calls:
                break
            for call in reply.message.tool_calls:
                result = await self._tools.execute_tool(
                    self._invocation(context, run_id, call.id, call.name, call.arguments)
                )
                assert isinstance(result, ToolResult)  # no store_seq: the whole result
                messages.append(
                    ChatMessage(
                        role="tool", tool_call_id=call.id, name=call.name, content=result.to_content()
                    )
                )
                calls += 1
        step_s = [b - a for a, b in itertools.pairwise(marks)]
        return LoopSample(time.perf_counter() - began, step_s, calls)

    @staticmethod
    def _invocation(
        context: ConversationContext, run_id: str, call_id: str, tool: str, arguments: str
    ) -> ToolInvocation:
        caller = CallerContext(
            tenant_id=context.tenant_id,
            user_id=context.user_id,
            roles=context.roles,
            agent=context.agent.name,
        )
        return ToolInvocation(
            caller=caller,
            workflow_id=f"loop-{run_id}",
            run_id=run_id,
            call_id=call_id,
            tool=tool,
            arguments=arguments,
            turn=1,
        )
