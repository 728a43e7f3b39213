"""Cost vs conversation length: one conversation of many turns, each a user message with ~3 KB of
pasted text and one tool call, through the product's worker on a dev server.

    python -m bench.conversation_length [--turns 1000]

Prints JSON: history bytes added by turns 10, 100, 1000 (and 15, 150), their latency (signal to
reply, median of that turn and the 4 before it), the runs
the conversation took (continue-as-new). Numbers go to docs/benchmark.md, "cost vs conversation length".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import stack
from countersign.conversation import Limits, StartConversation, SubmitMessage
from countersign.scripted_model.scenario import Scenario
from workflows.agent import AgentWorkflow

PASTE = "pasted: " + "the quick brown fox jumps over the lazy dog " * 70  # ~3 KB
MEASURED = (10, 15, 100, 150, 1000)
WINDOW = 5
SCENARIO = {
    "name": "bench conversation length",
    "rules": [
        {
            "when": {"user_contains": "bench long", "turn_calls": 0},
            "reply": {"tool_calls": [{"name": "get_lead", "arguments": {"lead": "jane.doe@example.com"}}]},
        },
        {"when": {"after_tool": "get_lead"}, "reply": {"content": "Jane Doe is a lead."}},
    ],
}


async def history_bytes(handle: Any) -> tuple[str, int]:
    history = await handle.fetch_history()
    return history.run_id, sum(e.ByteSize() for e in history.events)


async def measure(parts: stack.Parts, turns: int) -> dict[str, Any]:
    start = StartConversation(
        tenant_id="acme", user_id="alice", agent="lead-qualifier", limits=Limits(max_turns_per_run=10_000)
    )
    workflow_id = f"bench-length-{uuid.uuid4().hex[:8]}"
    handle = await parts.client.start_workflow(
        AgentWorkflow.run, start, id=workflow_id, task_queue=parts.settings.task_queue
    )
    measured: dict[str, Any] = {}
    latencies: list[float] = []
    for turn in range(1, turns + 1):
        before = await history_bytes(handle) if turn in MEASURED else None
        message = SubmitMessage(
            user_id="alice", text=f"bench long {turn}: {PASTE}", message_id=uuid.uuid4().hex
        )
        began = time.perf_counter()
        await handle.signal(AgentWorkflow.submit_message, message)
        reply = None
        while reply is None:
            reply = await parts.client.get_workflow_handle(workflow_id).execute_update(
                AgentWorkflow.wait_reply, message.message_id or ""
            )
        latencies.append(time.perf_counter() - began)
        if before is not None:
            after = await history_bytes(handle)
            same_run = after[0] == before[0]
            measured[str(turn)] = {
                "history_bytes": after[1] - before[1] if same_run else None,
                # median of this turn and the WINDOW - 1 before it: one turn alone is too noisy
                "latency_ms": round(statistics.median(latencies[-WINDOW:]) * 1000, 1),
            }
    runs = [w async for w in parts.client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    await handle.terminate("benchmark done")
    return {
        "turns": turns,
        "runs": len(runs),
        "measured": measured,
        "latency_ms_median_all": round(statistics.median(latencies) * 1000, 1),
    }


async def main(turns: int) -> None:
    with tempfile.TemporaryDirectory(prefix="countersign-bench-") as tmp:
        root = Path(tmp)
        async with (
            stack.postgres(root) as url,
            stack.temporal(root, "length", stack.ServerSetup()) as server,
            stack.parts(url, server.config, Scenario.model_validate(SCENARIO)) as parts,
            stack.in_process_worker(parts, {}) as worker,
        ):
            print(json.dumps(await measure(worker, turns), indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=1000)
    asyncio.run(main(parser.parse_args().turns))
