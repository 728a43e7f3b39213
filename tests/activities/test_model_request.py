"""What `call_model` sends: the body exactly as built, with the client's authentication and the
agent's header, streamed or whole, through the `openai` client's own request path but without
`chat.completions.create`'s request transform (issue 36: 6.8 % of the worker's samples)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from openai.resources.chat.completions import completions
from temporalio.testing import ActivityEnvironment

from activities.model import ModelActivities
from countersign.core.messages import ChatMessage, ModelRequest
from countersign.runtime.config import AGENT_HEADER, Settings

TOOL = {"type": "function", "function": {"name": "search_leads", "parameters": {"type": "object"}}}
REQUEST = ModelRequest(
    messages=[ChatMessage(role="user", content="hello")], tools=[TOOL], max_tokens=64, agent="lead-qualifier"
)
ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


@pytest_asyncio.fixture
async def endpoint() -> AsyncIterator[tuple[str, list[tuple[dict[str, str], Any]]]]:
    """An OpenAI-compatible endpoint that records each request's headers and body."""
    seen: list[tuple[dict[str, str], Any]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(({k.lower(): v for k, v in request.headers.items()}, body))
        if not body.get("stream"):
            return web.json_response(ANSWER)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {**ANSWER, "object": "chat.completion.chunk", "usage": None}
        chunk["choices"] = [
            {"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ]
        await response.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}/v1", seen


@pytest.mark.parametrize("stream", [True, False])
async def test_the_body_goes_as_built_with_the_key_and_the_agent(
    endpoint: tuple[str, list[tuple[dict[str, str], Any]]], stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_transform(*_: Any, **__: Any) -> Any:
        raise AssertionError("the client's request transform ran")

    monkeypatch.setattr(completions, "async_maybe_transform", no_transform)
    url, seen = endpoint
    settings = Settings(llm_base_url=url, llm_api_key="sk-test", llm_model="m", llm_stream=stream)
    reply = await ActivityEnvironment().run(ModelActivities(settings).call_model, REQUEST)
    assert reply.message.content == "hi"
    [(headers, body)] = seen
    assert headers["authorization"] == "Bearer sk-test" and headers[AGENT_HEADER.lower()] == "lead-qualifier"
    expected = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [TOOL],
        "parallel_tool_calls": True,
        "max_tokens": 64,
    }
    if stream:
        expected |= {"stream": True, "stream_options": {"include_usage": True}}
    assert body == expected
