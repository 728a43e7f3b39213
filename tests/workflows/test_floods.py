"""Floods (issue 26, class 5): refused inputs, however many and however large, never end a conversation.

- The server refuses a payload over Countersign's bound (MAX_PAYLOAD_BYTES, configured in the dev
  stack and in compose): an oversized signal never reaches history (the real dev server).
- A conversation continues as new while it waits: idle, for a reviewer, for the user's answer, its
  pending approvals and questions carried in the sealed state, their deadlines unchanged; a refused
  input is still audited (the time-skipping server; the history budget lowered so a flood of a few
  dozen signals fills it, as a flood of megabytes fills the real one).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from countersign.core import history
from countersign.core.approvals import Decision
from countersign.core.bounds import MAX_PAYLOAD_BYTES
from countersign.core.contract import AnswerSignal, StartConversation, StatusView
from countersign.db.schema import Notification
from countersign.devstack.temporal import DevServerConfig
from tests.e2e.test_hostile_input import PROPERTY, ask, eventually, raw, records
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import ECHO_RESULT, audit, lead_status, pending, qualify
from tests.fixtures.postgres import reset_jane
from tests.fixtures.temporal import failed_tasks
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow

ASK = {
    "when": {"user_contains": "ask"},
    "reply": {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which Jane?"}}]},
}
ANSWERED = {
    "when": {"after_tool": "ask_human", "result_contains": "the acme one"},
    "reply": {"content": "Thanks."},
}
# Small budgets: a few dozen refused signals fill them (10 MB / 10 000 events in production).
BYTES_BUDGET, EVENTS_BUDGET = 120_000, 150
MAX_FLOOD = 200  # refused signals sent at most before the run must have continued as new


def refused_signal() -> st.SearchStrategy[tuple[str, Any]]:
    """One signal every handler refuses (and audits), of 0 to 40 KB: an outsider's message, an
    unauthorized end or decision, an answer nobody asked for, a payload that does not decode."""
    size = st.integers(0, 40_000)
    return st.one_of(
        size.map(lambda n: ("submit_message", {"user_id": "mallory", "text": "x" * n})),
        size.map(lambda n: ("end", {"requested_by": "dave", "reason": "y" * min(n, 2_000)})),
        size.map(
            lambda n: ("approve", {"call_id": "c999", "approver": "bob", "reason": "z" * min(n, 2_000)})
        ),
        size.map(lambda n: ("answer", {"call_id": "c1", "user_id": "mallory", "text": "w" * n})),
        size.map(
            lambda n: ("reject", raw('{"call_id": ' + "[" * 40 + "]" * 40 + ', "pad": "' + "v" * n + '"}'))
        ),
    )


def latest(agent: AgentHarness, handle: WorkflowHandle[Any, Any]) -> WorkflowHandle[Any, Any]:
    """The conversation's current run (signals to `handle` would go to its first, closed one)."""
    return agent.client.get_workflow_handle(handle.id)


async def signal_latest(handle: WorkflowHandle[Any, Any], name: str, payload: Any) -> None:
    """Signal the conversation's current run. The time-skipping test server can answer NOT_FOUND
    "Completed workflow" for a signal that meets the instant a run continues as new (the old run
    closed, the new one not yet its latest); a client then signals again, as any would. A
    conversation that really ended answers so again, and the caller's checks fail."""
    for attempt in range(3):
        try:
            await handle.signal(name, payload)
            return
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND or attempt == 2:
                raise
            await asyncio.sleep(0.2)


async def flood_until_continued(
    agent: AgentHarness,
    handle: WorkflowHandle[Any, Any],
    flood: list[tuple[str, Any]],
    paced: AsyncEngine | None = None,
) -> int:
    """Send `flood`, then more refused messages until the run has continued as new: how many were
    sent. `paced`: each one after the previous refusal is on the record in that database (else a
    burst, as fast as the server takes them)."""
    current = latest(agent, handle)
    first_run = (await current.describe()).run_id
    audited = await records(paced, handle.id) if paced else 0
    filler = [("submit_message", {"user_id": "mallory", "text": "f" * 20_000})] * MAX_FLOOD
    for sent, (name, payload) in enumerate([*flood, *filler], start=1):
        await signal_latest(current, name, payload)
        if paced is not None:
            assert await eventually(paced, handle.id, audited + sent) == audited + sent
        if sent >= len(flood) and (await current.describe()).run_id != first_run:
            return sent
    # a burst: the run continues as new once the workflow task that does it meets no new signal
    for _ in range(600):
        if (await current.describe()).run_id != first_run:
            return len(flood) + MAX_FLOOD
        await asyncio.sleep(0.1)
    pytest.fail(f"the conversation did not continue as new after {len(flood) + MAX_FLOOD} refused signals")


async def waiting(handle: WorkflowHandle[Any, Any], what: str) -> StatusView:
    for _ in range(400):
        status = await handle.query(AgentWorkflow.status)
        if getattr(status, what):
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing in {what}: {status}")


