"""The statements of the two hot paths (issue 36) hit SQLAlchemy's compiled cache: a statement
without a cache key (a multi-VALUES insert) is compiled again at every call, which the worker's
profile showed (`SQLCompiler`, cache-key generation). Each is run twice; the second run's
statements must all be served from the cache, and the rows must be what they were before."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg
from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from activities.tools import ToolActivities
from countersign.core.calls import CallerContext, StoredResult, ToolInvocation
from countersign.core.envelopes import AppendMessages, StoredMessage
from countersign.core.evidence import fact_digest
from countersign.core.messages import ChatMessage, ToolCall
from countersign.db.chain import fact_of, last_fact, source_id_of
from countersign.db.engine import session_factory
from countersign.db.events import CHANNEL, listen_dsn, tool_result_event
from countersign.db.messages import ConversationStore
from countersign.db.ratelimit import UNLIMITED, CallLimits, RateLimit, take_call
from countersign.db.schema import (
    ConversationEvent,
    ConversationMessage,
    ModelCall,
    RateLimitBucket,
    ToolExecution,
)


@contextmanager
def uncached(engine: AsyncEngine) -> Iterator[list[str]]:
    """The statements run on `engine` in the block that SQLAlchemy compiled rather than found in
    its cache (raw text such as BEGIN or SAVEPOINT has no compiled form and is not counted)."""
    found: list[str] = []

    def executed(_c: Any, _cur: Any, statement: str, _p: Any, context: Any, _many: bool) -> None:
        if context.compiled is not None and context.cache_hit is not context.dialect.CACHE_HIT:
            found.append(f"{context._get_cache_stats()}: {statement[:80]}")

    event.listen(engine.sync_engine, "before_cursor_execute", executed)
    try:
        yield found
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", executed)


def reply(workflow_id: str, instance: str, seq: int) -> AppendMessages:
    calls = [ToolCall(id=f"c{seq}", name="search_leads", arguments="{}")]
    return AppendMessages(
        tenant_id="acme",
        workflow_id=workflow_id,
        conversation_id=instance,
        messages=[
            StoredMessage(seq=seq, message=ChatMessage(role="assistant", tool_calls=calls)),
            StoredMessage(seq=seq + 1, message=ChatMessage(role="assistant", content="and more")),
        ],
    )


def usage_row(workflow_id: str, seq: int) -> dict[str, Any]:
    return {
        "tenant_id": "acme", "agent": "lead-qualifier", "workflow_id": workflow_id, "turn": 1,
        "model": "m", "prompt_tokens": 3, "completion_tokens": 2, "tool_calls": 1,
        "finish_reason": "tool_calls", "duration_ms": 1, "attempt_key": f"{workflow_id}:{seq}",
    }  # fmt: skip


async def test_a_model_reply_and_its_usage_row_are_stored_by_a_cached_statement(
    db_engine: AsyncEngine,
) -> None:
    store = ConversationStore(session_factory(db_engine))
    workflow_id, instance = f"hot-{uuid.uuid4()}", str(uuid.uuid4())
    await store.append(reply(workflow_id, instance, 1), model_call=usage_row(workflow_id, 1))
    with uncached(db_engine) as compiled:
        await store.append(reply(workflow_id, instance, 3), model_call=usage_row(workflow_id, 3))
        await store.append(reply(workflow_id, instance, 3), model_call=usage_row(workflow_id, 3))  # retried
    assert compiled == []
    async with db_engine.connect() as connection:
        seqs = (
            await connection.scalars(
                select(ConversationMessage.seq)
                .where(ConversationMessage.workflow_id == workflow_id)
                .order_by(ConversationMessage.seq)
            )
        ).all()
        usage = await connection.scalar(select(func.count()).where(ModelCall.workflow_id == workflow_id))
    assert seqs == [1, 2, 3, 4] and usage == 2  # the retry stored nothing twice


async def test_a_tool_calls_buckets_are_taken_by_a_cached_statement(db_engine: AsyncEngine) -> None:
    sessions = session_factory(db_engine)
    tool, now = f"hot-{uuid.uuid4()}", datetime.now(UTC)
    limits = CallLimits(tenant=RateLimit(per_s=0.001, burst=3), user=RateLimit(per_s=0.001, burst=2))
    taken = []
    for attempt in range(3):
        async with sessions() as session, session.begin():
            with uncached(db_engine) as compiled:
                taken.append(await take_call(session, "acme", "alice", tool, limits, now))
            if attempt:
                assert compiled == []
    assert [t is None for t in taken] == [True, True, False]  # the user's burst of 2, then refused
    async with sessions() as session:
        tokens = dict(
            (
                await session.execute(
                    select(RateLimitBucket.user_id, RateLimitBucket.tokens).where(
                        RateLimitBucket.tool == tool
                    )
                )
            ).all()
        )
    assert tokens == {"alice": 0.0, "": 1.0}


async def test_a_tool_calls_audit_row_is_chained_as_written_without_reading_it_back(
    db_engine: AsyncEngine,
) -> None:
    """The audit row and the stored result are one statement that answers the row as written; its
    chain link is made from that answer (no SELECT of the row it just inserted)."""
    caller = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="lead-qualifier")
    invocation = ToolInvocation(
        caller=caller, workflow_id=f"hot-{uuid.uuid4()}", conversation_id=str(uuid.uuid4()),
        run_id="r", call_id="c1", tool="search_leads", arguments='{"query": "Jane"}', store_seq=2,
    )  # fmt: skip
    sessions = session_factory(db_engine)
    statements: list[str] = []

    def executed(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(db_engine.sync_engine, "before_cursor_execute", executed)
    try:
        answer = await ToolActivities(sessions, rate_limits=UNLIMITED).execute_tool(invocation)
    finally:
        event.remove(db_engine.sync_engine, "before_cursor_execute", executed)
    assert isinstance(answer, StoredResult) and answer.ok
    (written,) = [i for i, s in enumerate(statements) if "INSERT INTO tool_executions" in s]
    assert not [s for s in statements[written + 1 :] if "FROM tool_executions" in s]
    async with sessions() as session:
        audited = select(ToolExecution).where(ToolExecution.workflow_id == invocation.workflow_id)
        row = (await session.scalars(audited)).one()
        chained = await last_fact(session, "acme", "tool_executions", source_id_of(row))
    assert chained == fact_digest(fact_of(row))


async def test_a_tool_calls_result_event_is_written_and_told_by_the_statement_that_stores_it(
    database_url: str, db_engine: AsyncEngine
) -> None:
    """Issue 52: the result's event for the conversation's readers is a CTE of the statement that
    writes the audit row and the tool message, not a round trip of its own; it is still told (one
    NOTIFY at commit), with the data `publish_message` gives it, and a retry tells nobody twice."""
    caller = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="lead-qualifier")
    invocation = ToolInvocation(
        caller=caller, workflow_id=f"hot-{uuid.uuid4()}", conversation_id=str(uuid.uuid4()),
        run_id="r", call_id="c1", tool="search_leads", arguments='{"query": "Jane"}', store_seq=2,
    )  # fmt: skip
    tools = ToolActivities(session_factory(db_engine), rate_limits=UNLIMITED)
    told: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(listen_dsn(database_url))
    await listener.add_listener(CHANNEL, lambda _c, _p, _ch, payload: told.put_nowait(payload))
    statements: list[str] = []

    def executed(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(db_engine.sync_engine, "before_cursor_execute", executed)
    try:
        first = await tools.execute_tool(invocation)
        again = await tools.execute_tool(invocation)  # a retried activity: answered from the audit row
        assert await asyncio.wait_for(told.get(), 5) == invocation.workflow_id
        await asyncio.sleep(0.2)
        assert told.empty()
    finally:
        event.remove(db_engine.sync_engine, "before_cursor_execute", executed)
        await listener.close()
    assert isinstance(first, StoredResult) and first.ok and again == first
    (writes,) = [s for s in statements if "INTO conversation_events" in s]
    assert "INSERT INTO tool_executions" in writes and "INSERT INTO conversation_messages" in writes
    async with db_engine.connect() as connection:
        stored = (
            await connection.execute(
                select(ConversationMessage).where(ConversationMessage.workflow_id == invocation.workflow_id)
            )
        ).one()
        events = (
            await connection.execute(
                select(ConversationEvent.kind, ConversationEvent.data, ConversationEvent.key).where(
                    ConversationEvent.workflow_id == invocation.workflow_id
                )
            )
        ).all()
    expected = tool_result_event(dict(stored._mapping))
    assert expected is not None and [tuple(e) for e in events] == [expected]
    assert expected[1]["ok"] is True and expected[1]["call_id"] == "c1" and expected[1]["seq"] == 2
