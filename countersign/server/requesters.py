"""The conversation API behind the front door: people who ask, and machine clients acting for them.

Every client action on a conversation comes through here (CONTRACT.md, "The front door"):
- **who calls**: a logged-in person (session) or an API token (countersign.identity.tokens), which
  acts for one of the users it names;
- **whose conversation**: the `conversations` row the server wrote when it started it (PostgreSQL),
  never what a query of the workflow says; another tenant's or another user's answers 404 (a tenant
  admin may also read, roll back and end its users' conversations, as the worker's rules allow);
- **how much**: a token bucket per person and per token (`rate_limit_buckets`), taken before
  Temporal is asked anything, and bounded payloads (countersign.core.bounds);
- **proven**: each action reaches the workflow with a proof minted here for that person and exactly
  that action (countersign.identity.proofs); a signed-mode worker accepts nothing else;
- **recorded**: every request, refused ones included, is a `requester_actions` row.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import exists, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from countersign.client.ended import conversation_status, roll_back_ended
from countersign.client.handles import keyed_workflow_id, new_workflow_id, refused_because, start_options
from countersign.core.authority import ADMIN
from countersign.core.bounds import Identifier, Reason, Text
from countersign.core.contract import (
    WORKFLOW_TYPE,
    AnswerSignal,
    EndConversation,
    Limits,
    Reply,
    StartConversation,
    StatusView,
    SubmitMessage,
    TurnResult,
)
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackRequest, SagaEntry, Scope
from countersign.db import ratelimit
from countersign.db.audit import audit_rows
from countersign.db.instances import PENDING
from countersign.db.messages import ConversationStore
from countersign.db.people import roles_of
from countersign.db.ratings import NoReply, RatedVia, Rating, rate_reply, rating_view, ratings_of
from countersign.db.schema import (
    AgentProfile,
    ApprovalDecision,
    ApprovalRequest,
    Conversation,
    RequesterAction,
    User,
)
from countersign.identity import tokens
from countersign.identity.mode import recorded_mode
from countersign.identity.proofs import Binding, mint_proof
from countersign.runtime.config import Settings
from countersign.server.conversation_events import ConversationEvents
from countersign.server.http import HttpRefusal
from countersign.server.inbox import Decidable

RequesterActionName = Literal[
    "start",
    "message",
    "answer",
    "rollback",
    "end",
    "status",
    "transcript",
    "reply",
    "audit",
    "mcp",
    "rate",
    "agui",
]
# What a tenant admin may do to a conversation of another user of the tenant (countersign.core.authority).
ADMIN_MAY: frozenset[str] = frozenset({"status", "transcript", "rollback", "end", "audit"})
# What a reviewer of one of its calls may do to a conversation: read it, to judge the call in its
# context (who decided one of its calls, or may decide one that waits); acting in it stays its user's.
REVIEWER_MAY: frozenset[str] = frozenset({"status", "transcript", "audit"})
MAX_WAIT_S = 50.0  # the longest `GET …/reply` holds a request open
FIRST_LOOK_S = 0.25  # a reply's wait asks the status this soon (a turn that is done answers first)
RECHECK_S = 5.0  # and again this often when no event says it may have changed
# The conversation events after which a reply's wait asks the status again (countersign.db.events).
STATUS_EVENTS = frozenset({"approval", "question", "turn", "rollback"})
INSTANCE_WAIT_S = 10.0  # how long an answer, rollback or end waits for a new conversation to register


async def reviews(session: AsyncSession, row: Conversation, person: str, roles: list[str]) -> bool:
    """Whether `person` reviews a call of the conversation `row`, as the database says: they
    decided one (approved or rejected, accepted), or one waits that they may decide (the inbox's
    own filter, so whoever sees the card may open its conversation)."""
    decided = select(ApprovalDecision.id).where(
        ApprovalDecision.tenant_id == row.tenant_id,
        ApprovalDecision.workflow_id == row.workflow_id,
        ApprovalDecision.approver == person,
        ApprovalDecision.accepted,
    )
    waits = select(ApprovalRequest.call_id).where(
        ApprovalRequest.tenant_id == row.tenant_id,
        ApprovalRequest.workflow_id == row.workflow_id,
        ApprovalRequest.state == "pending",
        Decidable.of(person, roles).clause(),
    )
    return bool(await session.scalar(select(or_(exists(decided), exists(waits)))))


@dataclass(frozen=True)
class ApiRate:
    """Requests per second and burst, per person and per token (COUNTERSIGN_API_RATE_PER_S,
    COUNTERSIGN_API_RATE_BURST)."""

    # a chat polls a running turn's status and transcript four times a second (cli/chat.py)
    per_s: float = 20.0
    burst: float = 120.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ApiRate:
        env = os.environ if env is None else env
        default = cls()
        return cls(
            per_s=float(env.get("COUNTERSIGN_API_RATE_PER_S") or default.per_s),
            burst=float(env.get("COUNTERSIGN_API_RATE_BURST") or default.burst),
        )


@dataclass(frozen=True)
class Caller:
    """Who calls: a person (`person`) or an API token (`token`), always within one tenant."""

    tenant_id: str
    person: str | None = None
    token: tokens.TokenHolder | None = None

    @property
    def via(self) -> Literal["session", "token"]:
        return "token" if self.token else "session"

    def may_act_for(self, user_id: str) -> bool:
        if self.token is not None:
            return user_id in self.token.act_as
        return user_id == self.person


# --- what clients send (validated at the edge; 422 otherwise) -------------------------------------


class StartBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: Identifier
    message: Text | None = None
    key: str | None = Field(None, max_length=200)
    limits: Limits | None = None
    single_turn: bool = False
    user_id: Identifier | None = None  # an API token: which of its users the conversation is for


class MessageBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: Text
    message_id: Identifier | None = None


class AnswerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: Text


class AnswerRequest(BaseModel, extra="forbid"):
    """The inbox's older spelling of an answer (`POST …/answer`): the call in the body, not the path."""

    call_id: Identifier
    text: str = Field(min_length=1, max_length=10_000)


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scope: Scope = "turn"
    call_id: Identifier | None = None
    reason: Reason | None = None


