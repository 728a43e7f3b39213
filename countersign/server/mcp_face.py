"""Countersign as an MCP server: `/mcp/{agent}`, Streamable HTTP (CONTRACT.md, "Countersign as an
MCP server"), for clients outside Countersign (Claude, Cursor, any agent with an MCP client).

Who calls: an API token (`Authorization: Bearer cst_…`), acting for its only user or the one
`X-Countersign-User` names; the token and the user's standing are read from PostgreSQL on every
request (a revoked token or a deactivated user is refused at once, also mid-conversation), the
token's tenant scopes everything. Every request is a `requester_actions` row (`via` "mcp"),
refusals included.

Where calls go: a token's user and agent have ONE conversation (keyed `mcp:<token id>:<user>:<agent>`),
started on first use, not one per MCP session: the 2026-07-28 protocol has no sessions (every
request stands alone), and a conversation per token, user and agent keeps what the calls changed
in one saga, so the user can undo one call or all of them (`POST /api/conversations/{id}/rollback`
with the same token; every result's `_meta` names the conversation and the call). A call is the
workflow's `serve_call` update: the model's own path (workflows/served.py), without a model turn.

A call that waits for a reviewer reaches its client by the first path the client declares it can
take (countersign/server/mcp_tasks.py, docs/how-to/mcp-face.md): a task it polls, a URL
elicitation, or, for a client with neither, its request held for the decision up to WAIT_S and
then the `countersign_outcome` tool by the call's id. The elicitation path answers `input_required`
(2026-07-28, SEP-2322): a URL elicitation pointing at the call's inbox card and a `requestState`
the client echoes when it asks again (countersign/core/continuation.py: MACed, bound to
principal, agent, conversation, call, tool and arguments, short-lived, spent once in
`mcp_continuations`). Asking again holds the request up to HOLD_S for the decision; the tool's
result comes once decided (a rejection or an expiry: an error result with the reason). A client
that declines or cancels the elicitation withdraws the call (its user rejects it, as a requester
always may). A result decided before the client asked again is answered from the store by
(conversation, call id), so it still comes once after the run that held the call continued as new
or ended.

The SDK's transport (mcp.server.streamable_http_manager, stateless, JSON responses) serves the
protocol: it is an ASGI app, which `serve` drives from the aiohttp handler after authenticating,
bounding the body (the app's `client_max_size`) and admitting the request; the caller travels in
the ASGI scope. Driving the SDK's own transport, rather than answering JSON-RPC by hand, keeps
every protocol version, header and error code the SDK knows correct as it evolves. An event stream
(`GET`) is held open: it counts against its person's bound of open streams, with their
conversation streams (countersign.server.conversation_events).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import mcp_types as types
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from countersign.client.handles import keyed_workflow_id, mcp_key, refused_because
from countersign.core.calls import ToolSpec
from countersign.core.continuation import (
    CONTINUATION_TTL,
    TASK_TTL,
    CallBinding,
    Continuation,
    Principal,
    TaskHandle,
    arguments_digest,
    opened,
    sealed,
    task_id,
    task_opened,
)
from countersign.core.contract import ServedCall, ServedOutcome
from countersign.core.messages import MAX_ARGUMENTS_CHARS, MAX_TOOL_NAME_CHARS, ChatMessage
from countersign.core.policy import callable_tools
from countersign.db.messages import ConversationStore
from countersign.db.people import roles_of
from countersign.db.schema import AgentProfile, ApprovalRequest, McpContinuation
from countersign.identity import tokens
from countersign.identity.proofs import Binding, canonical_json, mint_proof
from countersign.server.auth import Reviewer
from countersign.server.http import HttpRefusal, bearer_of
from countersign.server.inbox import DecisionRequest, Inbox
from countersign.server.mcp_tasks import (
    OUTCOME_TOOL,
    RELATED_TASK,
    TASKS_EXTENSION,
    WITHDRAWN,
    outcome_tool,
    status_of,
    still_waiting,
    task_created,
    task_wire,
    waiting_path,
)
from countersign.server.requesters import RECHECK_S, Caller, Requesters, StartBody
from tools.registry import REGISTRY

SCOPE_KEY = "countersign.mcp"  # where the ASGI scope carries the authenticated caller
USER_HEADER = "X-Countersign-User"
HOLD_S = 20.0  # how long asking again about a waiting call holds the request for its decision
# how long a call (or the outcome tool) of a client that can neither elicit nor poll a task is held
# for the decision: under the 60 s most clients give a request
WAIT_S = 45.0
CANCEL_WAIT_S = 10.0  # how long tasks/cancel waits for the withdrawal to be stored
TOOLS_WAIT_S = 10.0  # how long tools/list waits for a conversation just started to load its tools
SERVED_TOOLS = TypeAdapter(list[ToolSpec])
T = TypeVar("T")


@dataclass(frozen=True)
class McpCaller:
    """An authenticated request: the token's caller, the user it acts for, the agent it addresses."""

    caller: Caller
    user_id: str
    agent: str
    key: str  # the conversation key of this token, user and agent (one conversation for their calls)
    workflow_id: str  # that conversation's
    request: web.Request = field(compare=False, repr=False)  # whose client a held answer waits for

    @property
    def principal(self) -> Principal:
        assert self.caller.token is not None
        return Principal(tenant_id=self.caller.tenant_id, token_id=self.caller.token.id, user_id=self.user_id)