async def waiting_in(
    agent: AgentHarness, db_engine: AsyncEngine, state: str
) -> tuple[WorkflowHandle[Any, Any], StatusView | None]:
    """A conversation idle after a turn, or waiting for a reviewer or an answer, and its status then."""
    await reset_jane(db_engine)
    agent.script(qualify(), ECHO_RESULT, ASK, ANSWERED, {"reply": {"content": "ok"}})
    if state == "idle":
        handle = await agent.start("hello")
        await ask(agent, handle.id)
        return handle, None
    handle = await agent.start("qualify jane" if state == "approval" else "ask me", single_turn=True)
    return handle, await waiting(handle, "pending_approvals" if state == "approval" else "pending_questions")


async def goes_on(
    agent: AgentHarness,
    db_engine: AsyncEngine,
    handle: WorkflowHandle[Any, Any],
    state: str,
    before: StatusView | None,
) -> None:
    """After whatever runs it went through, the conversation takes alice's next message, or its
    pending approval decides (same call, same deadline) and the call runs once, or its question
    takes its answer; and no workflow task failed."""
    current = latest(agent, handle)
    if state == "idle":
        assert await ask(agent, handle.id) == "[scripted model] ok"
        assert (await current.query(AgentWorkflow.status)).state == "idle"
    elif state == "approval":
        assert before is not None
        after = await waiting(current, "pending_approvals")
        assert after.pending_approvals == before.pending_approvals  # same call, same deadline
        (call,) = after.pending_approvals
        decided = await execute_update(
            current, AgentWorkflow.decide, Decision(call_id=call.call_id, decision="approve", approver="bob")
        )
        assert decided.state == "approved"
        assert (await handle.result()).last_reply == "[scripted model] done"
        assert await lead_status(db_engine, "acme") == "qualified"
        (row,) = await audit(db_engine, handle.id)
        assert (row.outcome, row.approved_by) == ("executed", "bob")
    else:
        assert before is not None
        after = await waiting(current, "pending_questions")
        assert after.pending_questions == before.pending_questions
        (question,) = after.pending_questions
        await current.signal(
            AgentWorkflow.answer, AnswerSignal(call_id=question.call_id, user_id="alice", text="the acme one")
        )
        assert (await handle.result()).last_reply == "[scripted model] Thanks."
    assert await failed_tasks(handle, latest(agent, handle)) == []


@pytest.fixture
def small_history_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "HISTORY_BYTES_BUDGET", BYTES_BUDGET)
    monkeypatch.setattr(history, "HISTORY_EVENTS_BUDGET", EVENTS_BUDGET)


@pytest.mark.security
@settings(PROPERTY, phases=[Phase.explicit, Phase.generate])  # each example is a conversation: no shrinking
@example(
    state="approval",
    flood=[("end", {"requested_by": "dave"}), ("approve", {"call_id": "c1", "approver": "alice"})],
)
@example(state="question", flood=[("answer", {"call_id": "c1", "user_id": "mallory", "text": "x" * 40_000})])
@example(state="idle", flood=[("submit_message", {"user_id": "mallory", "text": "y" * 40_000})])
@given(state=st.sampled_from(["idle", "approval", "question"]), flood=st.lists(refused_signal(), max_size=12))
async def test_a_flood_in_every_waiting_state_is_refused_audited_and_the_conversation_goes_on(
    agent: AgentHarness,
    db_engine: AsyncEngine,
    small_history_budget: None,
    state: str,
    flood: list[tuple[str, Any]],
) -> None:
    handle, before = await waiting_in(agent, db_engine, state)
    audited = await records(db_engine, handle.id)
    sent = await flood_until_continued(agent, handle, flood, paced=db_engine)
    # every refusal is on the record, however many continued-as-new runs it took
    assert await records(db_engine, handle.id) == audited + sent
    await goes_on(agent, db_engine, handle, state, before)


async def test_an_end_accepted_while_waiting_is_carried_and_ends_the_conversation_after_its_turn(
    agent: AgentHarness, db_engine: AsyncEngine, small_history_budget: None
) -> None:
    """alice ends her conversation while its turn waits for a reviewer; a flood then continues the
    run as new with the approval carried. The end is carried too: once bob decides, the turn
    finishes and the conversation ends (it does not wait for a next message)."""
    await reset_jane(db_engine)
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane")
    (call,) = (await waiting(handle, "pending_approvals")).pending_approvals
    await handle.signal("end", {"requested_by": "alice"})
    await flood_until_continued(agent, handle, [])
    current = latest(agent, handle)
    assert (await waiting(current, "pending_approvals")).pending_approvals == [call]
    await execute_update(
        current, AgentWorkflow.decide, Decision(call_id=call.call_id, decision="approve", approver="bob")
    )
    result = await asyncio.wait_for(handle.result(), timeout=60)
    assert (result.ended_by, result.last_reply) == ("end by alice", "[scripted model] done")
    assert await lead_status(db_engine, "acme") == "qualified"


def expiry_timer_fires_at(events: Sequence[Any]) -> list[datetime]:
    """When each timer of a run was set to fire (its start plus its duration)."""
    return [
        e.event_time.ToDatetime() + e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]


