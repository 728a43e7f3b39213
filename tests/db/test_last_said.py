"""ConversationStore.last_said: what the inbox shows beside each waiting call, for many conversations
in one statement (issue 36: a listing of N waiting calls read N conversations one by one)."""

from __future__ import annotations

import uuid

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.envelopes import AppendMessages, StoredMessage
from countersign.core.messages import ChatMessage, ToolCall
from countersign.db.engine import session_factory
from countersign.db.messages import ConversationStore


def said(seq: int, role: str, content: str | None, **more: object) -> StoredMessage:
    return StoredMessage(
        seq=seq, message=ChatMessage.model_validate({"role": role, "content": content, **more})
    )


async def test_the_latest_words_of_many_conversations_in_one_statement(db_engine: AsyncEngine) -> None:
    store = ConversationStore(session_factory(db_engine))
    first, second, silent = ((f"said-{uuid.uuid4()}", str(uuid.uuid4())) for _ in range(3))
    call = ToolCall(id="c1", name="get_lead", arguments="{}")
    await store.append(
        AppendMessages(
            workflow_id=first[0], conversation_id=first[1], tenant_id="acme",
            messages=[
                said(1, "system", "the prompt"), said(2, "user", "one"), said(3, "assistant", "two"),
                said(4, "user", "three"), said(5, "assistant", None, tool_calls=[call]),
                said(6, "tool", "{}", tool_call_id="c1", name="get_lead"), said(7, "assistant", ""),
                said(8, "assistant", "four"),
            ],
        )
    )  # fmt: skip
    await store.append(
        AppendMessages(
            workflow_id=second[0], conversation_id=second[1], tenant_id="acme",
            messages=[said(1, "user", "hello")],
        )
    )  # fmt: skip
    statements: list[str] = []

    def executed(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(db_engine.sync_engine, "before_cursor_execute", executed)
    try:
        found = await store.last_said([first, second, silent], 3)
    finally:
        event.remove(db_engine.sync_engine, "before_cursor_execute", executed)
    assert len(statements) == 1
    assert [m.content for m in found[first]] == ["two", "three", "four"]  # oldest first, text only
    assert [m.content for m in found[second]] == ["hello"]
    assert silent not in found
