"""The usage audit: a `model_calls` row for every model call that answered.

A model call whose reply is stored (conversations since the message store) writes its row in the
transaction that stores the reply (activities/model.py): one commit for both, and a row exactly
when there is a reply. For the others a worker interceptor around `call_model` writes it after the
reply arrived: a database that is down must not cost such a paid reply a retry, so the row is then
skipped with a warning naming the call and its tokens, and the reply is returned. Either way the
row is keyed by the invocation (`attempt_key`), so a retried call keeps one row.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from countersign.core.activity_refs import CALL_MODEL
from countersign.core.messages import ModelCaller, ModelReply, ModelRequest
from countersign.db.attempts import attempt_key
from countersign.db.schema import ModelCall
from countersign.runtime.logs import get_logger

RECORD_TIMEOUT_S = 5.0

log = get_logger("countersign.usage")


class ModelCallAudit(Interceptor):
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _RecordModelCalls(next, self._sessions)


class _RecordModelCalls(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, sessions: async_sessionmaker[AsyncSession]) -> None:
        super().__init__(next)
        self._sessions = sessions

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        request = input.args[0] if input.args else None
        if (
            activity.info().activity_type != CALL_MODEL.name
            or not isinstance(request, ModelRequest)
            or request.stored is not None  # recorded by the activity, in the transaction of its reply
        ):
            return await super().execute_activity(input)
        started = time.perf_counter()
        reply = await super().execute_activity(input)
        if isinstance(reply, ModelReply) and request.caller is not None:
            await self._record(model_call_row(request.caller, reply, elapsed_ms(started)))
        return reply

    async def _record(self, row: dict[str, Any]) -> None:
        try:
            await insert_model_call(self._sessions, row)
        except Exception as exc:  # whatever the database did, the reply is worth more than the row
            log.warning("model call not audited", error=f"{type(exc).__name__}: {exc}", **row)


def elapsed_ms(started: float) -> int:
    """Milliseconds since `started` (a `time.perf_counter()` reading)."""
    return int((time.perf_counter() - started) * 1000)


def model_call_row(caller: ModelCaller, reply: ModelReply, duration_ms: int) -> dict[str, Any]:
    """The `model_calls` row of this activity invocation's model call (keyed by its attempt)."""
    return {
        "tenant_id": caller.tenant_id,
        "agent": caller.agent,
        "workflow_id": activity.info().workflow_id,
        "turn": caller.turn,
        "model": reply.model[:200],
        "prompt_tokens": reply.usage.prompt_tokens,
        "completion_tokens": reply.usage.completion_tokens,
        "tool_calls": len(reply.message.tool_calls),
        "finish_reason": (reply.finish_reason or "")[:100] or None,
        "duration_ms": duration_ms,
        "attempt_key": attempt_key(),
    }


async def insert_model_call(sessions: async_sessionmaker[AsyncSession], row: dict[str, Any]) -> None:
    """Insert one `model_calls` row unless its attempt key has one, within RECORD_TIMEOUT_S."""
    async with asyncio.timeout(RECORD_TIMEOUT_S), sessions() as session, session.begin():
        await session.execute(insert(ModelCall).values(**row).on_conflict_do_nothing())
