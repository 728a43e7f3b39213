"""Fault injection on real parts: workers killed, the Temporal server restarted, PostgreSQL stopped,
and a model that misbehaves. Whatever breaks, every conversation completes with the reply its
script leads to, every effect happens exactly once, and the audit has every call exactly once.

The infrastructure tests run on parts of their own (`tests/fixtures/faults.py`): an embedded
PostgreSQL, a Temporal dev server, the scripted model, an SMTP catcher and `python worker.py` as a
subprocess. The conversations (`tests/fixtures/fault_scripts.py`) create a task, change a lead's
status, queue an email, wait for an approval or roll their turn back; the moment to strike is chosen
by watching them (pending activities, the `status` query, audit rows), and a call is held in flight
by holding the PostgreSQL advisory lock it takes first.

`make test` runs a few conversations per test; more (the kinds are dealt round-robin, shuffled by
a seeded random):

    FAULT_CONVERSATIONS=60 .venv/bin/python -m pytest -m faults

A worker killed mid-activity leaves the activity to time out before it runs again (model calls,
tool calls and compensations heartbeat: 10 s; the others wait out their start-to-close timeout),
so the kill test catches many conversations in the same moment rather than one after the other.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowExecutionStatus

from countersign.core.contract import ConversationResult, EndConversation, Limits, TurnResult, TurnStop
from countersign.core.saga import RollbackRequest
from countersign.db.schema import Compensation, RollbackRecord, Task, ToolExecution
from countersign.scripted_model.scenario import Reply
from countersign.scripted_model.server import Fault, completion
from tests.fixtures.agent import AgentHarness
from tests.fixtures.fault_scripts import (
    Conversation,
    Effects,
    audited_calls,
    differences,
    of_kind,
    plan,
    prepare,
    rules_for,
)
from tests.fixtures.faults import (
    FAULT_CONVERSATIONS,
    PG_OUTAGE_S,
    FaultStack,
    all_have_started,
    own_stack,
    retried,
    scenario,
    unless_stuck,
    wait_for,
)
from workflows.agent import AgentWorkflow

pytestmark = pytest.mark.faults

SEED = int(os.environ.get("FAULT_SEED", "1122"))
MODEL_HANGS_S = 600.0  # a model call caught by a kill never answers on its own
RESTART_DOWN_S = 4.0  # the dev server's outage, on top of its own stop and start (~2 s)
HELD_PER_KIND = 6
FINISH_TIMEOUT_S = 400.0  # generous: a lost activity without heartbeats waits up to 120 s


def conversations_for(name: str) -> list[Conversation]:
    """FAULT_CONVERSATIONS of them (at least one of each kind), seeded per test."""
    return plan(max(FAULT_CONVERSATIONS, 4), random.Random(f"{SEED}-{name}"), run=name)


async def audited(stack: FaultStack, conversations: list[Conversation], *call_ids: str) -> bool:
    """Whether every one of `conversations` has audit rows for all `call_ids`."""
    found = await audited_calls(stack.engine, conversations)
    return all(set(call_ids) <= found[c.workflow_id] for c in conversations)


def held(conversations: list[Conversation]) -> list[Conversation]:
    """The ones whose call the test holds in flight: a held call keeps one of the worker's 20
    PostgreSQL connections, so at most HELD_PER_KIND of a kind (the others just run)."""
    return conversations[:HELD_PER_KIND]


async def catch_in_a_tool(stack: FaultStack, conversations: list[Conversation]) -> None:
    """Start `tool` conversations with their first call (create_task) held in flight; the other
    two calls of the same message (update_lead_status, send_email) complete."""
    await stack.locks.hold(*(c.lock_key("c1") for c in held(conversations)))
    for c in conversations:
        await c.start(stack.client, stack.settings.task_queue)
    handles = [c.h for c in held(conversations)]
    await wait_for(lambda: all_have_started(handles, "execute_tool"), "tools in flight")
    await wait_for(lambda: audited(stack, held(conversations), "c2", "c3"), "the other calls audited")


async def catch_waiting_for_approval(stack: FaultStack, conversations: list[Conversation]) -> None:
    for c in conversations:
        await c.start(stack.client, stack.settings.task_queue)

    async def all_waiting() -> bool:
        statuses = await asyncio.gather(*(c.h.query(AgentWorkflow.status) for c in conversations))
        return all(s.state == "awaiting_approval" for s in statuses)

    await wait_for(all_waiting, "every approval pending")


async def catch_compensating(stack: FaultStack, conversations: list[Conversation]) -> None:
    """Run `compensation` conversations' first turn, then roll it back with its first undo (c2's,
    newest first) held in flight."""
    for c in conversations:
        await c.start(stack.client, stack.settings.task_queue)
    await asyncio.gather(*(c.h.execute_update(AgentWorkflow.wait_turn, 1) for c in conversations))
    await stack.locks.hold(*(c.undo_key("c2") for c in held(conversations)))
    for c in conversations:
        await c.roll_back()
    handles = [c.h for c in held(conversations)]
    await wait_for(lambda: all_have_started(handles, "compensate_call"), "compensations in flight")


async def approve_in_flight(stack: FaultStack, conversations: list[Conversation]) -> None:
    """Approve `approval` conversations (by update or signal), their approved call held in flight."""
    await stack.locks.hold(*(c.lock_key("c1") for c in held(conversations)))
    await asyncio.gather(*(c.approve() for c in conversations))
    handles = [c.h for c in held(conversations)]
    await wait_for(lambda: all_have_started(handles, "execute_tool"), "approved calls in flight")


async def catch_calling_the_model(stack: FaultStack, conversations: list[Conversation]) -> None:
    """Start `model` conversations while no other conversation calls the model, each first request
    taking one of the hanging faults injected for them: their model calls are in flight (and the
    scripted model does not answer them)."""
    asked = len(stack.model.requests)
    stack.model.inject(*(Fault(delay_s=MODEL_HANGS_S) for _ in conversations))
    for c in conversations:
        await c.start(stack.client, stack.settings.task_queue)
    handles = [c.h for c in conversations]
    await wait_for(lambda: all_have_started(handles, "call_model"), "model calls in flight")

    async def all_asked() -> bool:
        return len(stack.model.requests) == asked + len(conversations)

    await wait_for(all_asked, "every hanging fault taken")


async def not_retried(caught: dict[str, list[Conversation]]) -> list[str]:
    """`workflow id: activity` for each conversation whose activity of that type never needed a
    second attempt: the fault meant for it did not catch it."""
    missed = []
    for activity_type, conversations in caught.items():
        for c in conversations:
            if not await retried(c.h, activity_type):
                missed.append(f"{c.workflow_id}: {activity_type}")
    return missed


async def finish_all(conversations: list[Conversation], since: float) -> str:
    """Wait for every conversation's result; returns, per kind, the most seconds one took to
    finish counted from `since` (a `time.monotonic()`), for the test's report line."""
    slowest: dict[str, float] = {}

    async def finish(c: Conversation) -> ConversationResult:
        result = await c.finish(FINISH_TIMEOUT_S)
        slowest[c.kind] = max(slowest.get(c.kind, 0.0), time.monotonic() - since)
        return result

    await asyncio.gather(*(finish(c) for c in conversations))
    return ", ".join(f"{kind} {s:.0f}s" for kind, s in sorted(slowest.items()))


