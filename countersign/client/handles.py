"""Client-side helpers for conversations: start one, find its handle, render what it said."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import FailureError, WorkflowAlreadyStartedError

from countersign.core.contract import (
    WORKFLOW_TYPE,
    ConversationResult,
    StartConversation,
    StatusView,
    SubmitMessage,
    TurnResult,
)
from countersign.core.envelopes import SUMMARY_NAME
from countersign.core.markdown import escape_markdown
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackRequest, Saga, SagaEntry
from countersign.core.summaries import summarize_result, usage_line
from countersign.db.schema import CHAT_KINDS
from countersign.runtime.config import SCRIPTED_LABEL, Settings
from countersign.runtime.search_attributes import AGENT_NAME, AGENT_STATUS, TENANT_ID


def refused_because(err: WorkflowUpdateFailedError) -> str:
    """Why a conversation refused an update, as a person reads it: the sentence the workflow gave,
    never the failure's class name (`str()` of an ApplicationError leads with its type:
    "DecisionRefused: decision refused: …")."""
    cause = err.cause
    if isinstance(cause, FailureError):
        return cause.message
    return str(cause) if cause is not None else "the conversation refused the request"


def new_workflow_id(tenant_id: str) -> str:
    return f"conv-{tenant_id}-{uuid.uuid4().hex[:12]}"


def static_summary(start: StartConversation) -> str:
    first = f": {escape_markdown(start.message[:120])}" if start.message else ""
    return f"{start.tenant_id}/{start.user_id} → {start.agent}{first}"


def channel_key(kind: str, sender: str) -> str:
    """The key of a chat sender's conversation (`telegram_5618410820`): derived by the server."""
    return f"{kind}_{sender}"


def mcp_key(token_id: int, user_id: str, agent: str) -> str:
    """The key of an MCP client's conversation (one per token, user and agent): derived by the server."""
    return f"mcp:{token_id}:{user_id}:{agent}"


# The prefixes of the keys above: every chat kind's, and MCP clients'.
DERIVED_KEY_PREFIXES = (*(f"{kind}_" for kind in CHAT_KINDS), "mcp:")


def derived_key(key: str) -> bool:
    """Whether `key` is one the server derives for a chat sender or an MCP client: such a key is
    never claimed through the API, or whoever claimed it first would lock its owner out (409)."""
    return key.startswith(DERIVED_KEY_PREFIXES)


def keyed_workflow_id(tenant_id: str, key: str) -> str:
    """The one workflow id of the conversation a caller addresses by key (a channel and sender,
    like `telegram_5618410820`): the same key in the same tenant always reaches the same one."""
    if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,200}", key):
        raise ValueError(f"invalid conversation key {key!r}: use letters, digits and _ . : @ -")
    if "-key-" in tenant_id:  # the id's own separator: tenant "a-key-x" with key "y" would be tenant
        # "a" with key "x-key-y"; such a tenant's conversations are started without a key
        raise ValueError(f"tenant {tenant_id!r} cannot address conversations by key (its id holds '-key-')")
    return f"conv-{tenant_id}-key-{key}"


def start_options(settings: Settings, start: StartConversation) -> dict[str, Any]:
    return {
        "task_queue": settings.task_queue,
        "result_type": ConversationResult,
        "search_attributes": TypedSearchAttributes(
            [
                SearchAttributePair(TENANT_ID, start.tenant_id),
                SearchAttributePair(AGENT_NAME, start.agent),
                SearchAttributePair(AGENT_STATUS, "running"),
            ]
        ),
        "static_summary": static_summary(start),
        "static_details": f"tenant `{start.tenant_id}` · user `{start.user_id}` · agent `{start.agent}`",
    }


async def start_conversation(
    client: Client, settings: Settings, start: StartConversation
) -> WorkflowHandle[Any, ConversationResult]:
    return await client.start_workflow(
        WORKFLOW_TYPE, start, id=new_workflow_id(start.tenant_id), **start_options(settings, start)
    )