async def test_a_carried_approval_reminds_and_expires_at_its_original_times(
    agent: AgentHarness, db_engine: AsyncEngine, small_history_budget: None
) -> None:
    await reset_jane(db_engine)
    agent.script(qualify(), ECHO_RESULT)
    handle = await agent.start("qualify jane", single_turn=True)
    (call,) = (await waiting(handle, "pending_approvals")).pending_approvals
    await flood_until_continued(agent, handle, [])  # a burst: handlers always in flight
    current = latest(agent, handle)
    assert (await waiting(current, "pending_approvals")).pending_approvals == [call]
    events = (await current.fetch_history()).events
    expires = datetime.fromisoformat(call.expires_at).replace(tzinfo=None)
    fires = expiry_timer_fires_at(events)
    # the carried run's timers end by the original deadline (the reminder's before it): not restarted
    assert fires and max(fires) <= expires + timedelta(seconds=1), (fires, expires)
    await handle.result()  # the time-skipping server jumps to the deadline
    (row,) = await audit(db_engine, handle.id)
    assert row.outcome == "expired"
    async with db_engine.connect() as conn:
        kinds = (
            await conn.execute(select(Notification.kind).where(Notification.workflow_id == handle.id))
        ).all()
    assert [k for (k,) in kinds] == ["approval_reminder"]  # once, in whichever run reached its moment
    assert await lead_status(db_engine, "acme") == "new"


# --- the server's payload limit (real dev server) -----------------------------------------------------


@pytest.mark.devserver
async def test_the_dev_server_refuses_a_signal_over_countersigns_bound_before_history(
    dev_server: DevServerConfig,
) -> None:
    client = await Client.connect(
        dev_server.address, namespace=dev_server.namespace, data_converter=pydantic_data_converter
    )
    start = StartConversation(tenant_id="acme", user_id="alice", agent="lead-qualifier")
    # no worker: what is measured is the server's door, not the workflow
    handle = await client.start_workflow(
        AgentWorkflow.run, start, id=f"flood-{uuid.uuid4()}", task_queue=f"nobody-{uuid.uuid4()}"
    )
    try:
        sizes = (MAX_PAYLOAD_BYTES + 1, 1_900_000, 3_000_000)
        for size in sizes:
            with pytest.raises(RPCError) as refused:
                await handle.signal("submit_message", {"user_id": "mallory", "text": "x" * size})
            assert refused.value.status == RPCStatusCode.INVALID_ARGUMENT, refused.value
        await handle.signal("submit_message", {"user_id": "mallory", "text": "x" * 100_000})  # under it: in
        signals = [
            e
            for e in (await handle.fetch_history()).events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        ]
        assert len(signals) == 1 and signals[0].ByteSize() < MAX_PAYLOAD_BYTES
    finally:
        await handle.terminate()


@pytest.mark.devserver
async def test_an_update_over_the_bound_is_refused_at_the_door_and_the_conversation_goes_on(
    dev_agent: AgentHarness, db_engine: AsyncEngine, jane_is_new: None
) -> None:
    """The blob size limit does not bound an update's request; the bound on a run's updates in
    flight (`history.maxInFlightUpdatePayloads`, bounds.SERVER_LIMITS) does: the server refuses it
    (RESOURCE_EXHAUSTED, which the caller's client retries for a while) before any worker sees it.
    Without that bound the worker's SDK failed the workflow tasks that would answer it until the
    server gave it up (about 20 s without queries). Nothing of it reaches the conversation, which
    answers queries meanwhile and takes its decision as usual."""
    dev_agent.script(qualify(), ECHO_RESULT)
    handle = await dev_agent.start("please qualify jane")
    call = (await pending(handle)).pending_approvals[0]
    heavy = {"call_id": call.call_id, "decision": "approve", "approver": "bob", "comment": "x" * 1_500_000}
    sent = asyncio.create_task(handle.execute_update("decide", heavy))
    await asyncio.sleep(2)
    status = await asyncio.wait_for(handle.query(AgentWorkflow.status), timeout=5)
    assert status.state == "awaiting_approval" and status.pending_approvals[0].call_id == call.call_id
    with pytest.raises(RPCError) as refused:
        await sent
    assert refused.value.status == RPCStatusCode.RESOURCE_EXHAUSTED
    assert "payload size of in-flight updates" in refused.value.message
    failed = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    assert failed not in [event.event_type async for event in handle.fetch_history_events()]
    decided = await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=call.call_id, decision="approve", approver="bob")
    )
    assert decided.state == "approved"
    turn = await execute_update(handle, AgentWorkflow.wait_turn, 1)
    assert turn is not None and turn.reply == "[scripted model] done", turn
    assert await lead_status(db_engine, "acme") == "qualified"


async def until_answers(handle: WorkflowHandle[Any, Any]) -> StatusView:
    """The status once the conversation answers queries again (at most a minute)."""
    for _ in range(120):
        with contextlib.suppress(RPCError):
            return await handle.query(AgentWorkflow.status)
        await asyncio.sleep(0.5)
    raise AssertionError("the conversation never answered again")