def continuation_key(server_key: Ed25519PrivateKey) -> bytes:
    """The HMAC key of request states: derived from the server's own key (the deployment's, which
    every server replica holds), for this use only, so nothing MACed with it passes as anything else."""
    raw = server_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return HKDF(algorithm=SHA256(), length=32, salt=None, info=b"countersign mcp request state").derive(raw)


def hints(spec: ToolSpec) -> types.ToolAnnotations:
    """The MCP hints of a tool, from its risk and category: a read changes nothing (and asking
    twice is the same); a write or an outbound message is destructive unless it is low-risk or can
    be undone."""
    read = spec.category == "read"
    return types.ToolAnnotations(
        read_only_hint=read,
        destructive_hint=not read and (spec.risk == "high" or not spec.compensable),
        idempotent_hint=read,
    )


def listed(spec: ToolSpec) -> types.Tool:
    """A tool as MCP lists it; any call of it may be task-augmented (2025-11-25: any call may wait
    for a reviewer, so a client that polls tasks may ask for one on any)."""
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.parameters,
        annotations=hints(spec),
        execution=types.ToolExecution(task_support="optional"),
    )


def bound_refusal(tool: str, arguments: str) -> str | None:
    """Why a call's name or arguments exceed what a conversation takes (`ServedCall`), else None."""
    if not tool or len(tool) > MAX_TOOL_NAME_CHARS:
        return f"no tool named {tool[:MAX_TOOL_NAME_CHARS]!r}"
    if len(arguments) > MAX_ARGUMENTS_CHARS:
        return f"arguments of {len(arguments)} characters, over the limit of {MAX_ARGUMENTS_CHARS}"
    return None


def refused(code: int, message: str) -> MCPError:
    return MCPError(code, message)


