"""A sustained burst of refused signals at one conversation, on the real dev server (issue 40).

    .venv/bin/python -m bench.burst [--senders 3] [--kb 30] [--seconds 8] [--markdown docs/benchmark.md]

Several senders with Temporal access send an outsider's messages (refused, each audited) as fast
as the server takes them, while the conversation's turn waits for a reviewer. Measured: what the
server took and refused at its door, how many runs the conversation went through, how its
workflow tasks failed (by cause: FORCE_CLOSE_COMMAND is the server failing a task because more
than 100 events or 2 MiB arrived while it ran), how many refusals are on the record, and whether
the conversation still decides its approval and answers afterwards. Once with the product's
server configuration (`countersign.devstack.temporal.DYNAMIC_CONFIG`), once with Temporal's
defaults for the per-workflow limits Countersign sets. Writes the `bench.burst` section of
docs/benchmark.md and prints it. The machine is shared: keep the burst small.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import text
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from activities.tools import ToolActivities
from bench import stack
from bench.hostile import waiting_for_a_reviewer
from bench.sections import put_section, run_to_the_end
from countersign.core.bounds import SERVER_LIMITS
from countersign.db.engine import session_factory
from countersign.db.ratelimit import UNLIMITED
from countersign.devstack.temporal import DYNAMIC_CONFIG
from countersign.scripted_model.scenario import Scenario
from worker import build_worker

# Temporal's defaults for the per-workflow limits Countersign configures (the payload bound stays).
PER_WORKFLOW = {k for k in SERVER_LIMITS if not k.startswith("limit.blobSize")}
DEFAULTS = tuple(c for c in DYNAMIC_CONFIG if c.split("=", 1)[0] not in PER_WORKFLOW)


async def burst(parts: stack.Parts, senders: int, size: int, seconds: float) -> dict[str, Any]:
    handle = await waiting_for_a_reviewer(parts)
    sent, door = 0, Counter[str]()
    stop = time.monotonic() + seconds

    async def sender() -> None:
        nonlocal sent
        while time.monotonic() < stop:
            noise = secrets.token_urlsafe(size)[:size]  # incompressible, as a real flood's
            try:
                await handle.signal("submit_message", {"user_id": "mallory", "text": noise})
                sent += 1
            except RPCError as refused:
                door[refused.status.name if refused.status else "?"] += 1

    began = time.monotonic()
    await asyncio.gather(*(sender() for _ in range(senders)))
    elapsed = time.monotonic() - began
    recorded = await settled_count(parts, handle.id)
    runs = [e async for e in parts.client.list_workflows(f"WorkflowId = '{handle.id}'")]
    causes: Counter[str] = Counter()
    for run in runs:
        history = await parts.client.get_workflow_handle(handle.id, run_id=run.run_id).fetch_history()
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                cause = event.workflow_task_failed_event_attributes.cause
                causes[WorkflowTaskFailedCause.Name(cause).removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")] += 1
    latest = max(runs, key=lambda r: r.start_time)
    answered = latest.status == WorkflowExecutionStatus.RUNNING and await decides(handle)
    with contextlib.suppress(RPCError):
        await handle.terminate("measured")
    return {
        "sent": sent,
        "door": dict(door),
        "seconds": elapsed,
        "mb_per_s": sent * size / elapsed / 1e6,
        "runs": len(runs),
        "latest": latest.status.name if latest.status else "?",
        "causes": dict(causes),
        "recorded": recorded,
        "answered": answered,
    }


async def settled_count(parts: stack.Parts, workflow_id: str) -> int:
    """The refusals on the record once their count has not moved for 5 s (a minute at most)."""
    query = text("SELECT count(*) FROM input_audit WHERE workflow_id = :w AND actor = 'mallory'")
    last, still = -1, 0
    for _ in range(120):
        async with parts.engine.connect() as conn:
            now = int((await conn.execute(query, {"w": workflow_id})).scalar_one())
        still = still + 1 if now == last else 0
        if still >= 10:
            break
        last = now
        await asyncio.sleep(0.5)
    return last


async def decides(handle: WorkflowHandle[Any, Any]) -> bool:
    """bob's decision is taken and the turn answers (30 s at most)."""
    decision = {"call_id": "c1", "decision": "approve", "approver": "bob"}
    for _ in range(60):
        try:
            await asyncio.wait_for(handle.execute_update("decide", decision), timeout=10)
            turn = await asyncio.wait_for(handle.execute_update("wait_turn", 1), timeout=20)
            return turn is not None
        except (RPCError, TimeoutError, Exception):  # refused while continuing, or not answering
            await asyncio.sleep(0.5)
    return False


async def measure(senders: int, size: int, seconds: float) -> list[tuple[str, dict[str, Any]]]:
    results = []
    for label, config in (("Countersign's limits", DYNAMIC_CONFIG), ("Temporal's defaults", DEFAULTS)):
        with tempfile.TemporaryDirectory(prefix="countersign-burst-") as tmp:
            root = Path(tmp)
            scenario = Scenario.model_validate({"name": "burst", "rules": []})
            async with (
                stack.postgres(root) as url,
                stack.temporal(root, "burst", stack.ServerSetup(dynamic_config=config)) as server,
                stack.parts(url, server.config, scenario) as parts,
            ):
                settings = parts.settings.model_copy(update={"task_queue": f"burst-{uuid.uuid4()}"})
                sessions = session_factory(parts.engine)
                tools = ToolActivities(sessions, rate_limits=UNLIMITED)
                async with build_worker(parts.client, settings, sessions, tools):
                    running = stack.Parts(parts.client, settings, parts.engine, parts.model)
                    results.append((label, await burst(running, senders, size, seconds)))
    return results


HEADER = (
    "| server | signals taken | refused at the door | runs | latest run "
    "| failed workflow tasks (cause) | refusals recorded | approval decided, turn answered |\n"
    "|---|---|---|---|---|---|---|---|"
)


def section(senders: int, size: int, seconds: float, results: list[tuple[str, dict[str, Any]]]) -> str:
    rows = "\n".join(
        f"| {label} | {r['sent']} ({r['mb_per_s']:.1f} MB/s) | {r['door'] or '—'} | {r['runs']} "
        f"| {r['latest']} | {r['causes'] or '—'} | {r['recorded']} of {r['sent']} "
        f"| {'yes' if r['answered'] else 'no'} |"
        for label, r in results
    )
    limits = ", ".join(f"`{k}={v}`" for k, v in SERVER_LIMITS.items() if k in PER_WORKFLOW)
    return f"""## A sustained burst of refused signals (issue 40)

`.venv/bin/python -m bench.burst --senders {senders} --kb {size // 1000} --seconds {seconds:g}`:
{senders} senders with Temporal access send an outsider's {size // 1000} KB messages (random text,
refused and audited) for {seconds:g} s while the conversation waits for a reviewer, on the real dev
server; then bob approves and the turn must answer. Countersign's per-workflow limits: {limits}.
Measured on {os.cpu_count()} shared cores (load average {os.getloadavg()[0]:.1f} at the end), the
senders sharing them with the server and the worker (the rate is what they reached): small bursts,
one run each, so the numbers are indicative.

{HEADER}
{rows}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=3)
    parser.add_argument("--kb", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmark.md"))
    args = parser.parse_args()
    size = args.kb * 1000
    results = run_to_the_end(measure(args.senders, size, args.seconds))
    text_ = section(args.senders, size, args.seconds, results)
    put_section(args.markdown, "bench.burst", text_)
    print(text_)


if __name__ == "__main__":
    main()
