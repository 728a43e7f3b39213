"""`POST /api/conversations/{workflow_id}/agui`: an AG-UI client made of the `ag-ui-protocol`
package's own models, over real HTTP (httpx), against the signed stack: a run that stops at an
approval as an interrupt, resumed by the reviewer's decision, and the refusals at the edge."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import httpx
from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    Event,
    EventType,
    Interrupt,
    ResumeEntry,
    RunAgentInput,
    RunFinishedEvent,
    Tool,
    UserMessage,
)
from pydantic import TypeAdapter
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.events import Event as StoredEvent
from countersign.server.agui import Translator, run_of
from countersign.server.conversation_events import MAX_STREAMS_PER_PERSON
from countersign.server.http import HttpRefusal
from tests.fixtures.inbox import SignedStack
from tests.server.test_conversation_events import REVIEWED
from tests.server.test_front_door import token_for

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)
TERMINAL = (EventType.RUN_FINISHED, EventType.RUN_ERROR)


async def run(stack: SignedStack, token: str, workflow_id: str, body: RunAgentInput | Any) -> tuple[int, Any]:
    """One AG-UI run: (200, every event, each validated by the package's `Event` union, until the run
    finishes), or (status, the error envelope)."""
    content = body.model_dump_json(by_alias=True) if isinstance(body, RunAgentInput) else json.dumps(body)
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
    }
    url = f"{stack.url}/api/conversations/{workflow_id}/agui"
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("POST", url, content=content, headers=headers) as r,
    ):
        if r.status_code != 200:
            return r.status_code, json.loads(await r.aread())
        assert r.headers["Content-Type"] == "text/event-stream"
        seen: list[BaseEvent] = []
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue  # the blank line between events, a keep-alive comment
            event = EVENTS.validate_json(line.removeprefix("data: "))
            assert not event.model_extra, event  # nothing the protocol does not name
            seen.append(event)
            if event.type in TERMINAL:
                return 200, seen
    raise AssertionError(f"the stream closed before the run ended: {seen}")


async def conversation(stack: SignedStack, token: str, **start: str) -> str:
    """A new conversation with the lead qualifier (its workflow tracked by the stack's agent)."""
    status, body = await stack.call("POST", "/api/conversations", token, {"agent": "lead-qualifier", **start})
    assert status == 201, body
    stack.agent.track(body["workflow_id"])
    return str(body["workflow_id"])


def interrupts_of(events: list[BaseEvent]) -> list[Interrupt]:
    """The interrupts a run's last event ends it with (it must be an interrupt outcome)."""
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.outcome is not None, finished
    assert finished.outcome.type == "interrupt", finished
    return list(finished.outcome.interrupts)


def of(events: list[BaseEvent], kind: EventType) -> list[Any]:
    return [e for e in events if e.type == kind]


def message(text: str, run_id: str, workflow_id: str, message_id: str = "m1") -> RunAgentInput:
    return RunAgentInput(
        thread_id=workflow_id, run_id=run_id, messages=[UserMessage(id=message_id, content=text)],
        protocol_version=PROTOCOL_VERSION,
    )  # fmt: skip


def resume(call_id: str, run_id: str, workflow_id: str, **entry: Any) -> RunAgentInput:
    return RunAgentInput(
        thread_id=workflow_id, run_id=run_id, messages=[],
        resume=[ResumeEntry(interrupt_id=call_id, **entry)], protocol_version=PROTOCOL_VERSION,
    )  # fmt: skip


async def streaming(engine: AsyncEngine, workflow_id: str, runs: int) -> None:
    """Wait until `runs` AG-UI runs of the conversation were accepted (their streams begin)."""
    query = text(
        "SELECT count(*) FROM requester_actions WHERE action = 'agui' AND status = 200 AND workflow_id = :wf"
    )
    for _ in range(300):
        async with engine.connect() as conn:
            if (await conn.execute(query, {"wf": workflow_id})).scalar_one() >= runs:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {runs} runs of {workflow_id} began")


async def test_a_run_stops_at_an_approval_and_the_reviewer_resumes_it(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    stack.agent.script(*REVIEWED)
    alice, bob = await stack.login("alice"), await stack.login("bob")
    workflow_id = await conversation(stack, alice)

    status, events = await asyncio.wait_for(
        run(stack, alice, workflow_id, message("please qualify jane", "r1", workflow_id)), 60
    )
    assert status == 200, events
    assert events[0].type == EventType.RUN_STARTED and events[0].run_id == "r1"
    assert events[0].protocol_version == PROTOCOL_VERSION
    (start,) = of(events, EventType.TOOL_CALL_START)
    assert start.tool_call_name == "update_lead_status"
    args = json.loads("".join(e.delta for e in of(events, EventType.TOOL_CALL_ARGS)))
    assert args == {"lead": "jane.doe@example.com", "new_status": "qualified", "reason": "asked"}
    assert [e.tool_call_id for e in of(events, EventType.TOOL_CALL_END)] == [start.tool_call_id]
    said = "".join(e.delta for e in of(events, EventType.TEXT_MESSAGE_CONTENT))
    assert said == "[scripted model] Let me mark Jane as qualified for you now."
    (interrupt,) = interrupts_of(events)
    assert (interrupt.id, interrupt.tool_call_id, interrupt.reason) == (start.tool_call_id,) * 2 + (
        "tool_approval",
    )
    assert (interrupt.message or "").endswith("(jane.doe@example.com): status new → qualified")
    assert interrupt.expires_at and interrupt.response_schema
    assert of(events, EventType.STATE_SNAPSHOT)[-1].snapshot["approvals"] == {interrupt.id: "pending"}
    call_id = interrupt.id

    # alice may not approve her own call, through AG-UI as anywhere
    approve = {"status": "resolved", "payload": {"approved": True, "reason": "budget confirmed"}}
    status, refused = await run(stack, alice, workflow_id, resume(call_id, "r2", workflow_id, **approve))
    assert status == 403 and "error" in refused, refused

    # alice follows (she leaves the interrupt to others); bob resumes it with his approval
    follow = asyncio.create_task(
        run(stack, alice, workflow_id, resume(call_id, "r3", workflow_id, status="cancelled"))
    )
    await streaming(db_engine, workflow_id, runs=2)  # alice's run follows before bob decides
    status, events = await asyncio.wait_for(
        run(stack, bob, workflow_id, resume(call_id, "r4", workflow_id, **approve)), 60
    )
    assert status == 200, events
    (result,) = of(events, EventType.TOOL_CALL_RESULT)
    assert result.tool_call_id == call_id and json.loads(result.content)["data"]["new_status"] == "qualified"
    changes = [(op.op, op.path, op.value) for e in of(events, EventType.STATE_DELTA) for op in e.delta]
    assert ("add", f"/approvals/{call_id}", "approved") in changes
    said = "".join(e.delta for e in of(events, EventType.TEXT_MESSAGE_CONTENT))
    assert said == "[scripted model] Jane Doe is now qualified."
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.run_id == "r4"
    assert finished.outcome is not None and finished.outcome.type == "success"
    assert isinstance(finished.result, dict) and finished.result["reply"] == said
    status, followed = await asyncio.wait_for(follow, 30)
    assert status == 200 and of(followed, EventType.TOOL_CALL_RESULT)[0].tool_call_id == call_id
    assert followed[-1].outcome.type == "success"
    # a decision made here is the inbox's: bob's, proven, once
    status, again = await run(stack, bob, workflow_id, resume(call_id, "r5", workflow_id, **approve))
    assert status == 409, again


async def test_a_malformed_run_is_refused_with_the_error_envelope(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    stack = signed_agent
    alice = await stack.login("alice")
    workflow_id = await conversation(stack, alice)
    good = message("hello", "r1", workflow_id).model_dump(mode="json", by_alias=True)
    bad: list[tuple[Any, str]] = [
        ({**good, "bogus": 1}, "bogus"),
        ({k: v for k, v in good.items() if k != "threadId"}, "threadId"),
        ({**good, "threadId": "someone-else"}, "threadId"),
        ({**good, "runId": "r\n1"}, "run_id"),
        ({**good, "messages": [{"id": "m1", "role": "user", "content": "hi", "extra": True}]}, "extra"),
        ({**good, "messages": [{"id": "m1", "role": "assistant", "content": "hi"}]}, "messages"),
        ({**good, "tools": [Tool(name="t", description="d").model_dump(by_alias=True)]}, "tools"),
        (
            {
                **good,
                "resume": [{"interruptId": "c1", "status": "resolved", "payload": {"approved": "maybe"}}],
            },
            "approved",
        ),
        (
            {
                **good,
                "resume": [
                    {"interruptId": "c1", "status": "resolved", "payload": {"approved": True, "x": 1}}
                ],
            },
            "x",
        ),
        ({**good, "resume": [{"interruptId": "c" * 201, "status": "cancelled"}]}, "interrupt_ids"),
        ([], "body"),
    ]
    for sent, named in bad:
        status, refused = await run(stack, alice, workflow_id, sent)
        assert status == 422 and named in refused["error"], (sent, status, refused)
    async with httpx.AsyncClient() as http:
        url, auth = f"{stack.url}/api/conversations/{workflow_id}/agui", {"Authorization": f"Bearer {alice}"}
        not_json = await http.post(url, content=b"{", headers=auth | {"Content-Type": "application/json"})
        assert not_json.status_code == 422 and "error" in not_json.json()
        assert (await http.post(url, content=b"x", headers=auth)).status_code == 415
        assert (await http.post(url, json=good)).status_code == 401
    # an interrupt that is not open: the conversation waits for nobody
    status, refused = await run(
        stack, alice, workflow_id, resume("c1", "r2", workflow_id, status="cancelled")
    )
    assert status == 409 and "no open interrupt c1" in refused["error"]
    async with db_engine.connect() as conn:  # every refusal on the record, as alice's
        recorded = (
            await conn.execute(
                text(
                    "SELECT user_id, status FROM requester_actions"
                    " WHERE action = 'agui' AND workflow_id = :wf"
                ),
                {"wf": workflow_id},
            )
        ).all()
    assert sorted(recorded) == sorted([("alice", 422)] * (len(bad) + 1) + [("alice", 415), ("alice", 409)])


def stored(kind: str, **data: Any) -> StoredEvent:
    return StoredEvent(id=1, kind=kind, data=data)


def ids(event: BaseEvent) -> str:
    return str(getattr(event, "message_id", ""))


def test_a_retried_model_call_streams_its_text_as_a_message_of_its_own() -> None:
    translator = Translator()
    first = translator.translate(stored("delta", seq=3, attempt=1, text="Hel"))
    again = translator.translate(stored("delta", seq=3, attempt=2, text="", reset=True))
    late = translator.translate(stored("delta", seq=3, attempt=1, text="lo"))
    second = translator.translate(stored("delta", seq=3, attempt=2, text="Hi"))
    turn = translator.translate(stored("turn", seq=3, turn=1, reply="Hi there", stop="completed"))
    assert [(e.type, ids(e)) for e in first.events] == [
        (EventType.TEXT_MESSAGE_START, "reply-3"), (EventType.TEXT_MESSAGE_CONTENT, "reply-3"),
    ]  # fmt: skip
    assert [(e.type, ids(e)) for e in again.events] == [(EventType.TEXT_MESSAGE_END, "reply-3")]
    assert late.events == []
    assert [ids(e) for e in second.events] == ["reply-3-1", "reply-3-1"]
    assert [(e.type, getattr(e, "delta", None)) for e in turn.events] == [
        (EventType.TEXT_MESSAGE_CONTENT, " there"), (EventType.TEXT_MESSAGE_END, None),
    ]  # fmt: skip
    assert turn.turn is not None and translator.close_all() == []


def test_a_resume_payload_is_checked_before_anything_is_decided() -> None:
    entries = [
        ResumeEntry(interrupt_id="c1", status="resolved", payload={"approved": True}),
        ResumeEntry(
            interrupt_id="c2", status="resolved", payload={"approved": False, "editedArgs": {"a": 1}}
        ),
    ]
    body = RunAgentInput(thread_id="wf", run_id="r", messages=[], resume=entries)
    try:
        run_of(body, "wf")
    except HttpRefusal as refusal:
        assert refusal.status == 422 and "c2" in str(refusal) and "editedArgs" in str(refusal)
    else:
        raise AssertionError("a rejection with edited arguments was accepted")


ASKS: list[dict[str, Any]] = [
    {
        "when": {"user_contains": "call jane"},
        "reply": {
            "tool_calls": [{"name": "ask_human", "arguments": {"question": "Which number shall I use?"}}]
        },
    },
    {
        "when": {"after_tool": "ask_human", "result_contains": "mobile"},
        "reply": {"content": "Calling her mobile."},
    },
]


async def test_a_question_is_an_interrupt_its_user_answers(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """An API token acting for alice runs her conversation; `ask_human` ends the run as an
    interrupt; the token answers it as alice (a reviewer may not); the answer reaches the model."""
    stack = signed_agent
    stack.agent.script(*ASKS)
    async with token_for(db_engine, "acme", "agui-front-end", "alice") as token:
        workflow_id = await conversation(stack, token, user_id="alice")
        status, events = await asyncio.wait_for(
            run(stack, token, workflow_id, message("call jane", "r1", workflow_id)), 60
        )
        assert status == 200, events
        (asked,) = interrupts_of(events)
        assert (asked.reason, asked.message) == ("question", "Which number shall I use?")
        answer = {"status": "resolved", "payload": {"text": "her mobile"}}
        status, refused = await run(
            stack, await stack.login("bob"), workflow_id, resume(asked.id, "r2", workflow_id, **answer)
        )
        assert status == 404, refused  # bob reviews no call of it: not his to read, nor to answer
        status, events = await asyncio.wait_for(
            run(stack, token, workflow_id, resume(asked.id, "r3", workflow_id, **answer)), 60
        )
    assert status == 200, events
    (result,) = of(events, EventType.TOOL_CALL_RESULT)
    assert result.tool_call_id == asked.id and "her mobile" in result.content
    assert (
        events[-1].outcome.type == "success"
        and events[-1].result["reply"] == "[scripted model] Calling her mobile."
    )


async def test_a_run_past_the_persons_bound_of_streams_is_refused_before_it_sends_anything(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """A run is a stream: at the person's bound of open streams it is refused (429, on the record)
    before its message is sent, or a client retrying after Retry-After would send it twice."""
    stack = signed_agent
    alice = await stack.login("alice")
    workflow_id = await conversation(stack, alice)
    headers = {"Authorization": f"Bearer {alice}", "Accept": "text/event-stream"}
    url = f"{stack.url}/api/conversations/{workflow_id}/events"
    async with contextlib.AsyncExitStack() as held, aiohttp.ClientSession() as http:
        for _ in range(MAX_STREAMS_PER_PERSON):
            response = await held.enter_async_context(http.get(url, headers=headers))
            assert response.status == 200, await response.text()
        status, refused = await run(stack, alice, workflow_id, message("hello", "r1", workflow_id))
    assert status == 429 and "open event streams" in refused["error"], refused
    async with db_engine.connect() as conn:
        recorded = (
            await conn.execute(
                text("SELECT status FROM requester_actions WHERE action = 'agui' AND workflow_id = :wf"),
                {"wf": workflow_id},
            )
        ).all()
    assert recorded == [(429,)], recorded
    status, said = await stack.call("GET", f"/api/conversations/{workflow_id}/transcript", alice)
    assert status == 200 and not [m for m in said if m["role"] == "user"], said