class RatingBody(BaseModel):
    """`PUT …/ratings/{turn}`: whether the turn's reply helped, and why if the person says."""

    model_config = ConfigDict(extra="forbid")

    rating: Rating
    comment: Reason | None = None


class Started(BaseModel):
    workflow_id: str
    message_id: str | None = None  # a keyed conversation's message (wait for its reply with it)


# --- the service -----------------------------------------------------------------------------------


class Requesters:
    def __init__(
        self,
        client: Client,
        sessions: async_sessionmaker[AsyncSession],
        key: Ed25519PrivateKey,
        settings: Settings,
        events: ConversationEvents,
        rate: ApiRate | None = None,
    ) -> None:
        self.client = client
        # the events streams' log, LISTEN feed and per-person bound: what a reply's wait wakes on,
        # and what an MCP event stream counts against (server.mcp_face)
        self.events = events
        self.sessions = sessions
        self._key = key
        self._settings = settings
        self._rate = rate or ApiRate.from_env()
        self._store = ConversationStore(sessions)

    @property
    def public_url(self) -> str:
        """The server's configured public address (COUNTERSIGN_INBOX_URL): what links given to
        people and clients are built from, never a request's Host header, which its sender chose."""
        return self._settings.inbox_url.rstrip("/")

    @property
    def chat_url(self) -> str:
        """The chat page, where a requester reads a conversation whole."""
        return f"{self.public_url}/chat"

    @property
    def signing_key(self) -> Ed25519PrivateKey:
        """The server's key: its proofs, and the MAC key of MCP request states (server.mcp_face)."""
        return self._key

    # --- who, how much, the record ---------------------------------------------------------------

    @property
    def inbox_url(self) -> str:
        """Where people open the inbox (what a chat card's "Open in inbox" links to)."""
        return self._settings.inbox_url

    async def token_caller(self, secret: str) -> Caller | None:
        async with self.sessions.begin() as session:
            holder = await tokens.holder_of(session, secret, datetime.now(UTC))
        return Caller(tenant_id=holder.tenant_id, token=holder) if holder else None

    async def admit(self, caller: Caller, user_id: str | None) -> None:
        """Take a request from the person's bucket (and the token's; a token acting for no one
        named yet: the token's alone): 429 when either is empty."""
        # the token's first: a token that floods is refused before it drains its users' buckets
        keys = [f"api:token:{caller.token.id}"] if caller.token else []
        keys += [f"api:user:{user_id}"] if user_id is not None else []
        async with self.sessions.begin() as session:
            for key in keys:
                wait_s = await ratelimit.take(
                    session, caller.tenant_id, key, self._rate.per_s, self._rate.burst, datetime.now(UTC)
                )
                if wait_s is not None:
                    who = "this token" if key.startswith("api:token") else user_id
                    raise HttpRefusal(
                        429, f"too many requests from {who}; try again shortly", max(1, round(wait_s))
                    )

    async def record(
        self,
        caller: Caller,
        user_id: str | None,
        action: RequesterActionName,
        workflow_id: str | None,
        status: int,
        reason: str | None = None,
        via: Literal["mcp", "chat"] | None = None,
    ) -> None:
        """One request on the record; `via` "mcp" for a token's request through /mcp
        (countersign.server.mcp_face), "chat" for a linked chat identity's, else the caller's kind."""
        async with self.sessions.begin() as session:
            session.add(
                RequesterAction(
                    tenant_id=caller.tenant_id,
                    user_id=user_id or caller.person or "",
                    via=via or caller.via,
                    token_id=caller.token.id if caller.token else None,
                    action=action,
                    workflow_id=workflow_id,
                    status=status,
                    reason=reason[:2000] if reason else None,
                )
            )

    async def conversation(
        self, caller: Caller, workflow_id: str, action: RequesterActionName
    ) -> Conversation:
        """The conversation's row when `caller` may take `action` on it; else 404, whether it
        exists or not (another tenant's, another user's: nothing to learn from the answer)."""
        async with self.sessions() as session:
            row = await session.get(Conversation, workflow_id[:300])
            if row is None or row.tenant_id != caller.tenant_id:
                raise HttpRefusal(404, f"no conversation {workflow_id}")
            if caller.may_act_for(row.user_id):
                return row
            if caller.person is not None and action in ADMIN_MAY | REVIEWER_MAY:
                roles = await roles_of(session, caller.tenant_id, caller.person) or []
                if action in ADMIN_MAY and ADMIN in roles:
                    return row
                if action in REVIEWER_MAY and await reviews(session, row, caller.person, roles):
                    return row
        raise HttpRefusal(404, f"no conversation {workflow_id}")

    def actor(self, caller: Caller, row: Conversation) -> str:
        """Whom an action on `row` is taken by: the person, or the user the token acts for."""
        return caller.person if caller.person is not None else row.user_id

    def _proof(self, user_id: str, binding: Binding) -> str:
        return mint_proof(self._key, user_id, binding, datetime.now(UTC))

    # --- start and send ------------------------------------------------------------------------

    def requester_of(self, caller: Caller, body: StartBody) -> str:
        """Whose conversation a start makes: the person's own, or one of the token's users."""
        if caller.token is not None:
            if body.user_id is None:
                raise HttpRefusal(422, "an API token names the user it acts for: user_id")
            if not caller.may_act_for(body.user_id):
                raise HttpRefusal(403, f"token {caller.token.name} may not act for {body.user_id}")
            return body.user_id
        assert caller.person is not None
        if body.user_id is not None and body.user_id != caller.person:
            raise HttpRefusal(403, f"{caller.person} may start conversations only as themselves")
        return caller.person

    async def start(self, caller: Caller, user_id: str, body: StartBody) -> Started:
        tenant = caller.tenant_id
        try:
            workflow_id = keyed_workflow_id(tenant, body.key) if body.key else new_workflow_id(tenant)
        except ValueError as err:
            raise HttpRefusal(422, str(err)) from None
        start = StartConversation(
            tenant_id=tenant,
            user_id=user_id,
            agent=body.agent,
            message=None if body.key else body.message,
            single_turn=body.single_turn,
            limits=body.limits or Limits(),
        )
        await self._register(caller, start, workflow_id, body.key)
        start.proof = self._proof(
            user_id, Binding.start(tenant, workflow_id, start.agent, start.proof_content())
        )
        options = start_options(self._settings, start)
        if not body.key:
            await self.client.start_workflow(WORKFLOW_TYPE, start, id=workflow_id, **options)
            return Started(workflow_id=workflow_id)
        # a keyed conversation: deliver the message, starting it if none runs (signal-with-start)
        message = None
        if body.message is not None:
            message = self._message(tenant, user_id, workflow_id, body.message, None)
            options |= {"start_signal": "submit_message", "start_signal_args": [message]}
        try:
            await self.client.start_workflow(WORKFLOW_TYPE, start, id=workflow_id, **options)
        except WorkflowAlreadyStartedError:
            if message is not None:  # two first messages raced: the conversation runs now
                await self.client.get_workflow_handle(workflow_id).signal("submit_message", message)
        return Started(workflow_id=workflow_id, message_id=message.message_id if message else None)

    async def _register(
        self, caller: Caller, start: StartConversation, workflow_id: str, key: str | None
    ) -> None:
        """Write whose conversation `workflow_id` is, before Temporal hears of it. A keyed
        conversation's row stays its first user's: another user's key answers 409."""
        async with self.sessions.begin() as session:
            if await session.get(User, (start.tenant_id, start.user_id)) is None:
                raise HttpRefusal(422, f"no user {start.user_id} in {start.tenant_id}")
            if await session.get(AgentProfile, start.agent) is None:
                raise HttpRefusal(422, f"no agent {start.agent}")
            mode = await recorded_mode(session) or "names"
            owner = await session.scalar(
                insert(Conversation)
                .values(
                    workflow_id=workflow_id,
                    tenant_id=start.tenant_id,
                    user_id=start.user_id,
                    agent=start.agent,
                    key=key,
                    started_via=caller.via,
                    token_name=caller.token.name if caller.token else None,
                    auth_mode=mode,
                )
                .on_conflict_do_update(index_elements=[Conversation.workflow_id], set_={"key": key})
                .returning(Conversation.user_id)
            )
        if owner != start.user_id:
            raise HttpRefusal(409, f"the conversation key {key} belongs to another user")

    def _message(
        self, tenant_id: str, user_id: str, workflow_id: str, text: str, message_id: str | None
    ) -> SubmitMessage:
        """A message with its proof: bound to its id and exact text (as the worker will hold it)."""
        message = SubmitMessage(user_id=user_id, text=text, message_id=message_id or uuid.uuid4().hex)
        binding = Binding.message(tenant_id, workflow_id, message.message_id or "", message.text)
        message.proof = self._proof(user_id, binding)
        return message

    async def send(self, row: Conversation, body: MessageBody) -> str:
        """Only the conversation's user writes to it: a token acting for them, or they themselves."""
        message = self._message(row.tenant_id, row.user_id, row.workflow_id, body.text, body.message_id)
        await self._signal(row, "submit_message", message)
        return message.message_id or ""

    async def _signal(self, row: Conversation, name: str, payload: BaseModel) -> None:
        try:
            await self.client.get_workflow_handle(row.workflow_id).signal(name, payload)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise HttpRefusal(409, f"conversation {row.workflow_id} has ended") from None
            raise

    # --- answers, rollback, end --------------------------------------------------------------------

    async def answer(self, caller: Caller, row: Conversation, call_id: str, body: AnswerBody) -> None:
        user = self.actor(caller, row)
        instance = await self._instance(row)
        proof = self._proof(
            user, Binding.answer(row.tenant_id, row.workflow_id, instance, call_id, body.text)
        )
        await self._signal(
            row, "answer", AnswerSignal(call_id=call_id, user_id=user, text=body.text, proof=proof)
        )

    async def rollback(self, caller: Caller, row: Conversation, body: RollbackBody) -> list[SagaEntry] | None:
        """Signal a proven rollback to a running conversation (None); an ended one is undone by a
        ConversationRollback workflow here, and its entries are the answer."""
        if body.scope == "call" and not body.call_id:
            raise HttpRefusal(422, "a rollback of scope call needs a call_id")
        user = self.actor(caller, row)
        instance = await self._instance(row)
        binding = Binding.rollback(row.tenant_id, row.workflow_id, instance, body.scope, body.call_id)
        request = RollbackRequest(
            requested_by=user, scope=body.scope, call_id=body.call_id, reason=body.reason,
            proof=self._proof(user, binding),
        )  # fmt: skip
        if await self._running(row.workflow_id):
            await self._signal(row, "rollback", request)
            return None
        outcome = await roll_back_ended(self.client, self._settings, row.workflow_id, request)
        if outcome.refused:
            raise HttpRefusal(403, f"rollback refused: {outcome.refused}")
        return outcome.entries

    async def end(self, caller: Caller, row: Conversation) -> None:
        user = self.actor(caller, row)
        proof = self._proof(user, Binding.end(row.tenant_id, row.workflow_id, await self._instance(row)))
        await self._signal(row, "end", EndConversation(requested_by=user, proof=proof))

    async def _instance(self, row: Conversation) -> str:
        """The conversation instance an answer's, rollback's or end's proof names: the one the row
        names now (db.instances). A conversation started a moment ago may not have registered it
        yet (its first run does, before anything else): waited for, at most INSTANCE_WAIT_S."""
        deadline = asyncio.get_running_loop().time() + INSTANCE_WAIT_S
        instance = row.conversation_id
        while instance is None or instance == PENDING:
            if asyncio.get_running_loop().time() > deadline:
                raise HttpRefusal(
                    409, f"conversation {row.workflow_id} has not started yet: try again in a moment"
                )
            await asyncio.sleep(0.1)
            instance = await self._store.latest_instance(row.workflow_id)
        return instance

    async def _running(self, workflow_id: str) -> bool:
        try:
            described = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return described.status is not None and described.status.name == "RUNNING"

    # --- reading ---------------------------------------------------------------------------------

    async def status(self, row: Conversation) -> StatusView:
        try:
            return await conversation_status(self.client, self._settings, row.workflow_id)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise HttpRefusal(404, f"no conversation {row.workflow_id} (not started, or gone)") from None
            raise

    async def transcript(self, row: Conversation) -> list[ChatMessage]:
        """Every message, all runs, from the conversation store; a conversation with nothing stored
        yet answers its `transcript` query."""
        stored = await self._store.latest(row.workflow_id)
        if stored:
            return stored
        try:
            messages: list[ChatMessage] = await self.client.get_workflow_handle(row.workflow_id).query(
                "transcript", result_type=list[ChatMessage]
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return []
            raise
        return messages

    async def _after_the_end(self, row: Conversation, message_id: str | None, turn: int | None) -> Reply:
        """The reply once the workflow no longer answers the update: a single-turn conversation can
        end before the CLI asks (its turn replied, stored); one that ended first has no reply; one
        that continued as new meanwhile is still running (the caller asks again)."""
        status = await self.status(row)
        if status.state != "ended":
            return Reply(state="running", status=status)
        instance = await self._store.latest_instance(row.workflow_id)
        stored = await self._store.ended_turn(row.workflow_id, instance, message_id, turn or 1)
        return Reply(state="replied", turn=stored) if stored else Reply(state="ended", status=status)

    # --- ratings ----------------------------------------------------------------------------------

    async def rate(self, row: Conversation, turn: int, body: RatingBody, via: RatedVia) -> dict[str, Any]:
        """The conversation's user rates turn `turn`'s reply (replacing an earlier rating); the
        caller was checked to act for that user (`conversation(…, "rate")`: no admin rates for
        another). 404 when the turn has no reply."""
        async with self.sessions.begin() as session:
            try:
                rated, replaced = await rate_reply(
                    session, row, turn, body.rating, body.comment, via, datetime.now(UTC)
                )
            except NoReply as err:
                raise HttpRefusal(404, str(err)) from None
            return rating_view(rated, replaced)

    async def ratings(self, row: Conversation) -> list[dict[str, Any]]:
        async with self.sessions() as session:
            return [rating_view(r) for r in await ratings_of(session, row)]

    async def rate_from_chat(
        self, tenant_id: str, user_id: str, workflow_id: str, turn: int, body: RatingBody
    ) -> dict[str, Any]:
        """A chat app's rating (a reaction or a button on a reply): `user_id` is the user the
        channel's sender map links the chat identity to, never what the chat message says. Only the
        conversation's user rates it, as through the API; recorded as a request `via` "chat".
        Raises HttpRefusal (404: not their conversation, or no reply to that turn)."""
        caller = Caller(tenant_id=tenant_id, person=user_id)
        try:
            row = await self.conversation(caller, workflow_id, "rate")
            rated = await self.rate(row, turn, body, "chat")
        except HttpRefusal as err:
            await self.record(caller, user_id, "rate", workflow_id, err.status, str(err), via="chat")
            raise
        await self.record(caller, user_id, "rate", workflow_id, 200, via="chat")
        return rated

    async def audit(self, row: Conversation) -> list[dict[str, Any]]:
        async with self.sessions() as session:
            return await audit_rows(session, row.workflow_id)

    async def reply(
        self, row: Conversation, message_id: str | None, turn: int | None, wait_s: float
    ) -> Reply:
        """Wait (at most `wait_s`) for the turn that answers `message_id` (or turn `turn`): its
        result, from the `wait_reply` (or `wait_turn`) update, which the workflow validates before
        it accepts it; or the status once it waits for a person; or `running` when the wait ran out.

        Nothing is polled: the status is asked once at first, then after each of the
        conversation's events that may change it (an approval, a question, a turn, a rollback:
        the events stream's LISTEN/NOTIFY wakes the wait), and every RECHECK_S without one (a run
        that fails or is terminated writes no event)."""
        handle: WorkflowHandle[Any, Any] = self.client.get_workflow_handle(row.workflow_id)
        if message_id is not None:
            update: Any = handle.execute_update("wait_reply", message_id, result_type=TurnResult | None)  # type: ignore[arg-type]
        else:
            update = handle.execute_update("wait_turn", turn or 1, result_type=TurnResult | None)  # type: ignore[arg-type]
        waiting = asyncio.ensure_future(update)
        loop = asyncio.get_running_loop()
        deadline, timeout = loop.time() + min(wait_s, MAX_WAIT_S), FIRST_LOOK_S
        status: StatusView | None = None
        try:
            async with self.events.feed.watch(row.workflow_id) as woken:
                seen = await self.events.log.latest_id(row.workflow_id)
                while True:
                    woke = asyncio.ensure_future(woken.get())
                    left = max(0.0, deadline - loop.time())
                    done, _ = await asyncio.wait({waiting, woke}, timeout=min(left, timeout))
                    woke.cancel()
                    if waiting.done():
                        return await self._replied(row, message_id, turn, waiting)
                    check = woke not in done or status is None
                    if woke in done:
                        batch = await self.events.log.after(row.workflow_id, seen)
                        seen = batch[-1].id if batch else seen
                        check = check or any(e.kind in STATUS_EVENTS for e in batch)
                    if check:
                        status = await self.status(row)
                        if status.pending_approvals or status.pending_questions:
                            return Reply(state="waiting", status=status)
                        if status.state == "ended":
                            return await self._after_the_end(row, message_id, turn)
                    if loop.time() >= deadline:
                        return Reply(state="running", status=status)
                    timeout = RECHECK_S
        finally:
            waiting.cancel()
            with contextlib.suppress(BaseException):
                await waiting

    async def outcome(self, row: Conversation, message_id: str) -> Reply:
        """The end of the turn that answers `message_id`, however long the person it waits for
        takes (a channel's turn, after "waiting for a person" was posted): read from the store when
        one of the conversation's events wakes the wait, and every RECHECK_S; `ended` when the
        conversation ended without it. No update is held open (a conversation admits only a few at
        once), so a wait of days costs a LISTEN and a read now and then."""
        async with self.events.feed.watch(row.workflow_id) as woken:
            quiet = True  # the status is asked at first and after RECHECK_S without an event
            while True:
                instance = await self._store.latest_instance(row.workflow_id)
                turn = await self._store.finished_turn(row.workflow_id, instance, message_id)
                if turn is not None:
                    return Reply(state="replied", turn=turn)
                if quiet and (await self.status(row)).state == "ended":
                    return await self._after_the_end(row, message_id, None)
                try:
                    await asyncio.wait_for(woken.get(), RECHECK_S)
                    quiet = False
                except TimeoutError:
                    quiet = True

    async def _replied(
        self, row: Conversation, message_id: str | None, turn: int | None, waiting: asyncio.Future[Any]
    ) -> Reply:
        """The answer of a finished `wait_reply`/`wait_turn` update."""
        failed = waiting.exception()
        if isinstance(failed, WorkflowUpdateFailedError):  # the message, or the wait, was refused
            raise HttpRefusal(409, refused_because(failed))
        result: TurnResult | None = None if failed else waiting.result()
        if result is not None:
            return Reply(state="replied", turn=result)
        return await self._after_the_end(row, message_id, turn)