@pytest.mark.devserver
@pytest.mark.timeout(900)
async def test_worker_killed_mid_model_call_tool_approval_and_compensation(tmp_path: Path) -> None:
    """Fault: the worker process is SIGKILLed (no shutdown) and a new one started, twice. The first
    kill catches conversations calling the model, running a tool (one call in flight, the rest of
    the message just completed), waiting for an approval, and compensating a rollback; the second
    catches the approved calls running. Invariant: every conversation completes with its scripted
    reply, each task / lead status / email happens once (and is undone once when rolled back), and
    every call has exactly one audit row, the approvals and compensations their own."""
    conversations = conversations_for("kill")
    async with own_stack(tmp_path) as stack:
        await prepare(stack.engine, conversations)
        stack.model.set_scenario(scenario(rules_for(conversations)))
        approvals = of_kind(conversations, "approval")

        # the hanging model calls first, while nothing else asks the model, then the others
        await catch_calling_the_model(stack, of_kind(conversations, "model"))
        await catch_in_a_tool(stack, of_kind(conversations, "tool"))
        await catch_waiting_for_approval(stack, approvals)
        await catch_compensating(stack, of_kind(conversations, "compensation"))
        assert await stack.locks.waiters() == len(stack.locks.held), "held calls wait in PostgreSQL"
        await stack.kill_worker()

        # round two: the approved calls in flight, and the worker killed again
        await approve_in_flight(stack, approvals)
        await stack.kill_worker()
        await stack.locks.release()

        took = await finish_all(conversations, since=stack.kills[0])
        print(f"\nworker killed twice; {len(conversations)} conversations done after the first kill: {took}")
        found = await Effects.of(stack.engine, stack.smtp, conversations)
        assert differences(conversations, found) == []
        caught = {
            "call_model": of_kind(conversations, "model"),
            "execute_tool": held(of_kind(conversations, "tool")) + held(approvals),
            "compensate_call": held(of_kind(conversations, "compensation")),
        }
        assert await not_retried(caught) == [], "every call caught by a kill ran again"