class TaskServer(Server[Any]):
    """The SDK's low-level server, its capabilities naming tasks at the handshake's versions
    (2025-11-25's `tasks`: task-augmented tools/call, tasks/cancel); at 2026-07-28 the tasks
    extension's entry in `extensions` names them."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            return capabilities
        calls = types.TasksToolsCapability(call=types.TasksCallCapability())
        tasks = types.ServerTasksCapability(
            cancel=types.TasksCancelCapability(), requests=types.ServerTasksRequestsCapability(tools=calls)
        )
        return capabilities.model_copy(update={"tasks": tasks})


class McpFace:
    def __init__(self, requesters: Requesters, inbox: Inbox) -> None:
        self.requesters = requesters
        self.inbox = inbox
        self._proof_key = requesters.signing_key
        self._state_key = continuation_key(requesters.signing_key)
        self._store = ConversationStore(requesters.sessions)
        self.server = TaskServer("countersign", on_list_tools=self.list_tools)
        self.server.extensions[TASKS_EXTENSION] = {}
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self.call_tool)
        self.server.add_request_handler("tasks/get", types.GetTaskRequestParams, self.get_task)
        self.server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self.task_result)
        self.server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self.cancel_task)
        self.server.middleware.append(self.legacy_task_call)
        self.manager = StreamableHTTPSessionManager(self.server, json_response=True, stateless=True)

    # --- who calls (the HTTP edge) ----------------------------------------------------------------

    async def authenticate(self, request: web.Request) -> McpCaller:
        """The token's caller for the user it acts for, or HttpRefusal (recorded when the tenant is
        known: an unknown token names no tenant to record under)."""
        bearer = bearer_of(request)
        if bearer is None or not tokens.looks_like_token(bearer):
            raise HttpRefusal(401, "send an API token: Authorization: Bearer cst_…")
        caller = await self.requesters.token_caller(bearer)
        if caller is None or caller.token is None:
            raise HttpRefusal(401, "unknown or revoked API token")
        named = request.headers.get(USER_HEADER)
        user = named or (next(iter(caller.token.act_as)) if len(caller.token.act_as) == 1 else None)
        agent = request.match_info["agent"][:200]
        if user is None or not caller.may_act_for(user):
            why = (
                f"token {caller.token.name} may not act for {named} (not its user, or deactivated)"
                if named
                else f"token {caller.token.name} acts for no active user"
                if not caller.token.act_as
                else f"token {caller.token.name} acts for several users: name one in {USER_HEADER}"
            )
            await self.record(caller, named, agent, "mcp", 403, why)
            raise HttpRefusal(403, why)
        async with self.requesters.sessions() as session:
            known = await session.get(AgentProfile, agent) is not None
        if not known:
            await self.record(caller, user, agent, "mcp", 404, f"no agent {agent}")
            raise HttpRefusal(404, f"no agent {agent}")
        key = mcp_key(caller.token.id, user, agent)
        try:
            workflow_id = keyed_workflow_id(caller.tenant_id, key)
        except ValueError as err:  # a user id a conversation key cannot hold (spaces, say)
            await self.record(caller, user, agent, "mcp", 422, str(err))
            raise HttpRefusal(422, str(err)) from None
        await self.requesters.admit(caller, user)
        return McpCaller(
            caller=caller, user_id=user, agent=agent, key=key, workflow_id=workflow_id, request=request
        )

    async def record(
        self, caller: Caller, user_id: str | None, agent: str, what: str, status: int, reason: str | None
    ) -> None:
        """A `requester_actions` row naming the token, the user and "mcp"."""
        await self.requesters.record(
            caller,
            user_id,
            "mcp",
            None,
            status,
            f"{agent} {what}: {reason}" if reason else f"{agent} {what}",
            via="mcp",
        )

    # --- the protocol's handlers ----------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        who = caller_of(ctx)
        await self._start(who)
        # the user's roles now, not as the conversation loaded them: a demoted admin sees no admin tool
        specs = callable_tools(await self._served_tools(who.workflow_id), await self._roles(who))
        await self.record(who.caller, who.user_id, who.agent, "tools/list", 200, f"{len(specs)} tools")
        return types.ListToolsResult(tools=[*(listed(s) for s in specs), outcome_tool()])

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> HandlerResult:
        who = caller_of(ctx)
        if params.name == OUTCOME_TOOL:
            return await self._outcome(who, params.arguments or {})
        # one spelling of the arguments however the client orders their keys: asking again about a
        # waiting call with its keys in another order is the same call, not "another call"
        arguments = canonical_json(params.arguments or {})
        binding = CallBinding(
            principal=who.principal,
            agent=who.agent,
            workflow_id=who.workflow_id,
            tool=params.name,
            args_sha256=arguments_digest(arguments),
        )
        bound = bound_refusal(params.name, arguments)
        if bound is not None:  # what no call of this server could take: no conversation is asked
            await self.record(who.caller, who.user_id, who.agent, "tools/call", 422, bound)
            raise refused(types.INVALID_PARAMS, bound)
        if params.request_state is not None:
            asked = await self._asked_again(who, binding, params, arguments)
            if isinstance(asked, types.CallToolResult):
                return asked
            call = asked
        else:
            await self._callable(who, params.name)
            call = self._new_call(who, params.name, arguments)
        outcome = await self._serve(who, who.workflow_id, call)
        path = (
            "elicitation"
            if call.resume
            else waiting_path(ctx.protocol_version, ctx.session.client_capabilities, params.task)
        )
        # 2025-11-25 answers a task-augmented call with a task whatever comes of it; 2026-07-28, only
        # a call that waits (the server decides, and a task that is done at once is no use)
        legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
        if path == "task" and (outcome.state == "waiting" or (legacy and not unknown_tool(outcome))):
            return await self._task(ctx, who, call)
        if outcome.state == "done":
            return await self._result(who, who.workflow_id, outcome)
        card = self._card(who.workflow_id, call.call_id)
        what = f"tools/call {params.name} {call.call_id}"
        await self.record(who.caller, who.user_id, who.agent, what, 202, f"waits for a reviewer: {card}")
        if path == "hold":
            return await self._hold(who, call, card)
        state = self._seal(binding, call.call_id)
        if call.resume:  # the client opened the card already: only ask again
            return types.InputRequiredResult(request_state=state)
        elicitation = types.ElicitRequest(
            params=types.ElicitRequestURLParams(
                message=f"{params.name} waits for a reviewer's approval: its card in the Countersign inbox",
                url=card,
                elicitation_id=call.call_id,
            )
        )
        return types.InputRequiredResult(input_requests={"approval": elicitation}, request_state=state)

    async def legacy_task_call(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        """A `Server.middleware`: a task-augmented tools/call at 2025-11-25 answers a task
        (`CreateTaskResult`), a shape the SDK's result check of tools/call at that version does not
        know, so this answers it here (the SDK's own check applies to every other request)."""
        raw = ctx.params
        if (
            ctx.method != "tools/call"
            or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
            or not isinstance(raw, Mapping)
            or raw.get("task") is None
        ):
            return await call_next(ctx)
        try:
            params = types.CallToolRequestParams.model_validate(raw, by_name=False)
        except ValidationError:
            raise refused(types.INVALID_PARAMS, "invalid tools/call parameters") from None
        return await self.call_tool(ctx, params)

    async def _asked_again(
        self, who: McpCaller, binding: CallBinding, params: types.CallToolRequestParams, arguments: str
    ) -> types.CallToolResult | ServedCall:
        """The call a request state is for (spent once), or its result when it was decided and
        stored already (the run that held the call may have continued or ended since)."""
        assert params.request_state is not None
        call_id = await self._spend(who, binding, params.request_state)
        declined = declined_by(params.input_responses)
        if declined is not None:
            why = f"{WITHDRAWN}: the MCP client {declined} the approval"
            await self._withdraw(who, who.workflow_id, call_id, params.name, why)
        answered = await self._store.answer_to(who.workflow_id, call_id)
        if answered is not None:
            text = answered.content or ""
            return await self._answer(who, who.workflow_id, call_id, params.name, text, *envelope_of(text))
        return ServedCall(
            user_id=who.user_id, call_id=call_id, tool=params.name, arguments=arguments, resume=True
        )

    def _new_call(self, who: McpCaller, tool: str, arguments: str) -> ServedCall:
        """A new call, with the server's proof for exactly it (the conversation checks it)."""
        call_id = f"mcp-{uuid.uuid4().hex}"
        proof = mint_proof(
            self._proof_key,
            who.user_id,
            Binding.call(who.caller.tenant_id, who.workflow_id, call_id, tool, arguments),
            datetime.now(UTC),
        )
        return ServedCall(user_id=who.user_id, call_id=call_id, tool=tool, arguments=arguments, proof=proof)

    def _card(self, workflow_id: str, call_id: str) -> str:
        return f"{self.requesters.public_url}/#{workflow_id}/{call_id}"  # never the request's Host

    # --- a client that can neither elicit nor poll a task ----------------------------------------

    async def _hold(self, who: McpCaller, call: ServedCall, card: str) -> types.CallToolResult:
        """Hold the call's request for its decision, up to WAIT_S (and within its person's bound of
        held requests); then its result, or what says it still waits and how to get the result."""
        asked = call.model_copy(update={"resume": True, "proof": None})
        held = await self._within(who, lambda: self._update(who, who.workflow_id, asked, WAIT_S))
        if held is not None and held[0].state == "done":
            return await self._result(who, who.workflow_id, held[0])
        waited = WAIT_S if held is not None else 0.0
        return error_result(
            still_waiting(call.tool, call.call_id, card, waited), who.workflow_id, call.call_id
        )

    async def _outcome(self, who: McpCaller, arguments: Mapping[str, Any]) -> types.CallToolResult:
        """The `countersign_outcome` tool: the result of a call of this caller's conversation that
        waited, once decided (held for it up to WAIT_S), else what says it still waits."""
        call_id = arguments.get("call_id")
        what = f"tools/call {OUTCOME_TOOL}"
        if not isinstance(call_id, str) or not 0 < len(call_id) <= 200:
            why = f'{OUTCOME_TOOL} takes the waiting call\'s id: {{"call_id": "mcp-…"}}'
            await self.record(who.caller, who.user_id, who.agent, what, 422, why)
            raise refused(types.INVALID_PARAMS, why)
        async with self.requesters.sessions() as session:
            asked = await session.scalar(
                select(ApprovalRequest.tool).where(
                    ApprovalRequest.workflow_id == who.workflow_id, ApprovalRequest.call_id == call_id
                )
            )
        answer = await self._store.answer_to(who.workflow_id, call_id)
        if answer is None and asked is None:
            why = f"no call {call_id} waited in this conversation"
            await self.record(who.caller, who.user_id, who.agent, what, 404, why)
            raise refused(types.INVALID_PARAMS, why)
        waited = 0.0
        if answer is None:
            held = await self._within(who, lambda: self._answer_within(who.workflow_id, call_id, WAIT_S))
            answer, waited = (held[0], WAIT_S) if held is not None else (None, 0.0)
        tool = asked or (answer.name if answer is not None else None) or OUTCOME_TOOL
        if answer is None:
            card = self._card(who.workflow_id, call_id)
            await self.record(
                who.caller, who.user_id, who.agent, f"{what} {call_id}", 202, f"still waits: {card}"
            )
            return error_result(still_waiting(tool, call_id, card, waited), who.workflow_id, call_id)
        text = answer.content or ""
        return await self._answer(who, who.workflow_id, call_id, tool, text, *envelope_of(text))

    async def _within(self, who: McpCaller, wait: Callable[[], Awaitable[T]]) -> tuple[T] | None:
        """`(wait(),)`, counted against its person's bound of open streams (their event streams
        and held requests): None, without waiting, when they hold as many as they may. A client
        that goes away ends the wait within a second (the SDK's JSON-response transport does not
        watch for it), so that it stops counting against that bound."""
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self.requesters.events.opened(who.caller.tenant_id, who.user_id))
            except HttpRefusal as err:
                await self.record(who.caller, who.user_id, who.agent, "held call", err.status, str(err))
                return None
            waiting, gone = asyncio.ensure_future(wait()), asyncio.ensure_future(went_away(who.request))
            try:
                await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
                gone.cancel()
                await asyncio.gather(waiting, gone, return_exceptions=True)
            if waiting.cancelled():
                why = "the client went away"
                await self.record(who.caller, who.user_id, who.agent, "held call", 499, why)
                raise refused(types.INTERNAL_ERROR, why)
            return (waiting.result(),)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _answer_within(self, workflow_id: str, call_id: str, seconds: float) -> ChatMessage | None:
        """The stored result of a call once it is there, or None when `seconds` passed: the store,
        not the run, since the run that held the call may have continued as new or ended. Read
        again when the conversation's events wake the wait (the result's tool message is one, sent
        by NOTIFY as the conversation's event streams get it), and every RECHECK_S without one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        async with self.requesters.events.feed.watch(workflow_id) as woken:  # before the first read
            while True:
                answer = await self._store.answer_to(workflow_id, call_id)
                left = deadline - loop.time()
                if answer is not None or left <= 0:
                    return answer
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.get(), min(left, RECHECK_S))

    # --- tasks ------------------------------------------------------------------------------------

    async def _task(self, ctx: ServerRequestContext[Any], who: McpCaller, call: ServedCall) -> dict[str, Any]:
        """The task a call becomes: its id seals whose call it is (never how it stands)."""
        now = datetime.now(UTC)
        handle = TaskHandle(
            principal=who.principal,
            agent=who.agent,
            workflow_id=who.workflow_id,
            call_id=call.call_id,
            tool=call.tool,
            created_at=now,
            expires_at=now + TASK_TTL,
        )
        task, _ = await self._task_now(ctx.protocol_version, task_id(self._state_key, handle), handle)
        what = f"tools/call {call.tool} {call.call_id}"
        await self.record(who.caller, who.user_id, who.agent, what, 202, f"a task, {task['status']}")
        return task_created(ctx.protocol_version, task)

    async def _task_now(
        self, protocol_version: str, sealed_id: str, handle: TaskHandle
    ) -> tuple[dict[str, Any], types.CallToolResult | None]:
        """How a task stands, read from its call's stored result, and that result once there."""
        answer = await self._store.answer_to(handle.workflow_id, handle.call_id)
        text = (answer.content or "") if answer is not None else None
        ok = text is not None and envelope_of(text)[0]
        status = status_of(text, text is not None and not ok and await self._withdrawn(handle))
        card = self._card(handle.workflow_id, handle.call_id)
        message = {
            "working": f"{handle.tool} waits for a reviewer's decision: {card}",
            "completed": f"{handle.tool} was decided: its result is ready",
            "cancelled": f"{handle.tool} was withdrawn by its requester",
        }[status]
        task = task_wire(protocol_version, sealed_id, handle, status, message, datetime.now(UTC))
        result = stored_result(handle.workflow_id, handle.call_id, text, ok) if text is not None else None
        return task, result

    async def _withdrawn(self, handle: TaskHandle) -> bool:
        """Whether the task's call was rejected by its own requester: withdrawn, not refused."""
        async with self.requesters.sessions() as session:
            found = await session.scalar(
                select(ApprovalRequest.call_id).where(
                    ApprovalRequest.workflow_id == handle.workflow_id,
                    ApprovalRequest.call_id == handle.call_id,
                    ApprovalRequest.state == "rejected",
                    ApprovalRequest.decided_by == ApprovalRequest.requested_by,
                )
            )
        return found is not None

    async def _handle(
        self, ctx: ServerRequestContext[Any], who: McpCaller, sealed_id: str, what: str
    ) -> TaskHandle:
        """The task a tasks/* request names, when it is the caller's (the tasks extension's error
        for a 2026-07-28 client that does not declare the extension on the request)."""
        capabilities = ctx.session.client_capabilities
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and (
            capabilities is None or TASKS_EXTENSION not in (capabilities.extensions or {})
        ):
            why = f"{what} needs the client capability {TASKS_EXTENSION}"
            await self.record(who.caller, who.user_id, who.agent, what, 400, why)
            required: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
            raise MCPError(types.MISSING_REQUIRED_CLIENT_CAPABILITY, why, required)
        handle = task_opened(self._state_key, sealed_id, who.principal, who.agent, datetime.now(UTC))
        if isinstance(handle, str):
            await self.record(who.caller, who.user_id, who.agent, what, 404, handle)
            raise refused(types.INVALID_PARAMS, f"{what}: {handle}")
        return handle

    async def get_task(
        self, ctx: ServerRequestContext[Any], params: types.GetTaskRequestParams
    ) -> HandlerResult:
        """tasks/get: how the task stands; at 2026-07-28 a completed task carries its result."""
        who = caller_of(ctx)
        handle = await self._handle(ctx, who, params.task_id, "tasks/get")
        task, result = await self._task_now(ctx.protocol_version, params.task_id, handle)
        if result is not None and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            task["result"] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        what = f"tasks/get {handle.tool} {handle.call_id}"
        await self.record(who.caller, who.user_id, who.agent, what, 200, task["status"])
        return task

    async def task_result(
        self, ctx: ServerRequestContext[Any], params: types.GetTaskPayloadRequestParams
    ) -> HandlerResult:
        """tasks/result (2025-11-25): the call's result, the request held until it is decided (as
        the specification asks), counted against its person's bound of open streams; the
        approval's own expiry ends the wait with an expiry result."""
        who = caller_of(ctx)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:  # the extension has tasks/get only
            raise refused(types.METHOD_NOT_FOUND, "tasks/result is 2025-11-25's: poll tasks/get")
        handle = await self._handle(ctx, who, params.task_id, "tasks/result")
        left = (handle.expires_at - datetime.now(UTC)).total_seconds()
        held = await self._within(who, lambda: self._answer_within(handle.workflow_id, handle.call_id, left))
        answer = held[0] if held is not None else None
        if answer is None:
            over = held is None
            why = "no more requests of yours may wait now: poll tasks/get" if over else "the task has expired"
            await self.record(who.caller, who.user_id, who.agent, "tasks/result", 429 if over else 404, why)
            raise refused(types.INTERNAL_ERROR if over else types.INVALID_PARAMS, why)
        text = answer.content or ""
        result = await self._answer(
            who, handle.workflow_id, handle.call_id, handle.tool, text, *envelope_of(text)
        )
        meta = {**(result.meta or {}), RELATED_TASK: {"taskId": params.task_id}}
        return result.model_copy(update={"meta": meta})

    async def cancel_task(
        self, ctx: ServerRequestContext[Any], params: types.CancelTaskRequestParams
    ) -> HandlerResult:
        """tasks/cancel: the call's requester withdraws it (as declining its card does); a task that
        was decided already is not cancelled (the specification's error)."""
        who = caller_of(ctx)
        handle = await self._handle(ctx, who, params.task_id, "tasks/cancel")
        task, result = await self._task_now(ctx.protocol_version, params.task_id, handle)
        if result is not None:
            why = f"the task is {task['status']} already: it cannot be cancelled"
            await self.record(who.caller, who.user_id, who.agent, "tasks/cancel", 409, why)
            raise refused(types.INVALID_PARAMS, why)
        why = f"{WITHDRAWN}: the MCP client cancelled its task"
        await self._withdraw(who, handle.workflow_id, handle.call_id, handle.tool, why)
        await self._answer_within(handle.workflow_id, handle.call_id, CANCEL_WAIT_S)
        task, _ = await self._task_now(ctx.protocol_version, params.task_id, handle)
        return task

    async def _roles(self, who: McpCaller) -> list[str]:
        """The user's roles in the token's tenant now (none once deactivated)."""
        async with self.requesters.sessions() as session:
            return await roles_of(session, who.caller.tenant_id, who.user_id) or []

    async def _callable(self, who: McpCaller, tool: str) -> None:
        """Refuse (and record) a new call of a tool the user's roles no longer allow: read now, since
        the conversation's own check reads the roles it loaded when it started."""
        registered = REGISTRY.get(tool)
        needs = registered.required_roles if registered is not None else ()
        if needs and not set(needs) & set(await self._roles(who)):
            why = f"{tool} needs the role {' or '.join(needs)}, which {who.user_id} does not have"
            await self.record(who.caller, who.user_id, who.agent, f"tools/call {tool}", 403, why)
            raise refused(types.INVALID_REQUEST, why)

    # --- the conversation behind them -------------------------------------------------------------

    async def _start(self, who: McpCaller) -> None:
        """Start this token's, user's and agent's conversation (`who.workflow_id`) unless it runs."""
        body = StartBody(agent=who.agent, key=who.key, user_id=who.user_id)
        try:
            await self.requesters.start(who.caller, who.user_id, body)
        except HttpRefusal as err:
            await self.record(who.caller, who.user_id, who.agent, "start", err.status, str(err))
            raise refused(types.INVALID_REQUEST, str(err)) from None

    async def _served_tools(self, workflow_id: str) -> list[ToolSpec]:
        handle = self.requesters.client.get_workflow_handle(workflow_id)
        deadline = asyncio.get_running_loop().time() + TOOLS_WAIT_S
        while True:  # a conversation just started loads its tools first (an empty list until then)
            specs = SERVED_TOOLS.validate_python(await handle.query("served_tools"))
            if specs or asyncio.get_running_loop().time() >= deadline:
                return specs
            await asyncio.sleep(0.05)

    async def _serve(self, who: McpCaller, workflow_id: str, call: ServedCall) -> ServedOutcome:
        """The call's outcome from its conversation, which is started first when none runs (its
        first call, or the previous one ended): asking first saves a start on every call."""
        hold = HOLD_S if call.resume else None
        try:
            return await self._update(who, workflow_id, call, hold)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND or call.resume:
                await self.record(who.caller, who.user_id, who.agent, "tools/call", 503, err.message)
                raise refused(types.INTERNAL_ERROR, f"Temporal: {err.message}") from None
        await self._start(who)
        return await self._update(who, workflow_id, call, hold)

    async def _update(
        self, who: McpCaller, workflow_id: str, call: ServedCall, hold: float | None
    ) -> ServedOutcome:
        """The `serve_call` update's answer; asking again about a call (`resume`) is held up to
        `hold` seconds for the decision, then answers that the call still waits."""
        what = f"tools/call {call.tool} {call.call_id}"
        handle = self.requesters.client.get_workflow_handle(workflow_id)
        update = handle.execute_update("serve_call", call, result_type=ServedOutcome)
        try:
            if hold is not None:
                try:
                    return await asyncio.wait_for(update, hold)
                except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):  # still waiting
                    return ServedOutcome(call_id=call.call_id, state="waiting")
            outcome: ServedOutcome = await update
            return outcome
        except WorkflowUpdateFailedError as err:
            reason = refused_because(err)
            await self.record(who.caller, who.user_id, who.agent, what, 409, reason)
            raise refused(types.INVALID_REQUEST, reason) from None

    async def _result(self, who: McpCaller, workflow_id: str, outcome: ServedOutcome) -> types.CallToolResult:
        """The tool's result as its conversation stored it (the body is in PostgreSQL)."""
        stored = outcome.result
        assert stored is not None
        instance = await self._store.latest_instance(workflow_id)
        message = (await self._store.at(workflow_id, instance, [stored.seq])).get(stored.seq)
        text = message.content if message is not None and message.content else json.dumps({"ok": stored.ok})
        return await self._answer(who, workflow_id, stored.call_id, stored.tool, text, stored.ok, stored.code)

    async def _answer(
        self, who: McpCaller, workflow_id: str, call_id: str, tool: str, text: str, ok: bool, code: str | None
    ) -> types.CallToolResult:
        """The client's result of a stored tool message (`text`), recorded."""
        what = f"tools/call {tool} {call_id}"
        failure = None if ok else error_message(text)[:500]
        await self.record(who.caller, who.user_id, who.agent, what, 200 if ok else 422, failure)
        if code == "UNKNOWN_TOOL":  # the protocol's error for a tool that is not there
            raise refused(types.INVALID_PARAMS, error_message(text))
        return stored_result(workflow_id, call_id, text, ok)

    async def _withdraw(self, who: McpCaller, workflow_id: str, call_id: str, tool: str, reason: str) -> None:
        """The client declined or cancelled the call's card: its user withdraws the call, as a
        requester may always reject their own (the decision proven, recorded and audited, the call
        never run, the card gone from the inbox). A call decided meanwhile stays as decided; the
        client then gets its result as asked."""
        what = f"tools/call {tool} {call_id}"
        request = DecisionRequest(decision="reject", reason=reason)
        requester = Reviewer(tenant_id=who.caller.tenant_id, user_id=who.user_id)
        try:
            await self.inbox.decide(requester, workflow_id, call_id, request)
        except HttpRefusal as err:
            await self.record(who.caller, who.user_id, who.agent, what, err.status, f"not withdrawn: {err}")
            return
        await self.record(who.caller, who.user_id, who.agent, what, 200, reason)

    # --- request states ---------------------------------------------------------------------------

    def _seal(self, binding: CallBinding, call_id: str) -> str:
        expires = datetime.now(UTC) + CONTINUATION_TTL
        continuation = Continuation(
            **binding.model_dump(), call_id=call_id, nonce=secrets.token_urlsafe(18), expires_at=expires
        )
        return sealed(self._state_key, continuation)

    async def _spend(self, who: McpCaller, binding: CallBinding, state: str) -> str:
        """The call a request state is for, once: a forged, altered, expired, misbound or replayed
        state is refused and recorded."""
        continuation = opened(self._state_key, state, binding, datetime.now(UTC))
        if isinstance(continuation, Continuation):
            async with self.requesters.sessions.begin() as session:
                spent = await session.scalar(
                    insert(McpContinuation)
                    .values(
                        nonce=continuation.nonce,
                        tenant_id=who.caller.tenant_id,
                        workflow_id=binding.workflow_id,
                        call_id=continuation.call_id,
                    )
                    .on_conflict_do_nothing()
                    .returning(McpContinuation.nonce)
                )
            if spent is not None:
                return continuation.call_id
            continuation = "the request state was used before (a replay)"
        await self.record(who.caller, who.user_id, who.agent, f"tools/call {binding.tool}", 403, continuation)
        raise refused(types.INVALID_PARAMS, f"request state refused: {continuation}")

    # --- the HTTP side --------------------------------------------------------------------------

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """Authenticate, bound and admit the request, then hand it to the SDK's transport."""
        try:
            who = await self.authenticate(request)
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                why = f"request body larger than {request.client_max_size} bytes"
                await self.record(who.caller, who.user_id, who.agent, "request", 413, why)
                raise HttpRefusal(413, why) from None
        except HttpRefusal as err:
            return jsonrpc_error(err)
        if request.method == "GET":  # an event stream, held open: within the person's bound
            try:
                with self.requesters.events.opened(who.caller.tenant_id, who.user_id):
                    return await drive_asgi(self.manager.handle_request, request, body, {SCOPE_KEY: who})
            except HttpRefusal as err:
                await self.record(who.caller, who.user_id, who.agent, "event stream", err.status, str(err))
                return jsonrpc_error(err)
        response = await drive_asgi(self.manager.handle_request, request, body, {SCOPE_KEY: who})
        if response.status >= 400:  # what never reached a handler (malformed, unknown method) too
            why = f"{request.method} refused by the MCP transport"
            await self.record(who.caller, who.user_id, who.agent, "request", response.status, why)
        return response


