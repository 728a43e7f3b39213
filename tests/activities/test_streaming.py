"""Streaming model replies: the scripted model streams as an OpenAI server does, the model activity
puts any real stream together (tool-call deltas split across chunks, no usage chunk, empty choice
lists) and publishes the text as it arrives, and a retried attempt never shows mixed text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest_asyncio
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.testing import WorkflowEnvironment

from activities.model import Streamed
from countersign.core.contract import AnswerSignal
from countersign.db.engine import session_factory
from countersign.db.events import Event, EventLog, streamed_text
from countersign.scripted_model.server import Fault, ScriptedModelServer
from tests.fixtures.agent import AgentHarness, running_agent
from tests.fixtures.scripted_model import rules
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow

LONG = "one two three four five six seven eight nine ten"


@pytest_asyncio.fixture
async def client(scripted_model: ScriptedModelServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=scripted_model.base_url, api_key="x", max_retries=0) as client:
        yield client


async def chunks(client: openai.AsyncOpenAI, **kwargs: Any) -> list[Any]:
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        **kwargs,
    )
    return [chunk async for chunk in stream]


async def test_the_scripted_model_streams_like_an_openai_server(
    scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI
) -> None:
    scripted_model.set_scenario(
        rules(
            {
                "reply": {
                    "content": LONG,
                    "tool_calls": [{"name": "search_leads", "arguments": {"query": "a b c"}}],
                }
            }
        )
    )
    got = await chunks(client, stream_options={"include_usage": True})
    texts = [c.choices[0].delta.content for c in got if c.choices and c.choices[0].delta.content]
    assert len(texts) > 3 and "".join(texts) == f"[scripted model] {LONG}"
    pieces = [
        call.function.arguments
        for c in got
        if c.choices
        for call in c.choices[0].delta.tool_calls or []
        if call.function and call.function.arguments
    ]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"query": "a b c"}
    assert got[-1].choices == [] and got[-1].usage is not None and got[-1].usage.completion_tokens > 0
    assert got[-2].choices[0].finish_reason == "tool_calls"
    streamed = Streamed()
    for chunk in got:
        streamed.add(chunk)
    reply = streamed.reply()
    assert reply.message.content == f"[scripted model] {LONG}" and reply.usage.prompt_tokens == 1
    assert [(c.name, json.loads(c.arguments)) for c in reply.message.tool_calls] == [
        ("search_leads", {"query": "a b c"})
    ]
    without = await chunks(client)
    assert all(c.usage is None for c in without) and all(c.choices for c in without)


@pytest_asyncio.fixture
async def odd_server() -> AsyncIterator[tuple[str, list[list[str]]]]:
    """A server that answers each chat request with the next list of `data:` lines, verbatim."""
    answers: list[list[str]] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for line in answers.pop(0):
            await response.write(f"data: {line}\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", answers
    await runner.cleanup()


def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
    return json.dumps(
        {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "odd", "choices": choices}
        | extra
    )


def delta(**fields: Any) -> dict[str, Any]:
    return {"index": 0, "delta": fields, "finish_reason": None}


async def test_whatever_a_server_streams_is_put_together(odd_server: tuple[str, list[list[str]]]) -> None:
    url, answers = odd_server
    call = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "get_", "arguments": ""}}
    answers.append(
        [
            chunk([], prompt_filter_results=[]),  # an empty choice list first (as Azure sends)
            chunk([delta(role="assistant", content=None)]),
            chunk([delta(tool_calls=[call])]),
            chunk([delta(tool_calls=[{"index": 0, "function": {"name": "lead", "arguments": '{"le'}}])]),
            chunk([delta(tool_calls=[{"index": 0, "function": {"arguments": 'ad": "jane"}'}}])]),
            chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
            "[DONE]",  # and no usage chunk
        ]
    )
    answers.append(["[DONE]"])  # no chunk at all
    async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
        streamed = Streamed()
        for c in await chunks(client):
            streamed.add(c)
        reply = streamed.reply()
        assert reply.message.content is None and reply.usage.prompt_tokens == 0
        assert [(c.name, c.arguments) for c in reply.message.tool_calls] == [("get_lead", '{"lead": "jane"}')]
        assert reply.finish_reason == "tool_calls" and reply.model == "odd"
        empty = Streamed()
        for c in await chunks(client):
            empty.add(c)
        try:
            empty.reply()
        except ValueError as err:
            assert "no choices" in str(err)
        else:
            raise AssertionError("a stream without choices must fail as a bad response")


async def events_of(db_engine: AsyncEngine, workflow_id: str) -> list[Event]:
    return await EventLog(session_factory(db_engine)).after(workflow_id, 0)


async def test_a_turn_streams_its_text_and_a_retry_resets_it(
    agent: AgentHarness, db_engine: AsyncEngine
) -> None:
    agent.script({"reply": {"content": LONG}})
    agent.model.inject(Fault(cut_after_chunks=4))  # the first attempt loses its connection mid-reply
    handle = await agent.start("hello")
    turn = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert turn is not None and turn.reply == f"[scripted model] {LONG}"
    events = await events_of(db_engine, handle.id)
    deltas = [e.data for e in events if e.kind == "delta"]
    first = [d for d in deltas if d["attempt"] == 1]
    assert first and "".join(d["text"] for d in first).startswith("[scripted model] ")
    assert "".join(d["text"] for d in first) != turn.reply, "the first attempt was cut short"
    reset = [d for d in deltas if d.get("reset")]
    assert [(d["attempt"], d["text"]) for d in reset] == [(2, "")]
    assert deltas.index(reset[0]) == len(first), "the reset comes before the second attempt's text"
    # a reader that applies the reset sees the reply once, never the two attempts mixed
    assert streamed_text(events) == {deltas[0]["seq"]: turn.reply}
    assert [(e.kind, e.data["reply"]) for e in events if e.kind == "turn"] == [("turn", turn.reply)]
    ids = [e.id for e in events]
    assert ids == sorted(ids)


async def test_tool_calls_results_and_questions_are_events(
    agent: AgentHarness, db_engine: AsyncEngine
) -> None:
    agent.script(
        {
            "when": {"user_contains": "find"},
            "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "jane"}}]},
        },
        {
            "when": {"after_tool": "search_leads"},
            "reply": {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which Jane?"}}]},
        },
        {"when": {"after_tool": "ask_human"}, "reply": {"content": "Thanks"}},
    )
    handle = await agent.start("find jane")
    for _ in range(200):
        if any(e.kind == "question" for e in await events_of(db_engine, handle.id)):
            break
        await asyncio.sleep(0.05)
    await handle.signal(AgentWorkflow.answer, AnswerSignal(call_id="c2", user_id="alice", text="Jane Doe"))
    turn = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert turn is not None and turn.reply == "[scripted model] Thanks"
    kinds = [
        (e.kind, e.data.get("call_id")) for e in await events_of(db_engine, handle.id) if e.kind != "delta"
    ]
    assert kinds == [
        ("message", None),
        ("tool_call", "c1"),
        ("tool_result", "c1"),
        ("tool_call", "c2"),
        ("question", "c2"),
        ("tool_result", "c2"),
        ("turn", None),
    ]


async def test_with_streaming_off_a_reply_is_asked_whole_and_no_text_is_published(
    temporal_env: WorkflowEnvironment,
    database_url: str,
    db_engine: AsyncEngine,
    scripted_model: ScriptedModelServer,
) -> None:
    """LLM_STREAM=false: for an endpoint that cannot stream (and the benchmark's baseline)."""
    async with running_agent(
        temporal_env, database_url, db_engine, scripted_model, overrides={"llm_stream": False}
    ) as agent:
        agent.script(
            {
                "when": {"user_contains": "find"},
                "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "jane"}}]},
            },
            {"when": {"after_tool": "search_leads"}, "reply": {"content": LONG}},
        )
        handle = await agent.start("find jane")
        turn = await execute_update(handle, AgentWorkflow.wait_turn, 1)
        assert turn is not None and turn.reply == f"[scripted model] {LONG}"
    assert not any(r.get("stream") for r in scripted_model.requests)
    kinds = [e.kind for e in await events_of(db_engine, handle.id)]
    assert "delta" not in kinds and kinds.count("turn") == 1 and "tool_result" in kinds