@pytest.mark.devserver
@pytest.mark.timeout(900)
async def test_temporal_server_restarted_mid_run(tmp_path: Path) -> None:
    """Fault: the Temporal dev server is stopped, kept down RESTART_DOWN_S and started again (same
    port, same SQLite file) while conversations call the model (some answers arrive while it is
    down), run a tool, compensate, or wait for an approval; the worker process lives on and
    reconnects by itself. Invariant: every conversation resumes and completes, each effect
    happens once, and every call has exactly one audit row."""
    conversations = conversations_for("restart")
    async with own_stack(tmp_path) as stack:
        await prepare(stack.engine, conversations)
        stack.model.set_scenario(scenario(rules_for(conversations)))
        model_calls = of_kind(conversations, "model")

        await catch_in_a_tool(stack, of_kind(conversations, "tool"))
        await catch_waiting_for_approval(stack, of_kind(conversations, "approval"))
        await catch_compensating(stack, of_kind(conversations, "compensation"))
        # the model answers while the server is down, or once it is back
        delays = [RESTART_DOWN_S / 2 if i % 2 else RESTART_DOWN_S * 3 for i in range(len(model_calls))]
        stack.model.inject(*(Fault(delay_s=d) for d in delays))
        for c in model_calls:
            await c.start(stack.client, stack.settings.task_queue)
        await wait_for(
            lambda: all_have_started([c.h for c in model_calls], "call_model"), "model calls in flight"
        )
        down_s = await stack.temporal.restart(down_s=RESTART_DOWN_S)
        back = time.monotonic()
        assert stack.worker.running, "the worker outlives the server"
        await stack.locks.release()
        await asyncio.gather(*(c.approve() for c in of_kind(conversations, "approval")))

        took = await finish_all(conversations, since=back)
        print(
            f"\nserver down {down_s:.1f}s; {len(conversations)} conversations done after it was back: {took}"
        )
        found = await Effects.of(stack.engine, stack.smtp, conversations)
        assert differences(conversations, found) == []


@pytest.mark.devserver
@pytest.mark.timeout(900)
async def test_postgres_down_for_30_seconds_while_tools_run(tmp_path: Path) -> None:
    """Fault: PostgreSQL stops for PG_OUTAGE_S (30 s) while tool calls and compensations are in
    flight; meanwhile approvals are decided and new conversations start (loading their context
    needs the database). Invariant: the database-backed activities retry until it is back, then
    every conversation completes, each effect happens once and every call is audited once."""
    conversations = conversations_for("outage")
    async with own_stack(tmp_path) as stack:
        await prepare(stack.engine, conversations)
        stack.model.set_scenario(scenario(rules_for(conversations)))
        approvals = of_kind(conversations, "approval")
        for c in approvals:
            c.approve_by_update = False  # a signal: an update would wait for the database

        await catch_in_a_tool(stack, of_kind(conversations, "tool"))
        await catch_waiting_for_approval(stack, approvals)
        await catch_compensating(stack, of_kind(conversations, "compensation"))
        began = time.monotonic()
        await stack.stop_postgres()  # the held locks go with their connection
        for c in of_kind(conversations, "model"):
            await c.start(stack.client, stack.settings.task_queue)
        await asyncio.gather(*(c.approve() for c in approvals))
        await asyncio.sleep(PG_OUTAGE_S - (time.monotonic() - began))
        await stack.start_postgres()
        back = time.monotonic()
        await stack.locks.release()

        took = await finish_all(conversations, since=back)
        print(
            f"\npostgres down {back - began:.0f}s; {len(conversations)} conversations done "
            f"after it was back: {took}"
        )
        found = await Effects.of(stack.engine, stack.smtp, conversations)
        assert differences(conversations, found) == []
        caught = {
            "execute_tool": held(of_kind(conversations, "tool")),
            "compensate_call": held(of_kind(conversations, "compensation")),
            "load_conversation_context": of_kind(conversations, "model"),
        }
        assert await not_retried(caught) == [], "every call the outage broke ran again"