def caller_of(ctx: ServerRequestContext[Any]) -> McpCaller:
    """The caller `serve` authenticated, carried in the ASGI scope of the request."""
    who = ctx.request.scope.get(SCOPE_KEY) if ctx.request is not None else None
    if not isinstance(who, McpCaller):  # never: every request comes through `serve`
        raise refused(types.INVALID_REQUEST, "unauthenticated")
    return who


def error_message(text: str) -> str:
    """The message of a stored error envelope (`{"ok": false, "error": {"code", "message"}}`)."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text


WITHDRAWING = {"decline": "declined", "cancel": "cancelled"}


def declined_by(responses: types.InputResponses | None) -> str | None:
    """How the client answered the approval's URL elicitation when it did not accept it
    ("declined", "cancelled"), else None (accepted, or asking again without an answer)."""
    answer = (responses or {}).get("approval")
    return WITHDRAWING.get(answer.action) if isinstance(answer, types.ElicitResult) else None


def envelope_of(text: str) -> tuple[bool, str | None]:
    """Whether a stored tool message's text is a success, and its error code when it is not
    (`{"ok": true, ...}` | `{"ok": false, "error": {"code", ...}}`), for a result read back from the
    store without its envelope; text that is neither is a failure."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return False, None
    if not isinstance(parsed, dict):
        return False, None
    error = parsed.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return parsed.get("ok") is True, code if isinstance(code, str) else None


