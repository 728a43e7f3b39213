"""Direct mode: small talk is answered without the tool schemas, and the model can still get them.

The rule is a pure function (tested here without a server); the turn runs on the real parts: the
workflow on the time-skipping server, the scripted model through the real `openai` client, the
conversation store in PostgreSQL. The tokens saved are the scripted model's own usage counts.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from activities.model import native_tool
from countersign.core.direct import DIRECT_NOTE, NEED_TOOLS, conversational, is_marker, marker, wants_tools
from countersign.core.messages import ChatMessage, ToolCall
from countersign.db.engine import session_factory
from countersign.db.events import streamed_text
from countersign.db.messages import ConversationStore
from countersign.db.seed import AGENTS
from countersign.runtime.config import SCRIPTED_MODEL_NAME
from countersign.scripted_model.scenario import Reply
from countersign.scripted_model.server import Fault, ScriptedModelServer, completion
from tests.activities.test_streaming import events_of
from tests.fixtures.agent import AgentHarness
from tools import REGISTRY
from tools.records import schema_map


@pytest.mark.parametrize(
    "text",
    ["hi", "Hello!", "hey there", "Good morning :)", "thanks a lot!", "Thank you so much", "cheers!",
     "bye, have a nice day", "how are you doing?"],
)  # fmt: skip
def test_small_talk_is_direct(text: str) -> None:
    assert conversational(text)


@pytest.mark.parametrize(
    "text",
    ["yes", "ok", "go ahead", "no", "How many new leads are there?", "hi, what do we have on Initech?",
     "thanks, now email Jane", "help", "thanks " * 9, "hi 2", "", "   ", "?!"],
)  # fmt: skip
def test_anything_else_gets_the_tools(text: str) -> None:
    assert not conversational(text)


def test_what_asks_for_the_tools() -> None:
    assert wants_tools(ChatMessage(role="assistant", content=NEED_TOOLS))
    assert wants_tools(ChatMessage(role="assistant", content=f"[scripted model] {NEED_TOOLS}."))
    assert wants_tools(ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="count_records")]))
    assert wants_tools(marker()) and is_marker(marker())
    assert not is_marker(ChatMessage(role="assistant", content=NEED_TOOLS))  # only the activity marks
    assert not wants_tools(ChatMessage(role="assistant", content="Hello! How can I help?"))
    assert not wants_tools(ChatMessage(role="assistant", content=f"I could say {NEED_TOOLS} " * 3))


def offered(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools") or []]


async def test_a_greeting_is_answered_without_tools(agent: AgentHarness, db_engine: AsyncEngine) -> None:
    agent.script({"when": {"user_contains": "hello"}, "reply": {"content": "Hello! How can I help?"}})
    before = len(agent.model.requests)
    result = await agent.converse("Hello!", agent="admin-assistant")
    assert (result.last_reply or "").endswith("Hello! How can I help?") and result.usage.model_calls == 1
    (request,) = agent.model.requests[before:]
    assert "tools" not in request
    assert (
        request["messages"][0]["content"].endswith(DIRECT_NOTE) and request["messages"][-1]["role"] == "user"
    )


async def test_a_task_gets_the_tools_at_once(agent: AgentHarness) -> None:
    agent.script(
        {"when": {"user_contains": "how many"}, "reply": {"content": "Two."}},
    )
    before = len(agent.model.requests)
    await agent.converse("How many new leads are there?", agent="admin-assistant")
    (request,) = agent.model.requests[before:]
    assert "count_records" in offered(request) and request["messages"][-1]["role"] == "user"
    assert schema_map() in request["messages"][0]["content"]  # the map rides in the system prompt


@pytest.mark.parametrize("asks", ["by_marker", "by_tool_call"])
async def test_the_model_asking_for_a_tool_gets_them_in_the_same_turn(
    agent: AgentHarness, db_engine: AsyncEngine, asks: str
) -> None:
    """A message the rule takes for small talk, a model that wants a tool (it answers the marker,
    or calls a tool it was not offered): the turn asks again with the tools, runs the call and
    answers; the user's message is answered once, nothing lost."""
    if asks == "by_marker":  # the first (direct) request is answered NEED_TOOLS, streamed
        agent.model.inject(Fault(raw_body=json.dumps(completion(Reply(content=NEED_TOOLS), "m", []))))
    agent.script(
        {"when": {"after_tool": "count_records"}, "reply": {"content": "Here is the count of cases."}},
        {
            "when": {"user_contains": "hello"},
            "reply": {
                "tool_calls": [{"name": "count_records", "arguments": {"collection": "notifications"}}]
            },
        },
    )
    before = len(agent.model.requests)
    handle = await agent.start("hello there", agent="admin-assistant", single_turn=True)
    result = await handle.result()
    assert (result.last_reply or "").endswith("Here is the count of cases.")
    assert result.usage.model_calls == 3 and result.usage.tool_calls == 1
    direct, with_tools, _answer = agent.model.requests[before:]
    assert "tools" not in direct and "count_records" in offered(with_tools)
    assert all(m.get("content") != NEED_TOOLS for m in with_tools["messages"])  # not in the window
    window = await agent.transcript(handle)
    assert [m.role for m in window] == ["system", "user", "assistant", "tool", "assistant"]
    stored = await ConversationStore(session_factory(db_engine)).load(
        handle.id, handle.first_execution_run_id or ""
    )
    assert [m.content for m in stored if m.role == "user"] == ["hello there"]
    assert [m.name for m in stored if m.content == NEED_TOOLS] == ["needs_tools"]  # kept, marked
    events = await events_of(db_engine, handle.id)
    assert [e.data["reply"] for e in events if e.kind == "turn"] == [result.last_reply]  # one end
    assert NEED_TOOLS not in "".join(streamed_text(events).values())  # its streamed text voided


async def test_tokens_saved_by_a_direct_greeting(
    agent: AgentHarness, scripted_model: ScriptedModelServer
) -> None:
    """The same request, as direct mode sent it and as it would have gone with the admin
    assistant's tools: the scripted model's prompt_tokens of each (docs/benchmark.md)."""
    agent.script({"reply": {"content": "Hello!"}})
    before = len(agent.model.requests)
    await agent.converse("hi", agent="admin-assistant")
    (direct,) = agent.model.requests[before:]
    tools = [native_tool(REGISTRY[name]) for name in AGENTS["admin-assistant"][2]]  # the seeded ones
    async with openai.AsyncOpenAI(base_url=scripted_model.base_url, api_key="x", max_retries=0) as client:
        plain = await client.chat.completions.create(model=SCRIPTED_MODEL_NAME, messages=direct["messages"])
        prompt = direct["messages"][0]["content"].removesuffix(f"\n\n{DIRECT_NOTE}")
        without_note = [{"role": "system", "content": prompt}, *direct["messages"][1:]]
        full = await client.chat.completions.create(
            model=SCRIPTED_MODEL_NAME, messages=without_note, extra_body={"tools": tools}
        )
    assert plain.usage is not None and full.usage is not None
    saved = full.usage.prompt_tokens - plain.usage.prompt_tokens
    assert saved > plain.usage.prompt_tokens // 2
    print(json.dumps({"direct": plain.usage.prompt_tokens, "with_tools": full.usage.prompt_tokens}))