# --- a misbehaving model ---------------------------------------------------------------------------
#
# tests/activities/test_model_errors.py covers 429 (Retry-After), 5xx, truncated JSON and 4xx;
# tests/workflows/test_agent_workflow.py and tests/e2e/test_compromised_model.py invalid arguments
# and unknown tools (up to 50 KB). What is left is below, on the real dev server: the time-skipping
# server enforces no payload limit (2 MB a payload), and whether something enormous fits is the
# point of most cases.

MB = 1_000_000
JANE = "jane.doe@example.com"


@dataclass(frozen=True)
class Misbehaviour:
    """What the model answers (`replies`: the tool calls of each reply in turn, after `faults`),
    and how the turn must end: its stop, the start of its reply, the envelope the model got for
    each call and each call's audit outcome."""

    replies: list[list[dict[str, Any]]]
    stop: TurnStop = "completed"
    reply: str = "[scripted model] handled"
    envelopes: dict[str, str | None] = field(default_factory=dict)  # call id -> error code
    outcomes: dict[str, str] = field(default_factory=dict)  # call id -> tool_executions.outcome
    faults: tuple[Fault, ...] = ()
    limits: Limits = field(default_factory=Limits)
    requests: int | None = None  # chat requests the model server must have answered

    def rules(self) -> list[dict[str, Any]]:
        """Reply k answers the results of reply k-1; then a plain "handled"."""
        first = {"tool_calls": self.replies[0]} if self.replies else {"content": "handled"}
        rules: list[dict[str, Any]] = [{"when": {"user_contains": "misbehave"}, "reply": first}]
        done = 0
        for k, calls in enumerate(self.replies):
            done += len(calls)
            later = self.replies[k + 1 : k + 2]
            answer = {"tool_calls": later[0]} if later else {"content": "handled"}
            when = {"after_tool": calls[-1]["name"], "turn_calls": done}
            rules.append({"when": when, "reply": answer})
        return rules


def search(query: str) -> dict[str, Any]:
    return {"name": "search_leads", "arguments": {"query": query}}