def stored_result(workflow_id: str, call_id: str, text: str, ok: bool) -> types.CallToolResult:
    """The client's result of a stored tool message's text: the text, and the object it is."""
    try:
        structured = json.loads(text)
    except ValueError:
        structured = None
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=structured if isinstance(structured, dict) else None,
        is_error=not ok,
        _meta=conversation_meta(workflow_id, call_id),
    )


def unknown_tool(outcome: ServedOutcome) -> bool:
    return outcome.result is not None and outcome.result.code == "UNKNOWN_TOOL"


def conversation_meta(workflow_id: str, call_id: str) -> dict[str, Any]:
    return {"countersign": {"workflow_id": workflow_id, "call_id": call_id}}


def error_result(text: str, workflow_id: str, call_id: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=text)], is_error=True, _meta=conversation_meta(workflow_id, call_id)
    )


def jsonrpc_error(refusal: HttpRefusal) -> web.Response:
    """A refusal before the protocol: the HTTP status (401 says how to authenticate, 429 when to
    come back), and a JSON-RPC error a client can show."""
    headers = {"WWW-Authenticate": 'Bearer realm="countersign"'} if refusal.status == 401 else {}
    if refusal.retry_after_s is not None:
        headers["Retry-After"] = str(refusal.retry_after_s)
    error = {"code": types.INVALID_REQUEST, "message": str(refusal)}
    return web.json_response(
        {"jsonrpc": "2.0", "id": None, "error": error}, status=refusal.status, headers=headers
    )


