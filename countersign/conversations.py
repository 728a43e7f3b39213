"""Client-side helpers for conversations: start one, find its handle, render what it said."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from countersign.chat import ChatMessage
from countersign.config import SCRIPTED_LABEL, Settings
from countersign.conversation import WORKFLOW_TYPE, ConversationResult, StartConversation
from countersign.search_attributes import AGENT_NAME, AGENT_STATUS, TENANT_ID


def new_workflow_id(tenant_id: str) -> str:
    return f"conv-{tenant_id}-{uuid.uuid4().hex[:12]}"


def static_summary(start: StartConversation) -> str:
    first = f": {start.message[:120]}" if start.message else ""
    return f"{start.tenant_id}/{start.user_id} → {start.agent}{first}"


async def start_conversation(
    client: Client, settings: Settings, start: StartConversation
) -> WorkflowHandle[Any, ConversationResult]:
    return await client.start_workflow(
        WORKFLOW_TYPE,
        start,
        result_type=ConversationResult,
        id=new_workflow_id(start.tenant_id),
        task_queue=settings.task_queue,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(TENANT_ID, start.tenant_id),
                SearchAttributePair(AGENT_NAME, start.agent),
                SearchAttributePair(AGENT_STATUS, "running"),
            ]
        ),
        static_summary=static_summary(start),
        static_details=f"tenant `{start.tenant_id}` · user `{start.user_id}` · agent `{start.agent}`",
    )


def render_message(message: ChatMessage) -> str | None:
    """One transcript entry as a person reads it (None for the system prompt)."""
    if message.role == "system":
        return None
    if message.role == "user":
        return f"{message.name or 'user'}> {message.content}"
    if message.role == "tool":
        return f"  ← {message.name} [{message.tool_call_id}] {message.content}"
    lines = [f"agent> {message.content}"] if message.content else []
    lines += [f"  → {c.name}({c.arguments}) [{c.id}]" for c in message.tool_calls]
    return "\n".join(lines)


def render_transcript(messages: list[ChatMessage], scripted: bool) -> str:
    lines = [text for m in messages if (text := render_message(m)) is not None]
    if scripted and lines:
        lines.insert(0, f"{SCRIPTED_LABEL} (no real LLM configured: replies come from a scenario file)")
    return "\n".join(lines)
