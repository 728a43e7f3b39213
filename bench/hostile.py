"""Hostile input, measured: how long each class of hostile input takes to settle on the real dev
server (real timers, not the time-skipping server the tests use), and how many attempts the
activities it caused made.

    .venv/bin/python -m bench.hostile [--runs 5] [--markdown docs/benchmark.md]

"Settled" means: a conversation whose model sent the arguments finished its single turn; a start
input failed its workflow; a refused signal's row is in PostgreSQL; a flood's refusals are all
recorded and the approval it waited on still decides the turn; an oversized signal is refused by
the server; after an oversized update the conversation answers again. Writes the `bench.hostile`
section of docs/benchmark.md ("Hostile input"; bench/sections.py), leaving the rest of the file as
it is, and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import text
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.tools import ToolActivities
from bench import stack
from bench.sections import put_section, run_to_the_end
from countersign.core.bounds import MAX_PAYLOAD_BYTES
from countersign.core.contract import Limits, StartConversation, StatusView, SubmitMessage
from countersign.db.engine import session_factory
from countersign.db.ratelimit import UNLIMITED
from countersign.scripted_model.scenario import Reply, Scenario, ScriptedCall
from worker import build_worker


class Attempts(Interceptor):
    """The highest attempt number each activity (local ones too) reached, per workflow."""

    def __init__(self) -> None:
        self.highest: defaultdict[str, int] = defaultdict(int)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        attempts = self

        class Counted(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                info = activity.info()
                attempts.highest[info.workflow_id or ""] = max(
                    attempts.highest[info.workflow_id or ""], info.attempt
                )
                return await super().execute_activity(input)

        return Counted(next)


def raw(json_text: str) -> RawValue:
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=json_text.encode()))


TOOL_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "id past int64 (`get_record` id 2^63)": (
        "admin-assistant",
        "get_record",
        {"collection": "tasks", "id": 2**63},
    ),
    'digits `int()` rejects (`get_lead` "²")': ("lead-qualifier", "get_lead", {"lead": "²"}),
    "25-digit id (`update_task`)": ("operations", "update_task", {"task": "9" * 25, "status": "done"}),
    "year 1 with an offset (`create_event`)": (
        "operations",
        "create_event",
        {"title": "x", "starts_at": "0001-01-01T00:00:00+05:00", "ends_at": "0001-01-01T01:00:00+05:00"},
    ),
    "value past int64 (`write_record`)": (
        "admin-assistant",
        "write_record",
        {"collection": "tasks", "values": [{"field": "title", "value": 10**30}]},
    ),
    "Infinity in the arguments (`create_project`)": (
        "operations",
        "create_project",
        {"description": math.inf},
    ),
}
START_CASES = {
    "limits with NaN": json.dumps({"tenant_id": "acme", "user_id": "alice", "agent": "lead-qualifier"})[:-1]
    + ', "limits": {"max_tokens": NaN}}',
    "unknown user": json.dumps({"tenant_id": "acme", "user_id": "mallory", "agent": "lead-qualifier"}),
    "forged carried state": json.dumps(
        {
            "tenant_id": "acme",
            "user_id": "alice",
            "agent": "lead-qualifier",
            "carried": {"messages": [], "usage": {}, "turn": 0, "call_seq": 0},
            "seal": "0" * 64,
        }
    ),
}
SIGNAL_CASES = {
    "approve with a NUL in the approver": ("approve", '{"call_id": "c1", "approver": "b\\u0000ob"}'),
    "end by another tenant's user": ("end", '{"requested_by": "dave"}'),
    "rollback nested 5000 deep": ("rollback", '{"requested_by": ' + "[" * 5000 + "]" * 5000 + "}"),
}


async def settle_tool(parts: stack.Parts, tool: tuple[str, str, dict[str, Any]]) -> tuple[float, str]:
    agent, name, args = tool
    call = ScriptedCall(name=name, arguments=args)
    parts.model.set_scenario(
        Scenario.model_validate(
            {
                "name": "hostile",
                "rules": [
                    {"reply": Reply(tool_calls=[call]).model_dump()},
                    {"when": {"after_tool": name}, "reply": {"content": "done"}},
                ],
            }
        )
    )
    start = StartConversation(
        tenant_id="acme",
        user_id="alice",
        agent=agent,
        message="go",
        single_turn=True,
        limits=Limits(approval_timeout_s=60),
    )
    began = time.perf_counter()
    handle = await parts.client.start_workflow(
        "AgentWorkflow", start, id=f"hostile-{uuid.uuid4()}", task_queue=parts.settings.task_queue
    )
    await handle.result()
    return time.perf_counter() - began, handle.id


async def settle_start(parts: stack.Parts, payload: str) -> tuple[float, str]:
    began = time.perf_counter()
    handle = await parts.client.start_workflow(
        "AgentWorkflow", raw(payload), id=f"hostile-{uuid.uuid4()}", task_queue=parts.settings.task_queue
    )
    try:
        await handle.result()
    except WorkflowFailureError:
        return time.perf_counter() - began, handle.id
    raise AssertionError(f"{handle.id} did not fail")


async def settle_signal(parts: stack.Parts, signal: tuple[str, str]) -> tuple[float, str]:
    name, payload = signal
    parts.model.set_scenario(
        Scenario.model_validate({"name": "hostile", "rules": [{"reply": {"content": "ok"}}]})
    )
    start = StartConversation(tenant_id="acme", user_id="alice", agent="lead-qualifier")
    handle = await parts.client.start_workflow(
        "AgentWorkflow", start, id=f"hostile-{uuid.uuid4()}", task_queue=parts.settings.task_queue
    )
    await handle.signal("submit_message", SubmitMessage(user_id="alice", text="hi"))
    await handle.execute_update("wait_turn", 1)
    query = text(
        "SELECT (SELECT count(*) FROM input_audit WHERE workflow_id = :w)"
        " + (SELECT count(*) FROM rollback_requests WHERE workflow_id = :w)"
    )
    began = time.perf_counter()
    await handle.signal(name, raw(payload))
    while True:
        async with parts.engine.connect() as conn:
            if (await conn.execute(query, {"w": handle.id})).scalar_one():
                break
        await asyncio.sleep(0.005)
    settled = time.perf_counter() - began
    await handle.terminate("measured")
    return settled, handle.id


FLOOD_SIGNALS, FLOOD_BYTES = 12, 900_000  # 10.8 MB: past the 10 MB at which a run continues as new
QUALIFY = {
    "when": {"user_contains": "qualify"},
    "reply": {
        "tool_calls": [
            {
                "name": "update_lead_status",
                "arguments": {"lead": "jane.doe@example.com", "new_status": "contacted", "reason": "flood"},
            }
        ]
    },
}


async def waiting_for_a_reviewer(parts: stack.Parts) -> WorkflowHandle[Any, Any]:
    """A conversation whose turn waits for a reviewer's decision on call c1."""
    rules = [QUALIFY, {"when": {"after_tool": "update_lead_status"}, "reply": {"content": "done"}}]
    parts.model.set_scenario(Scenario.model_validate({"name": "flood", "rules": rules}))
    start = StartConversation(
        tenant_id="acme", user_id="alice", agent="lead-qualifier", message="qualify jane"
    )
    handle = await parts.client.start_workflow(
        "AgentWorkflow", start, id=f"flood-{uuid.uuid4()}", task_queue=parts.settings.task_queue
    )
    for _ in range(600):
        if (await handle.query("status", result_type=StatusView)).pending_approvals:
            return handle
        await asyncio.sleep(0.05)
    raise AssertionError(f"{handle.id} never asked for approval")