async def went_away(request: web.Request) -> None:
    """Return once the client of `request` has gone, within a second: an event stream it held then
    ends, and stops counting against its person's bound."""
    while True:
        if request.transport is None or request.transport.is_closing():
            return
        await asyncio.sleep(1.0)


async def drive_asgi(
    app: Any, request: web.Request, body: bytes, extra: dict[str, Any]
) -> web.StreamResponse:
    """Run ASGI `app` for an aiohttp request whose body was read already: its response streamed
    back as the app sends it."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.split("?")[0].encode(),
        "query_string": request.query_string.encode(),
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()],
        "client": (request.remote or "", 0),
        "server": (request.url.host or "", request.url.port or 0),
        **extra,
    }
    delivered = False
    response: web.StreamResponse | None = None

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await went_away(request)  # nothing more comes but the end
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            response = web.StreamResponse(status=message["status"])
            for name, value in message.get("headers", []):
                response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
            await response.prepare(request)
        elif message["type"] == "http.response.body" and response is not None:
            await response.write(message.get("body", b""))
            if not message.get("more_body", False):
                await response.write_eof()

    await app(scope, receive, send)
    assert response is not None  # an ASGI app always starts its response
    return response


def add_routes(app: web.Application, requesters: Requesters, inbox: Inbox) -> None:
    face = McpFace(requesters, inbox)

    async def running(_: web.Application) -> AsyncIterator[None]:
        """The SDK's manager runs in a task of its own: aiohttp may start and clean up the app in
        different tasks, and the manager's task group must be left in the task that entered it."""
        started, stop = asyncio.Event(), asyncio.Event()

        async def manage() -> None:
            async with face.manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(manage())
        await started.wait()
        yield
        stop.set()
        await task

    app.cleanup_ctx.append(running)
    app.router.add_route("*", "/mcp/{agent}", face.serve)