MISBEHAVIOURS = [
    pytest.param(
        Misbehaviour(
            # the model answers the search, then never answers again: the call outlives the turn
            replies=[[search("Jane")]],
            faults=(Fault(), Fault(delay_s=MODEL_HANGS_S)),
            limits=Limits(turn_timeout_s=6),
            stop="limit_reached",
            reply="LIMIT_REACHED: the model call did not finish within turn_timeout_s",
            envelopes={"c1": None},
            outcomes={"c1": "executed"},
        ),
        id="model-timeout",
    ),
    pytest.param(
        Misbehaviour(
            replies=[[search("x" * MB)]],
            envelopes={"c1": "VALIDATION_ERROR"},
            outcomes={"c1": "invalid"},
        ),
        id="1MB-arguments",
    ),
    pytest.param(
        Misbehaviour(
            # refused before anyone is asked: no approval waits with a megabyte in it
            replies=[
                [
                    {
                        "name": "update_lead_status",
                        "arguments": {"lead": JANE, "new_status": "qualified", "reason": "y" * MB},
                    }
                ]
            ],
            envelopes={"c1": "VALIDATION_ERROR"},
            outcomes={"c1": "invalid"},
        ),
        id="1MB-arguments-needing-approval",
    ),
    pytest.param(
        Misbehaviour(
            replies=[[{"name": "export_all_leads", "arguments": {"format": "csv"}}]],
            envelopes={"c1": "UNKNOWN_TOOL"},
            outcomes={"c1": "invalid"},
        ),
        id="unknown-tool",
    ),
    pytest.param(
        Misbehaviour(
            # more than a payload may hold: the reply is cut to MAX_REPLY_CHARS, and says so
            replies=[],
            faults=(Fault(raw_body=json.dumps(completion(Reply(content="w" * (5 * MB // 2)), "m", []))),),
            reply="[scripted model] " + "w" * 100,
            requests=1,
        ),
        id="2.5MB-reply",
    ),
    pytest.param(
        Misbehaviour(
            # more than a payload may hold: cut at the model activity, refused by the policy
            replies=[[search("w" * (5 * MB // 2))]],
            envelopes={"c1": "VALIDATION_ERROR"},
            outcomes={"c1": "invalid"},
        ),
        id="2.5MB-arguments",
    ),
    pytest.param(
        Misbehaviour(
            replies=[[{"name": "z" * MB, "arguments": {}}]],
            # the transcript names the call as cut to 64 characters, which the script's after_tool
            # (the whole name) does not match: any model reply will do
            reply="[scripted model]",
            envelopes={"c1": "UNKNOWN_TOOL"},
            outcomes={"c1": "invalid"},
        ),
        id="unknown-tool-1MB-name",
    ),
    pytest.param(
        Misbehaviour(
            # each reply fits, each call is refused, but the transcript the model gets next does not
            replies=[[search("q" * (4 * MB // 5))] for _ in range(3)],
            envelopes=dict.fromkeys(("c1", "c2", "c3"), "VALIDATION_ERROR"),
            outcomes=dict.fromkeys(("c1", "c2", "c3"), "invalid"),
        ),
        id="3x800KB-arguments-in-a-turn",
    ),
]


@pytest.mark.devserver
@pytest.mark.parametrize("case", MISBEHAVIOURS)
async def test_a_misbehaving_model_ends_the_turn_cleanly(
    dev_agent: AgentHarness, db_engine: AsyncEngine, case: Misbehaviour
) -> None:
    """Fault: the model hangs past the turn's deadline, sends enormous arguments, names a tool that
    does not exist, or answers with more than a payload may hold. Invariant: the turn ends by the
    loop's rules (an error envelope the model sees, or a stopped turn), the conversation goes on
    and completes (never a failed or stuck workflow), and every call has exactly one audit row."""
    dev_agent.script(*case.rules())
    dev_agent.model.inject(*case.faults)
    handle = await dev_agent.start("misbehave, please", limits=case.limits)

    async def converse() -> tuple[TurnResult | None, ConversationResult]:
        turn = await handle.execute_update("wait_turn", 1, result_type=TurnResult)
        await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
        return turn, await handle.result()

    turn, result = await unless_stuck(handle, converse(), deadline_s=60)
    assert isinstance(turn, TurnResult) and result.turns == 1
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert turn.stop == case.stop and (turn.reply or "").startswith(case.reply), turn

    transcript = await dev_agent.transcript(handle)
    given = {m.tool_call_id: json.loads(m.content or "") for m in transcript if m.role == "tool"}
    assert {c: (e.get("error") or {}).get("code") for c, e in given.items()} == case.envelopes
    async with db_engine.connect() as conn:
        query = select(ToolExecution.call_id, ToolExecution.outcome)
        rows = list(await conn.execute(query.where(ToolExecution.workflow_id == handle.id)))
    assert sorted((r.call_id, r.outcome) for r in rows) == sorted(case.outcomes.items())
    if case.requests is not None:
        assert len(dev_agent.model.requests) == case.requests


# --- a rollback racing the end ---------------------------------------------------------------------


async def test_a_rollback_sent_just_before_end_still_runs(
    agent: AgentHarness, db_engine: AsyncEngine, scratch: list[str]
) -> None:
    """Fault: the user's `rollback` and `end` signals arrive back to back (undo, then leave).
    Invariant: an accepted rollback runs before the conversation ends: the task it created is
    cancelled and its compensation recorded once."""
    title = "Rollback then end"
    create = {"name": "create_task", "arguments": {"title": title}}
    agent.script(
        {"when": {"user_contains": "task"}, "reply": {"tool_calls": [create]}},
        {"when": {"after_tool": "create_task"}, "reply": {"content": "created"}},
    )
    handle = await agent.start("a task, please", agent="operations")
    await handle.execute_update("wait_turn", 1, result_type=TurnResult)
    await handle.signal(AgentWorkflow.rollback, RollbackRequest(requested_by="alice", scope="conversation"))
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    await handle.result()

    async with db_engine.connect() as conn:
        mine = RollbackRecord.workflow_id == handle.id
        accepted = list((await conn.execute(select(RollbackRecord.accepted).where(mine))).scalars())
        undo = select(Compensation.state).where(Compensation.workflow_id == handle.id)
        undone = list((await conn.execute(undo)).scalars())
        status = list((await conn.execute(select(Task.status).where(Task.title == title))).scalars())
    assert accepted == [True]
    assert (undone, status) == (["done"], ["cancelled"])