async def settle_flood(parts: stack.Parts) -> tuple[float, str]:
    """12 refused 900 KB messages (an outsider's) while the turn waits for a reviewer: settled
    once every refusal is recorded and the approval, carried across continue-as-new, decides the
    turn."""
    handle = await waiting_for_a_reviewer(parts)
    began = time.perf_counter()
    for _ in range(FLOOD_SIGNALS):
        noise = secrets.token_urlsafe(FLOOD_BYTES)[:FLOOD_BYTES]  # incompressible, as a real flood's
        await handle.signal("submit_message", {"user_id": "mallory", "text": noise})
    query = text("SELECT count(*) FROM input_audit WHERE workflow_id = :w")
    for _ in range(6000):  # a minute
        async with parts.engine.connect() as conn:
            if (await conn.execute(query, {"w": handle.id})).scalar_one() >= FLOOD_SIGNALS:
                break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError(f"{handle.id}: not every refusal of the flood was recorded")
    decision = {"call_id": "c1", "decision": "approve", "approver": "bob"}
    for _ in range(100):  # a decision that meets the run continuing as new is refused: sent again
        try:
            await handle.execute_update("decide", decision)
            break
        except WorkflowUpdateFailedError as refused:
            assert "continuing as new" in str(refused.cause), refused.cause
            await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"{handle.id}: the decision was refused for 10 s")
    await handle.execute_update("wait_turn", 1)
    settled = time.perf_counter() - began
    latest = (await handle.describe()).run_id
    assert latest != handle.first_execution_run_id, f"{handle.id} did not continue as new under the flood"
    await handle.terminate("measured")
    return settled, handle.id


async def settle_oversized_signal(parts: stack.Parts) -> tuple[float, str]:
    """A message of 1 MiB + 1 byte: settled when the server has refused it (INVALID_ARGUMENT)."""
    handle = await waiting_for_a_reviewer(parts)
    began = time.perf_counter()
    try:
        await handle.signal("submit_message", {"user_id": "mallory", "text": "x" * (MAX_PAYLOAD_BYTES + 1)})
    except RPCError as refused:
        assert refused.status == RPCStatusCode.INVALID_ARGUMENT, refused
    else:
        raise AssertionError("the server took a signal over the bound")
    settled = time.perf_counter() - began
    await handle.terminate("measured")
    return settled, handle.id