async def send_keyed(
    client: Client, settings: Settings, start: StartConversation, key: str, message: SubmitMessage
) -> WorkflowHandle[Any, ConversationResult]:
    """Deliver a message to the keyed conversation, starting it if none runs (signal-with-start:
    atomic on the server, so concurrent first messages never create two conversations).

    Two first messages racing can still meet "already started" from the server when both try to
    start at once; the second attempt finds the conversation running and signals it."""

    async def signal_with_start() -> WorkflowHandle[Any, ConversationResult]:
        return await client.start_workflow(
            WORKFLOW_TYPE,
            start,
            id=keyed_workflow_id(start.tenant_id, key),
            start_signal="submit_message",
            start_signal_args=[message],
            **start_options(settings, start),
        )

    try:
        return await signal_with_start()
    except WorkflowAlreadyStartedError:
        return await signal_with_start()


async def wait_reply(
    client: Client, workflow_id: str, message_id: str, attempts: int = 3
) -> TurnResult | None:
    """The turn that answered `message_id`. A conversation that continued-as-new meanwhile
    answers None from its old run; a handle with no run id then reaches the new run."""
    handle = client.get_workflow_handle(workflow_id)
    for _ in range(attempts):
        reply: TurnResult | None = await handle.execute_update(
            "wait_reply",
            message_id,
            result_type=TurnResult | None,  # type: ignore[arg-type]
        )
        if reply is not None or (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            return reply
    return None


def render_message(message: ChatMessage) -> str | None:
    """One transcript entry as a person reads it (None for the system prompt)."""
    if message.role == "system":  # the prompt and rollback notes; a running summary is shown
        return f"summary> {message.content}" if message.name == SUMMARY_NAME else None
    if message.role == "user":
        return f"{message.name or 'user'}> {message.content}"
    if message.role == "tool":
        return f"  ← {message.name} [{message.tool_call_id}] {summarize_result(message.content or '')}"
    lines = [f"agent> {message.content}"] if message.content else []
    lines += [f"  → {c.name}({c.arguments}) [{c.id}]" for c in message.tool_calls]
    return "\n".join(lines)


def render_transcript(messages: list[ChatMessage], scripted: bool) -> str:
    lines = [text for m in messages if (text := render_message(m)) is not None]
    if scripted and lines:
        lines.insert(0, f"{SCRIPTED_LABEL} (no real LLM configured: replies come from a scenario file)")
    return "\n".join(lines)


def render_status(workflow_id: str, view: StatusView) -> str:
    """The `status` query as a person reads it: state, usage, what waits for people, the last error."""
    u = view.usage
    lines = [
        f"{workflow_id}: {view.state} · turn {view.turn} · {view.tenant_id} · agent {view.agent}",
        f"usage: {usage_line(u.model_calls, u.tool_calls, u.total_tokens)}",
    ]
    lines += [
        f"pending approval {p.call_id}: {p.tool} {p.args} (risk {p.risk}, expires {p.expires_at})"
        for p in view.pending_approvals
    ]
    lines += [f"open question {q.call_id}: {q.question}" for q in view.pending_questions]
    if view.last_error:
        lines.append(f"last error: {view.last_error}")
    return "\n".join(lines)


async def roll_back(
    handle: WorkflowHandle[Any, Any],
    request: RollbackRequest,
    timeout_s: float = 60,
    send: Callable[[], Awaitable[None]] | None = None,
) -> list[SagaEntry]:
    """Signal a rollback and return the entries it undid, with their outcome, once it has run.

    Empty when nothing in that scope was left to undo; TimeoutError when it did not run (refused,
    or a turn is still going: a rollback runs between turns).
    """
    saga: Saga = await handle.query("saga", result_type=Saga)
    status: StatusView = await handle.query("status", result_type=StatusView)
    wanted = {e.call_id for e in saga.to_undo(request.scope, status.turn, request.call_id)}
    await (send() if send else handle.signal("rollback", request))
    deadline = asyncio.get_running_loop().time() + timeout_s
    while wanted and asyncio.get_running_loop().time() < deadline:
        saga = await handle.query("saga", result_type=Saga)
        entries = [e for e in saga.entries if e.call_id in wanted]
        if all(e.state != "registered" for e in entries):
            return entries
        await asyncio.sleep(0.2)
    if wanted:
        raise TimeoutError(
            "the rollback was not carried out (refused, or a turn is still running): see status"
        )
    return []
