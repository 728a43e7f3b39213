"""ServedCalls: tool calls a client asks for directly, without a model turn (Countersign as an MCP
server, countersign/server/mcp_face.py).

Each runs through `ToolCalls.one`, the model's own path: screening (unknown, blocked, roles),
arguments checked by an activity, tiers, approval with proofs and four eyes, the saga (so an undo
works), audit. The `serve_call` update that asks for a call answers as soon as the call is done or
waits for a reviewer; the call itself goes on in this run, and asking again with the same call id
(`resume`) answers when it is done. The run neither ends nor continues as new while a served call
is unfinished (`busy`): its task, and the approval it waits for, live in this run only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from countersign.core.calls import StoredResult
    from countersign.core.contract import ServedCall, ServedOutcome

from workflows.conversation import Conversation
from workflows.tools import ToolCalls

MAX_SERVED = 200  # calls remembered per run: a client that floods is refused, history stays bounded


@dataclass
class Served:
    call: ServedCall
    task: asyncio.Task[StoredResult]


class ServedCalls:
    def __init__(self, conversation: Conversation, tools: ToolCalls) -> None:
        self.conversation = conversation
        self.tools = tools
        self.calls: dict[str, Served] = {}

    def busy(self) -> bool:
        return any(not s.task.done() for s in self.calls.values())

    async def serve(self, call: ServedCall) -> ServedOutcome:
        """Start `call` (or find it, asked before) and answer when it is done or waits for people."""
        conversation = self.conversation
        await workflow.wait_condition(lambda: conversation.context is not None)
        served = self.calls.get(call.call_id)
        if served is None:
            refusal = (
                f"no call {call.call_id} in this run"
                if call.resume
                else "the conversation has ended"
                if conversation.ended_by is not None
                else "the conversation is moving to its next run: ask again"
                if conversation.continuing
                else f"more than {MAX_SERVED} calls in this run"
                if len(self.calls) >= MAX_SERVED
                else None
            )
            if refusal is not None:
                raise ApplicationError(f"call refused: {refusal}", type="CallRefused", non_retryable=True)
            served = Served(call, asyncio.create_task(self.tools.one(call.tool_call())))
            self.calls[call.call_id] = served
        elif (served.call.tool, served.call.arguments) != (call.tool, call.arguments):
            raise ApplicationError(
                f"call refused: {call.call_id} names another call", type="CallRefused", non_retryable=True
            )
        task = served.task
        # asked again (`resume`): answers when the call is done (the server bounds how long it holds)
        await workflow.wait_condition(
            lambda: task.done() or (not call.resume and self._waiting(call.call_id))
        )
        if task.done():
            return ServedOutcome(call_id=call.call_id, state="done", result=task.result())
        approval = conversation.approvals[call.call_id]
        return ServedOutcome(call_id=call.call_id, state="waiting", expires_at=approval.expires_at)

    def _waiting(self, call_id: str) -> bool:
        approval = self.conversation.approvals.get(call_id)
        return approval is not None and approval.state == "pending"
