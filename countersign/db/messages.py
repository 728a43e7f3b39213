"""The conversation store in PostgreSQL (`conversation_messages`): append messages, load what a model
call sends, rebuild a turn's reply, count a tenant's tokens of the day.

Appends are idempotent: the workflow allocates sequence numbers, so a retried append of the same
(workflow id, instance, seq) changes nothing. Every row belongs to one conversation instance
(`conversation_id`, db.instances) and every read names it: a conversation started again under a
closed one's workflow id reads nothing of the old one. A user message's id is unique per
conversation: appending a redelivered one (same id, another seq) is refused and reported, so the
workflow answers it once.
Shared by the store and model activities and by the client side (transcripts of ended conversations).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import BindParameter, ColumnElement, Select, bindparam, case, func, select, tuple_
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute, aliased
from sqlalchemy.sql.dml import ReturningInsert
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from countersign.core.bounds import storable
from countersign.core.calls import StoredResult, ToolInvocation, ToolResult
from countersign.core.contract import StatusView, TurnResult, TurnStop
from countersign.core.direct import MARKER_NAME
from countersign.core.envelopes import AppendMessages, StoredMessage, tool_message
from countersign.core.messages import ChatMessage, ModelReply, StoredInput, ToolCall, Usage
from countersign.db.chain import chain
from countersign.db.events import PUBLISHED, TURN_STOPS, publish_message, published_with, tool_result_event
from countersign.db.instances import instance_of
from countersign.db.schema import (
    Conversation,
    ConversationMessage,
    ModelCall,
    TenantTokenBudget,
    ToolExecution,
)


def of(workflow_id: str, conversation_id: str) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    """The rows of one conversation instance: its workflow id and its instance, always both."""
    return (
        ConversationMessage.workflow_id == workflow_id,
        ConversationMessage.conversation_id == conversation_id,
    )


def first_message() -> Any:
    """The first message its person sent in the conversation a `conversations` row names now (its
    instance), as a scalar subquery correlated with that row: what lists name a conversation by
    (the chat page's, `conversations list`). None until its first run has stored it."""
    return (
        select(ConversationMessage.content)
        .where(
            ConversationMessage.workflow_id == Conversation.workflow_id,
            ConversationMessage.conversation_id == Conversation.conversation_id,
            ConversationMessage.role == "user",
        )
        .order_by(ConversationMessage.seq)
        .limit(1)
        .correlate(Conversation)
        .scalar_subquery()
    )


class MessageRow(Protocol):
    """A `conversation_messages` row: the mapped object or a Core result row."""

    role: str
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    name: str | None


def message_of(row: MessageRow) -> ChatMessage:
    return ChatMessage(
        role=row.role,
        content=row.content,
        tool_calls=[ToolCall.model_validate(c) for c in row.tool_calls or []],
        tool_call_id=row.tool_call_id,
        name=row.name,
    )


def row_of(
    workflow_id: str,
    conversation_id: str,
    tenant_id: str,
    stored: StoredMessage,
    usage: Usage | None = None,
) -> dict[str, Any]:
    m = stored.message

    def text(value: str | None) -> str | None:  # a model may send NUL, which PostgreSQL cannot hold
        return storable(value) if value is not None else None

    calls = [
        {k: text(v) if isinstance(v, str) else v for k, v in c.model_dump(exclude_none=True).items()}
        for c in m.tool_calls
    ]
    return {
        "workflow_id": workflow_id,
        "conversation_id": conversation_id,
        "seq": stored.seq,
        "tenant_id": tenant_id,
        "role": m.role,
        "content": text(m.content),
        "tool_calls": calls or None,
        "tool_call_id": text(m.tool_call_id),
        "name": text(m.name),
        "message_id": stored.message_id,
        "prompt_tokens": usage.prompt_tokens if usage else 0,
        "completion_tokens": usage.completion_tokens if usage else 0,
    }


async def store_tool_result(
    session: AsyncSession, invocation: ToolInvocation, result: ToolResult
) -> StoredResult:
    """Store a call's result as its tool message at `invocation.store_seq`, in the caller's
    transaction (with the call's audit row), and answer with the envelope workflow history keeps.
    Idempotent: a retry, or a second attempt of the call, finds the row and changes nothing."""
    stored, envelope = tool_message(invocation, result)
    row = row_of(invocation.workflow_id, invocation.conversation_id, invocation.caller.tenant_id, stored)
    await insert_message(session, row)
    return envelope


async def result_or_envelope(
    session: AsyncSession, invocation: ToolInvocation, result: ToolResult
) -> ToolResult | StoredResult:
    """What a tool activity answers: the result itself, or (`store_seq` set) the envelope of the
    tool message stored in `session`'s transaction, so workflow history never holds the body."""
    if invocation.store_seq is None:
        return result
    return await store_tool_result(session, invocation, result)


@dataclass(frozen=True)
class ModelInput:
    """A stored model call's input: the reply an earlier attempt stored, or the messages to send."""

    earlier: ModelReply | None = None
    messages: list[ChatMessage] = field(default_factory=list)


async def used_today(session: AsyncSession | AsyncConnection, tenant_id: str) -> int:
    """The tenant's model tokens since 00:00 UTC (a sum over its messages of the day)."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    tokens = func.sum(ConversationMessage.prompt_tokens + ConversationMessage.completion_tokens)
    used = await session.scalar(
        select(func.coalesce(tokens, 0)).where(
            ConversationMessage.tenant_id == tenant_id, ConversationMessage.created_at >= midnight
        )
    )
    return int(used or 0)


def budget_of(tenant_id: str | BindParameter[str]) -> Select[int]:
    """The tenant's model tokens per day (no row: unbounded)."""
    return select(TenantTokenBudget.tokens_per_day).where(TenantTokenBudget.tenant_id == tenant_id)


async def refuse_over_budget(
    session: AsyncSession | AsyncConnection, tenant_id: str, budget: int | None
) -> None:
    """LIMIT_REACHED (no retry) once the tenant spent its `budget` of tokens of the day. The day's
    sum is only computed for a tenant that has a budget: without one there is nothing to refuse."""
    if budget is None:
        return
    used = await used_today(session, tenant_id)
    if used >= budget:
        raise ApplicationError(
            f"LIMIT_REACHED: tenant {tenant_id} used {used} model tokens today, its budget is "
            f"{budget} per day (tenant_token_budgets)",
            type="LimitReached",
            non_retryable=True,
            # a refusal the tenant's budget asked for, not a fault: the SDK logs a benign failure
            # without the traceback it writes for every other one (the turn ends saying why)
            category=ApplicationErrorCategory.BENIGN,
        )


def _prefixed(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`values` as the parameters of a statement built by `_values` with `prefix`."""
    return {prefix + k: v for k, v in values.items()}


def _values(
    model: type[ToolExecution] | type[ConversationMessage] | type[ModelCall],
    keys: tuple[str, ...],
    prefix: str,
) -> Insert:
    """An INSERT of `model` whose values are the parameters `prefix` + key, typed as their columns."""
    columns = model.__mapper__.columns
    return insert(model).values({k: bindparam(prefix + k, type_=columns[k].type) for k in keys})


# The statements of audited_answer, built once per set of columns written (one, in practice): built
# per call, their construction and cache keys cost more than running them (issue 36's profile).
@functools.cache
def _audit_only(audit: tuple[str, ...]) -> ReturningInsert[ToolExecution]:
    return _values(ToolExecution, audit, "a_").returning(ToolExecution)


@functools.cache
def _audited(audit: tuple[str, ...], message: tuple[str, ...]) -> Select[Any]:
    """The three inserts as CTEs of one SELECT that answers the audit row as written (for its chain
    link) and the message's seq when it was inserted: one round trip, no read-back of the row. The
    third is the result's event for the conversation's readers, inserted (and NOTIFYd) only with
    the message, as `publish_message` would after it (issue 52: a round trip less per tool call)."""
    audit_cte = _values(ToolExecution, audit, "a_").returning(*ToolExecution.__table__.columns).cte("audited")
    message_cte = (
        _values(ConversationMessage, message, "m_")
        .on_conflict_do_nothing()
        .returning(ConversationMessage.seq)
        .cte("message")
    )
    _, notified = published_with(message_cte)
    return select(aliased(ToolExecution, audit_cte), select(message_cte.c.seq).scalar_subquery(), notified)


async def audited_answer(
    session: AsyncSession, invocation: ToolInvocation, result: ToolResult, audit: dict[str, Any]
) -> ToolResult | StoredResult:
    """Insert a call's audit row (`audit`: the `tool_executions` values) and, with
    `invocation.store_seq`, its result as the tool message, in one statement of the caller's
    transaction (the audit row's insert is a CTE of the message's), and chain the audit row
    (countersign.db.chain); answer what `store_tool_result` would. A second attempt of the call
    never gets here: it finds the audit row."""
    given = _prefixed(audit, "a_")
    if invocation.store_seq is None:
        statement = _audit_only(tuple(audit))
        await chain(session, (await session.scalars(statement, given)).one())
        return result
    stored, envelope = tool_message(invocation, result)
    row = row_of(invocation.workflow_id, invocation.conversation_id, invocation.caller.tenant_id, stored)
    told = tool_result_event(row)
    assert told is not None, "a tool call's result is a tool message with its call id"
    instance = (invocation.workflow_id, invocation.conversation_id, invocation.caller.tenant_id)
    given |= _prefixed(row, "m_") | _prefixed(dict(zip(PUBLISHED, (*instance, *told), strict=True)), "e_")
    written, _, _ = (await session.execute(_audited(tuple(audit), tuple(row)), given)).one()
    await chain(session, written)
    return envelope


async def insert_message(session: AsyncSession | AsyncConnection, row: dict[str, Any]) -> None:
    """Insert a message once, and the events it means for the conversation's readers with it (a
    retried write inserts nothing and tells nobody twice)."""
    inserted = await session.scalar(
        insert(ConversationMessage).values(**row).on_conflict_do_nothing().returning(ConversationMessage.seq)
    )
    if inserted is not None:
        await publish_message(session, row)


@functools.cache
def _usage(usage: tuple[str, ...]) -> Insert:
    """A model call's usage row (`model_calls`), once per attempt, built once (per set of columns)."""
    return _values(ModelCall, usage, "u_").on_conflict_do_nothing()


@functools.cache
def _reply_with_usage(message: tuple[str, ...], usage: tuple[str, ...]) -> ReturningInsert[int]:
    """A model reply's insert with its usage row as a CTE, built once (per set of columns): built
    per call with the values in it, it had a new cache key at every model call (issue 36)."""
    return (
        _values(ConversationMessage, message, "m_")
        .on_conflict_do_nothing()
        .returning(ConversationMessage.seq)
        .add_cte(_usage(usage).cte("usage"))
    )


# The rows are the statement's parameters (one INSERT of as many VALUES, by SQLAlchemy's
# "insertmanyvalues"), not its values: a multi-VALUES statement has no cache key, so SQLAlchemy
# compiled it again for every model reply.
APPEND = insert(ConversationMessage).on_conflict_do_nothing().returning(ConversationMessage.seq)


def _last_said() -> Select[ConversationMessage]:
    """The latest `:count` messages with text of each of the conversations `:instances`."""
    m = ConversationMessage
    latest = func.row_number().over(partition_by=(m.workflow_id, m.conversation_id), order_by=m.seq.desc())
    ranked = (
        select(m, latest.label("latest"))
        .where(
            tuple_(m.workflow_id, m.conversation_id).in_(bindparam("instances", expanding=True)),
            m.role.in_(("user", "assistant")),
            m.content.is_not(None),
            m.content != "",
        )
        .subquery()
    )
    said = aliased(m, ranked)
    return (
        select(said)
        .where(ranked.c.latest <= bindparam("count"))
        .order_by(said.workflow_id, said.conversation_id, said.seq)
    )


LAST_SAID = _last_said()
LAST_SAID_BATCH = 1000  # conversations per statement: two parameters each, under asyncpg's 32,767


# What a stored model call reads (ConversationStore.model_input), built once: the messages at
# `:seqs` of one instance, each row with the tenant's budget as a scalar subquery.
MODEL_INPUT = select(
    *ConversationMessage.__table__.columns,
    budget_of(bindparam("tenant_id")).scalar_subquery().label("budget"),
).where(
    ConversationMessage.workflow_id == bindparam("workflow_id"),
    ConversationMessage.conversation_id == bindparam("conversation_id"),
    ConversationMessage.seq.in_(bindparam("seqs", expanding=True)),
)


def no_tool_calls(calls: InstrumentedAttribute[Any]) -> ColumnElement[bool]:
    """A stored message asks for no tool call: SQL NULL, JSON null or an empty array."""
    kind = func.jsonb_typeof(calls)
    return case((kind == "array", func.jsonb_array_length(calls)), else_=0) == 0


class ConversationStore:
    """Reads and writes `conversation_messages`; shared by the store, model and CLI sides."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        # the hot path of every model call (its input, its reply) runs on Core connections: no
        # ORM session to set up, no objects to load
        bind = sessions.kw.get("bind")
        assert isinstance(bind, AsyncEngine), "a ConversationStore's sessions are bound to an engine"
        self.engine = bind

    async def append(
        self, batch: AppendMessages, usage: Usage | None = None, model_call: dict[str, Any] | None = None
    ) -> list[int]:
        """Append `batch`; the seqs refused because their message id was stored at another seq.
        `model_call`: the usage audit's row of the reply appended, in the same transaction.

        Messages without an id (model replies, tool results) go in one statement (a model reply's
        usage row a CTE of it; any other usage row its own statement); it returns the rows it
        inserted, whose events (db.events) are written in the same transaction, so a retried append
        inserts nothing and tells nobody twice."""
        refused: list[int] = []
        rows: list[dict[str, Any]] = []
        async with self.engine.connect() as connection:
            await connection.begin()
            for stored in batch.messages:
                if stored.message_id is not None:
                    earlier = await connection.scalar(
                        select(ConversationMessage.seq).where(
                            ConversationMessage.workflow_id == batch.workflow_id,
                            ConversationMessage.conversation_id == batch.conversation_id,
                            ConversationMessage.message_id == stored.message_id,
                        )
                    )
                    if earlier is not None and earlier != stored.seq:
                        refused.append(stored.seq)
                        continue
                    await insert_message(
                        connection,
                        row_of(batch.workflow_id, batch.conversation_id, batch.tenant_id, stored, usage),
                    )
                else:
                    rows.append(
                        row_of(batch.workflow_id, batch.conversation_id, batch.tenant_id, stored, usage)
                    )
            if model_call is not None and len(rows) == 1:  # a model reply: its usage row a CTE of it
                statement = _reply_with_usage(tuple(rows[0]), tuple(model_call))
                given = _prefixed(rows[0], "m_") | _prefixed(model_call, "u_")
                inserted = set((await connection.scalars(statement, given)).all())
            else:
                inserted = set((await connection.scalars(APPEND, rows)).all()) if rows else set()
                if model_call is not None:
                    await connection.execute(_usage(tuple(model_call)), _prefixed(model_call, "u_"))
            for row in rows:  # the events of the rows this attempt inserted, in seq order
                if row["seq"] in inserted:
                    await publish_message(connection, row)
            await connection.commit()
        return refused

    async def latest_instance(self, workflow_id: str) -> str:
        """The instance a client means by a workflow id: the one it names now (db.instances)."""
        async with self.sessions() as session:
            return await instance_of(session, workflow_id)

    async def latest(self, workflow_id: str) -> list[ChatMessage]:
        """Every message of the latest instance under `workflow_id`, in order (for clients)."""
        return await self.load(workflow_id, await self.latest_instance(workflow_id))

    async def load(
        self, workflow_id: str, conversation_id: str, seqs: list[int] | None = None
    ) -> list[ChatMessage]:
        """The messages `seqs` in the order given (the summary comes before the window although
        it is stored later), or all of them in sequence order."""
        if seqs is not None:
            by_seq = await self.at(workflow_id, conversation_id, seqs)
            return [by_seq[s] for s in seqs if s in by_seq]
        query = select(ConversationMessage).where(*of(workflow_id, conversation_id))
        async with self.sessions() as session:
            rows = list(await session.scalars(query.order_by(ConversationMessage.seq)))
        return [message_of(r) for r in rows]

    async def at(self, workflow_id: str, conversation_id: str, seqs: list[int]) -> dict[int, ChatMessage]:
        """The stored messages among `seqs`, by sequence number."""
        query = select(ConversationMessage).where(
            *of(workflow_id, conversation_id), ConversationMessage.seq.in_(seqs)
        )
        async with self.sessions() as session:
            return {r.seq: message_of(r) for r in await session.scalars(query)}

    async def answer_to(self, workflow_id: str, call_id: str) -> ChatMessage | None:
        """The tool message that answers `call_id` under `workflow_id`, whichever instance stored it:
        a served call's client asks again by (conversation, call id) after the run that held the
        call continued as new or ended, maybe followed by the next conversation under the same
        key. The server mints each call id unique (countersign/server/mcp_face.py), so the pair
        names one call."""
        query = (
            select(ConversationMessage)
            .where(
                ConversationMessage.workflow_id == workflow_id,
                ConversationMessage.role == "tool",
                ConversationMessage.tool_call_id == call_id,
            )
            .limit(1)
        )
        async with self.sessions() as session:
            row = await session.scalar(query)
        return message_of(row) if row is not None else None

    async def last_said(
        self, instances: Sequence[tuple[str, str]], count: int
    ) -> dict[tuple[str, str], list[ChatMessage]]:
        """Of each conversation (workflow id, instance), the latest `count` user and assistant
        messages with text, oldest first; a statement per LAST_SAID_BATCH conversations, not one
        per conversation (the inbox lists thousands of waiting calls)."""
        said: dict[tuple[str, str], list[ChatMessage]] = {}
        async with self.sessions() as session:
            for at in range(0, len(instances), LAST_SAID_BATCH):
                batch = instances[at : at + LAST_SAID_BATCH]
                for r in await session.scalars(LAST_SAID, {"instances": batch, "count": count}):
                    said.setdefault((r.workflow_id, r.conversation_id), []).append(message_of(r))
        return said

    async def model_input(self, stored: StoredInput) -> ModelInput:
        """What a stored model call needs, in one statement: the reply an earlier attempt stored at
        `stored.reply_seq` (a retried model call answers with it, once), else the tenant's budget
        checked (LIMIT_REACHED when spent) and the messages `stored.seqs` in the order given. The
        budget rides along each row as a scalar subquery."""
        given = {
            "tenant_id": stored.tenant_id,
            "workflow_id": stored.workflow_id,
            "conversation_id": stored.conversation_id,
            "seqs": [*stored.seqs, stored.reply_seq],
        }
        async with self.engine.connect() as connection:
            # reads only, usually the one statement: no BEGIN and ROLLBACK round trips around it
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            found = (await connection.execute(MODEL_INPUT, given)).all()
            rows = {row.seq: row for row in found}
            earlier = rows.pop(stored.reply_seq, None)
            if earlier is not None:
                usage = Usage(
                    prompt_tokens=earlier.prompt_tokens,
                    completion_tokens=earlier.completion_tokens,
                    model_calls=1,
                )
                return ModelInput(earlier=ModelReply(message=message_of(earlier), usage=usage))
            per_day = found[0].budget if found else await connection.scalar(budget_of(stored.tenant_id))
            await refuse_over_budget(connection, stored.tenant_id, per_day)
        return ModelInput(messages=[message_of(rows[s]) for s in stored.seqs if s in rows])

    async def turn_reply(
        self, workflow_id: str, conversation_id: str, message_id: str, turn: int
    ) -> TurnResult | None:
        """The turn that answered the user message `message_id`, rebuilt from what it stored: its
        reply is the last assistant message before the next user message, its usage that of its
        model replies and tool results. None when the message is not stored."""
        asked = ConversationMessage.message_id == message_id
        return await self._turn_after(workflow_id, conversation_id, asked, 0, turn)

    async def finished_turn(
        self, workflow_id: str, conversation_id: str, message_id: str
    ) -> TurnResult | None:
        """The turn that answered `message_id`, once it has ended: a reply without tool calls is
        stored after the message and before the next one (what the `turn` event says, db.events);
        None while the turn still runs or waits for a person."""
        mine = of(workflow_id, conversation_id)
        async with self.sessions() as session:
            seq = await session.scalar(
                select(ConversationMessage.seq).where(*mine, ConversationMessage.message_id == message_id)
            )
            if seq is None:
                return None
            after = await session.scalar(
                select(func.min(ConversationMessage.seq)).where(
                    *mine, ConversationMessage.seq > seq, ConversationMessage.role == "user"
                )
            )
            ending = [
                *mine,
                ConversationMessage.seq > seq,
                ConversationMessage.role == "assistant",
                no_tool_calls(ConversationMessage.tool_calls),
                ConversationMessage.name.is_distinct_from(MARKER_NAME),
            ]
            ending += [ConversationMessage.seq < after] if after is not None else []
            ended = await session.scalar(select(func.count()).where(*ending))
        return await self.turn_reply(workflow_id, conversation_id, message_id, 0) if ended else None

    async def ended_turn(
        self, workflow_id: str, conversation_id: str, message_id: str | None, turn: int
    ) -> TurnResult | None:
        """For a conversation that has ended: the turn that answered `message_id` (or, without one,
        the `turn`-th user message), as `turn_reply` rebuilds it; None when nothing answered it."""
        if message_id is not None:
            found = await self.turn_reply(workflow_id, conversation_id, message_id, turn)
        else:
            user = ConversationMessage.role == "user"
            found = await self._turn_after(workflow_id, conversation_id, user, max(turn - 1, 0), turn)
        return found if found is not None and (found.reply is not None or found.usage.model_calls) else None

    async def _turn_after(
        self, workflow_id: str, conversation_id: str, asked: ColumnElement[bool], skip: int, turn: int
    ) -> TurnResult | None:
        """The turn after the stored message `asked` selects (the first, past `skip` of them)."""
        mine = of(workflow_id, conversation_id)
        async with self.sessions() as session:
            seq = await session.scalar(
                select(ConversationMessage.seq)
                .where(*mine, asked)
                .order_by(ConversationMessage.seq)
                .offset(skip)
                .limit(1)
            )
            if seq is None:
                return None
            after = await session.scalar(
                select(func.min(ConversationMessage.seq)).where(
                    *mine, ConversationMessage.seq > seq, ConversationMessage.role == "user"
                )
            )
            within = [*mine, ConversationMessage.seq > seq]
            within += [ConversationMessage.seq < after] if after is not None else []
            query = select(ConversationMessage).where(*within).order_by(ConversationMessage.seq)
            turn_rows = list(await session.scalars(query))
        replies = [r for r in turn_rows if r.role == "assistant"]
        last = replies[-1] if replies else None
        stop: TurnStop = "completed"
        if last is not None and last.name in TURN_STOPS:
            stop = "limit_reached" if last.name == "limit_reached" else "error"
        model = [r for r in replies if r.name not in TURN_STOPS]
        usage = Usage(
            prompt_tokens=sum(r.prompt_tokens for r in model),
            completion_tokens=sum(r.completion_tokens for r in model),
            model_calls=len(model),
            tool_calls=sum(r.role == "tool" for r in turn_rows),
        )
        return TurnResult(turn=turn, reply=last.content if last else None, stop=stop, usage=usage)

    async def latest_owner(self, workflow_id: str) -> tuple[str, str] | None:
        """The tenant and user of the instance `workflow_id` names now, as recorded in its row (for
        a conversation from before instances, the author of its first user message)."""
        async with self.sessions() as session:
            row = await session.get(Conversation, workflow_id)
        if row is not None:
            return row.tenant_id, row.user_id
        return await self.owner(workflow_id, "")

    async def owner(self, workflow_id: str, conversation_id: str) -> tuple[str, str] | None:
        """The conversation's tenant and user (the author of its user messages), if stored."""
        query = (
            select(ConversationMessage.tenant_id, ConversationMessage.name)
            .where(*of(workflow_id, conversation_id), ConversationMessage.role == "user")
            .order_by(ConversationMessage.seq)
            .limit(1)
        )
        async with self.sessions() as session:
            row = (await session.execute(query)).first()
        return (row[0], row[1]) if row is not None and row[1] else None

    async def latest_status(self, workflow_id: str) -> StatusView | None:
        return await self.status(workflow_id, await self.latest_instance(workflow_id))

    async def status(self, workflow_id: str, conversation_id: str) -> StatusView | None:
        """What the store says of a conversation whose history is gone (past the namespace's
        retention): ended, its turns (user messages) and its model usage. None: not in the store."""
        tokens = ConversationMessage.prompt_tokens + ConversationMessage.completion_tokens
        query = select(
            func.min(ConversationMessage.tenant_id),
            func.count().filter(ConversationMessage.role == "user"),
            func.coalesce(func.sum(ConversationMessage.prompt_tokens), 0),
            func.coalesce(func.sum(ConversationMessage.completion_tokens), 0),
            func.count().filter(tokens > 0),
        ).where(*of(workflow_id, conversation_id))
        async with self.sessions() as session:
            tenant, turns, prompt, completion, calls = (await session.execute(query)).one()
        if tenant is None:
            return None
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, model_calls=calls)
        return StatusView(state="ended", turn=turns, usage=usage, tenant_id=tenant)

    async def tokens_today(self, tenant_id: str) -> tuple[int, int | None]:
        """The tenant's model tokens since 00:00 UTC, and its budget per day (None: unbounded)."""
        async with self.sessions() as session:
            used = await used_today(session, tenant_id)
            budget = await session.get(TenantTokenBudget, tenant_id)
        return used, budget.tokens_per_day if budget else None

    async def check_tenant_budget(self, tenant_id: str) -> None:
        """Refuse a model call once the tenant spent its tokens of the day: LIMIT_REACHED, no retry."""
        async with self.sessions() as session:
            await refuse_over_budget(session, tenant_id, await session.scalar(budget_of(tenant_id)))