async def settle_oversized_update(parts: stack.Parts) -> tuple[float, str]:
    """A `decide` of 1.5 MB: the server does not bound it and the worker's SDK fails the workflow
    tasks that would take it until the server gives it up; settled when the conversation answers a
    query again (its approval still pending)."""
    handle = await waiting_for_a_reviewer(parts)
    began = time.perf_counter()
    heavy = {"call_id": "c1", "decision": "approve", "approver": "bob", "comment": "x" * 1_500_000}
    with contextlib.suppress(RPCError):
        await handle.execute_update("decide", heavy)
    for _ in range(1200):  # two minutes
        with contextlib.suppress(RPCError):
            status = await handle.query("status", result_type=StatusView)
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"{handle.id} never answered again after the oversized update")
    assert status.pending_approvals, status
    settled = time.perf_counter() - began
    await handle.terminate("measured")
    return settled, handle.id


async def measure(runs: int) -> list[tuple[str, list[float], int]]:
    cases: list[tuple[str, Callable[[stack.Parts], Awaitable[tuple[float, str]]]]] = []
    cases += [(f"tool call: {k}", partial(settle_tool, tool=c)) for k, c in TOOL_CASES.items()]
    cases += [(f"start input: {k}", partial(settle_start, payload=c)) for k, c in START_CASES.items()]
    cases += [(f"signal: {k}", partial(settle_signal, signal=c)) for k, c in SIGNAL_CASES.items()]
    cases += [
        (
            f"flood: {FLOOD_SIGNALS} refused {FLOOD_BYTES // 1000} KB messages while a reviewer is awaited",
            settle_flood,
        ),
        ("a signal of 1 MiB + 1 byte", settle_oversized_signal),
        ("an update (`decide`) of 1.5 MB", settle_oversized_update),
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="countersign-hostile-") as tmp:
        root = Path(tmp)
        scenario = Scenario.model_validate({"name": "hostile", "rules": []})
        async with (
            stack.postgres(root) as url,
            stack.temporal(root, "hostile", stack.ServerSetup()) as server,
            stack.parts(url, server.config, scenario) as parts,
        ):
            attempts = Attempts()
            settings = parts.settings.model_copy(update={"task_queue": f"hostile-{uuid.uuid4()}"})
            sessions = session_factory(parts.engine)
            tools = ToolActivities(sessions, rate_limits=UNLIMITED)
            async with build_worker(parts.client, settings, sessions, tools, [attempts]):
                running = stack.Parts(parts.client, settings, parts.engine, parts.model)
                for label, case in cases:
                    times, highest = [], 0
                    for _ in range(runs):
                        seconds, workflow_id = await case(running)
                        times.append(seconds)
                        highest = max(highest, attempts.highest.get(workflow_id, 0))
                    results.append((label, times, highest))
    return results


def section(runs: int, results: list[tuple[str, list[float], int]]) -> str:
    rows = "\n".join(
        f"| {label} | {statistics.median(times) * 1000:.0f} ms | {max(times) * 1000:.0f} ms | {highest} |"
        for label, times, highest in results
    )
    retried = [label for label, _, highest in results if highest > 1]
    now = (
        f"Still retried: {', '.join(retried)}."
        if retried
        else "Every case above now ends at its first attempt (the NaN start\n"
        "input runs no activity at all: it fails before the first one)."
    )
    return f"""## Hostile input (issue 12)

`.venv/bin/python -m bench.hostile --runs {runs}` (a separate script: the main benchmark is unchanged)
sends each class of hostile input to a conversation on the real dev server — real timers, unlike
the time-skipping server of `tests/e2e/test_hostile_input.py`, which would hide a retry loop — and
measures how long it takes to settle and the highest attempt any activity it caused reached
(an interceptor in the worker reads `activity.info().attempt`, local activities included).
Settled: the single-turn conversation whose model sent the arguments finished; the start input's
workflow failed; the refused signal's row is in PostgreSQL; the flood's refusals are all recorded
and the approval it waited on, carried when the run continued as new, decided the turn (issue 26,
class 5); the server refused the oversized signal; the conversation answers again after the
oversized update (the server does not bound updates; docs/explanation/security.md). The flood is random text:
the dev server counts a history's size compressed (12 messages of 900 KB of `x` counted 0.4 MB and
never filled the 10 MB at which a run continues as new; random text counted 10.8 MB). Measured on
{os.cpu_count()} shared cores, load average {os.getloadavg()[0]:.1f} at the end, so the maxima are noisy.

| Hostile input ({runs} runs each, real dev server) | median | max | highest activity attempt |
|---|---|---|---|
{rows}

Before (the issue's findings on main): reads with such arguments retried for over ten minutes
without ending the turn, writes stalled five minutes before reaching the model as an
`INTERNAL_ERROR` carrying SQL; an Infinity in the arguments made jsonb refuse the audit row,
retried for five minutes; the NaN limits, the nested arguments and the NUL approver each
failed workflow tasks forever. {now}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmark.md"))
    args = parser.parse_args()
    text = section(args.runs, run_to_the_end(measure(args.runs)))
    put_section(args.markdown, "bench.hostile", text)
    print(text)


if __name__ == "__main__":
    main()
