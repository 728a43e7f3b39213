"""Cost vs conversation length: one conversation of many turns, each a user message with ~3 KB of
pasted text and one tool call, through the product's worker on a dev server.

    .venv/bin/python -m bench.conversation_length [--turns 1000]

Measures history bytes added by turns 10, 100, 1000 (and 15, 150), their latency (signal to reply,
median of that turn and the 8 before it), and the runs the conversation took (continue-as-new).
Writes docs/benchmark-length.json (docs/benchmark-length-no-policy.json with `--window 0`) and the
`bench.conversation_length` section of docs/benchmark.md ("Cost vs conversation length", from both
files; bench/sections.py), leaving the rest of the file as it is.
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

from sqlalchemy import insert

from bench import stack
from bench.sections import put_section
from countersign.conversation import Limits, StartConversation, SubmitMessage
from countersign.db.schema import ContextPolicy
from countersign.scripted_model.scenario import Scenario
from workflows.agent import AgentWorkflow

PASTE = "pasted: " + "the quick brown fox jumps over the lazy dog " * 70  # ~3 KB
MEASURED = (10, 15, 100, 150, 1000)
AGENT = "lead-qualifier"
RESULTS = Path("docs/benchmark-length.json")
UNBOUNDED = Path("docs/benchmark-length-no-policy.json")  # `--window 0`: the model sees up to 200 messages
MARKDOWN = Path("docs/benchmark.md")
WINDOW = 9
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


async def history_size(handle: Any) -> tuple[str, int, int]:
    """The latest run's id, history bytes and events."""
    history = await handle.fetch_history()
    return history.run_id, sum(e.ByteSize() for e in history.events), len(history.events)


async def measure(parts: stack.Parts, turns: int) -> dict[str, Any]:
    start = StartConversation(
        tenant_id="acme", user_id="alice", agent=AGENT, limits=Limits(max_turns_per_run=10_000)
    )
    workflow_id = f"bench-length-{uuid.uuid4().hex[:8]}"
    handle = await parts.client.start_workflow(
        AgentWorkflow.run, start, id=workflow_id, task_queue=parts.settings.task_queue
    )
    measured: dict[str, Any] = {}
    latencies: list[float] = []
    for turn in range(1, turns + 1):
        before = await history_size(handle) if turn in MEASURED else None
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
            after = await history_size(handle)
            same_run = after[0] == before[0]
            measured[str(turn)] = {
                "history_bytes": after[1] - before[1] if same_run else None,
                "history_events": after[2] - before[2] if same_run else None,
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


def met(ok: bool) -> str:
    return "met" if ok else "not met"


def section(results_path: Path = RESULTS) -> str:
    """The markdown section from the saved results ("" before the first measurement)."""
    if not results_path.exists():
        return ""
    r = json.loads(results_path.read_text())
    m = r["measured"]
    rows = "\n".join(
        f"| {turn} | {v['history_bytes'] / 1000:.1f} KB | {v['latency_ms']:.0f} ms |" for turn, v in m.items()
    )
    ratio = m["150"]["latency_ms"] / m["15"]["latency_ms"]
    window = r.get("window_messages") or 0
    worst = max(v["history_bytes"] or 0 for v in m.values()) / 1000
    return f"""
## Cost vs conversation length

Produced by `.venv/bin/python -m bench.conversation_length --turns {r["turns"]} --window {window}` (same parts
as above, one conversation of {r["turns"]} turns on `{AGENT}` with a context policy of `window_messages` =
{window}, as the admin assistant has; each turn a user message with ~3 KB of pasted text,
one `get_lead` call, a text reply; `max_turns_per_run` lifted so the conversation continues-as-new
when the server suggests it). **History bytes per turn**: the size of the events the turn added to
its run's history. **Latency**: `submit_message` signal sent → `wait_reply` answered, median of that
turn and the {WINDOW - 1} before it.

| turn | history added | latency |
|---|---|---|
{rows}

| target | measured | |
|---|---|---|
| ≤ 15 KB of history per turn at any length | {worst:.1f} KB at most | **{met(worst <= 15)}** |
| turn 150 within 1.2 x turn 15 | {ratio:.2f} x | **{met(ratio <= 1.2)}** |
| a 1,000-turn conversation in a few runs | {r["runs"]} runs for {r["turns"]} turns | |

Messages live in PostgreSQL (`conversation_messages`): a model call's input is the sequence numbers of
its window and the tool names, so it no longer grows with the conversation (on main, a 151-turn
conversation's model input grew from 12 KB to 300 KB, and a late turn added ~830 KB of history).
What a turn still puts into history: the user's message once (the signal), each tool result once
(the tool activity's result), the model's reply once (`call_model`'s result). Runs end by the
server's continue-as-new suggestion, which the event count reaches first now that the bytes stay
small ({m["1000"]["history_events"] if "1000" in m else "?"} events per turn at turn 1,000).
{unbounded()}"""


def unbounded() -> str:
    """A paragraph on the run without a context policy (`--window 0`), if one was saved."""
    if not UNBOUNDED.exists():
        return ""
    r = json.loads(UNBOUNDED.read_text())
    m = r["measured"]
    worst = max(v["history_bytes"] or 0 for v in m.values()) / 1000
    ratio = m["150"]["latency_ms"] / m["15"]["latency_ms"]
    return f"""
Without a context policy (`--window 0`: the model sees up to 200 messages, the default) the history
per turn stays flat too ({worst:.1f} KB at most, {r["runs"]} runs for {r["turns"]} turns), but turn 150
took {ratio:.2f} x turn 15 ({m["15"]["latency_ms"]:.0f} ms, {m["150"]["latency_ms"]:.0f} ms): the model's
input, loaded from the store, grows until the window is full (50 turns of four messages here), and with it the
work of loading and sending it. That is the model's context, which the policy bounds, not workflow history.
"""


async def main(turns: int, window: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="countersign-bench-") as tmp:
        root = Path(tmp)
        async with (
            stack.postgres(root) as url,
            stack.temporal(root, "length", stack.ServerSetup()) as server,
            stack.parts(url, server.config, Scenario.model_validate(SCENARIO)) as parts,
            stack.in_process_worker(parts, {}) as worker,
        ):
            if window is not None:  # the bench's own database: the agent's model sees `window` messages
                async with worker.engine.begin() as conn:
                    await conn.execute(insert(ContextPolicy).values(agent=AGENT, window_messages=window))
            return {"window_messages": window} | await measure(worker, turns)


def write(results: dict[str, Any]) -> None:
    """Save the results and rewrite the `bench.conversation_length` section of docs/benchmark.md."""
    (RESULTS if results["window_messages"] else UNBOUNDED).write_text(json.dumps(results, indent=2) + "\n")
    text = section()
    if text:  # "" until a run with a context policy is saved
        put_section(MARKDOWN, "bench.conversation_length", text)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--window", type=int, default=20, help="the agent's window_messages (0: no policy)")
    args = parser.parse_args()
    write(asyncio.run(main(args.turns, args.window or None)))
