"""Load: many conversations active at once, turns arriving at a steady rate (issue 25).

    .venv/bin/python -m bench.load            # bounded: 100 conversations, 2 workers, 40 s (~5 min)
    .venv/bin/python -m bench.load --full     # 1,000 conversations, 4 workers, 5 min of turns

Parts as in bench.run (embedded PostgreSQL, the dev server as `dev up` runs it, the scripted model
answering at once), `python worker.py` processes on one task queue. **Load**: the conversations
are started (multi-turn, idle), then user messages arrive at a steady rate, each to a conversation
not in a turn, round robin (none free: the turn is lost, the system fell behind); a turn is one
`search_leads` call and a text reply, lost too when its reply takes over TURN_TIMEOUT_S. Reply latency:
`submit_message` signal sent → `wait_reply` answered. Tool latency: the model reply that asked for
the call stored (its `model_calls` row, written in the reply's transaction) → the call's audit row
finished (`tool_executions.finished_at`). Success: turns that completed, tool calls executed. CPU:
each process group's CPU seconds over the turns' wall time (cores busy; the machine has 2).

**Long turn**: one turn of `--long` sequential `get_lead` calls on an in-process worker (its activities
timed, bench/clock.py), with nothing else running; step cost (model call scheduled → next one)
around the 10th, 100th and 300th call, split into the activities' own time and orchestration.
Writes docs/benchmark-load.json and the `bench.load` section of docs/benchmark.md.

**People** (issue 52; bench/people.py):

    .venv/bin/python -m bench.load --users 1000 --think 60 [--duration 120] [--workers 1]
    .venv/bin/python -m bench.load --find --think 60 [--duration 120] [--workers 1|2|3]

N users each writing, reading the reply and writing again after an exponential think time, for a
fixed time; `--find` the largest N holding reply p95 < 3 s and tool-call p95 < 500 ms with 1, 2 and
3 worker processes. Writes docs/benchmark-people.json and the `bench.people` section.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psutil
from sqlalchemy import text
from temporalio.client import Client, WorkflowUpdateRPCTimeoutOrCancelledError

from bench import bare, cost, stack, workloads
from bench.report import num, table
from bench.sections import put_section, recorded_run
from bench.stats import percentile
from countersign.core.bounds import MAX_TOKENS, MAX_TURN_S
from countersign.core.contract import Limits, StartConversation, SubmitMessage, TurnResult
from countersign.runtime.logs import configure as configure_logging
from countersign.scripted_model.scenario import Scenario
from workflows.agent import AgentWorkflow

Json = dict[str, Any]
T = TypeVar("T")
MS = 1000.0
LOAD_MESSAGE = "bench load: look Jane Doe up"
LONG_MESSAGE = "bench long turn: look Jane Doe up, again and again"
SEARCH = {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane Doe"}}]}
GET = {"tool_calls": [{"name": "get_lead", "arguments": {"lead": "jane.doe@example.com"}}]}
CHECKPOINTS = (10, 100, 300)  # the long turn's step cost around these calls
WINDOW = 10  # steps per checkpoint: the ten before it
TURN_TIMEOUT_S = 60.0  # a reply later than this counts as a failed turn
NO_IDLE_CONVERSATION = "no idle conversation"  # a turn arriving while every conversation is in one
TARGET_REPLY_S, TARGET_TOOL_S, TARGET_SUCCESS = 3.0, 0.5, 0.95
PEOPLE_DURATION_S = 120.0  # --users/--find: how long users write, unless --duration


@dataclass(frozen=True)
class Sizes:
    conversations: int  # active at once
    workers: int  # `python worker.py` processes
    rate_per_s: float  # turns arriving per second
    duration_s: float  # how long turns arrive
    long_turn: int  # tool calls in the long turn


DEFAULT = Sizes(conversations=100, workers=2, rate_per_s=3.0, duration_s=40.0, long_turn=300)
FULL = Sizes(conversations=1000, workers=4, rate_per_s=8.0, duration_s=300.0, long_turn=300)


def progress(message: str) -> None:
    print(f"[bench.load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def scenario() -> Scenario:
    """Load turns: `search_leads`, then a text reply. The long turn: `get_lead` again and again,
    whatever the model still sees of the turn (its window drops the user's message after 200
    messages), until the turn's `max_tool_calls` ends it. A rule without `after_tool` matches
    only when the latest message is the user's."""
    rules: list[Json] = [
        {"when": {"user_contains": LONG_MESSAGE}, "reply": GET},
        {"when": {"after_tool": "get_lead"}, "reply": GET},
        {"when": {"user_contains": LOAD_MESSAGE}, "reply": SEARCH},
        {
            "when": {"user_contains": LOAD_MESSAGE, "after_tool": "search_leads"},
            "reply": {"content": "A lead."},
        },
    ]
    return Scenario.model_validate({"name": "bench load", "rules": rules})


# --- the long turn -----------------------------------------------------------------------------------


async def long_turn(parts: stack.Parts, calls: int) -> Json:
    """One turn of `calls` tool calls, Countersign's then the bare loop's, on in-process workers."""
    limits = Limits(
        max_iterations=calls + 1, max_tool_calls=calls, max_tokens=MAX_TOKENS, turn_timeout_s=MAX_TURN_S
    )
    start = workloads.conversation(LONG_MESSAGE).model_copy(update={"limits": limits})
    bare_start = await cost.bare_start(parts, LONG_MESSAGE, max_calls=calls)
    found: Json = {}
    sides = [cost.countersign_side(parts), cost.Side(cost.BARE, cost.idle, "bench.bare", bare.build_worker)]
    async with cost.in_process(parts, sides) as queues:
        for name, (queue, clock) in queues.items():
            began = time.perf_counter()
            if name == cost.COUNTERSIGN:
                handle: Any = await parts.client.start_workflow(
                    AgentWorkflow.run, start, id=f"bench-long-{uuid.uuid4()}", task_queue=queue
                )
                made = (await handle.result()).usage.tool_calls
            else:
                handle = await bare.bare_client(parts.client).start_workflow(
                    bare.WORKFLOW,
                    bare_start,
                    id=f"bare-long-{uuid.uuid4()}",
                    task_queue=queue,
                    result_type=int,
                )
                made = await handle.result()
            sample = await workloads.steps_sample(handle, clock, time.perf_counter() - began, made)
            history = await handle.fetch_history()
            found[name] = {
                "tool_calls": sample.tool_calls,
                "wall_s": round(sample.wall_s, 1),
                "history_kb": round(sum(e.ByteSize() for e in history.events) / 1000, 1),
                "checkpoints": checkpoints(sample),
            }
    return found


def checkpoints(sample: workloads.StepsSample) -> Json:
    """Medians of the WINDOW steps up to each checkpoint the turn reached."""
    found = {}
    for at in (c for c in CHECKPOINTS if c <= len(sample.steps) + 1):
        window = sample.steps[max(0, at - 1 - WINDOW) : at - 1]
        found[str(at)] = {
            "step_wall_ms": round(statistics.median(s.interval_s for s in window) * MS, 1),
            "own_ms": round(statistics.median(s.own_s for s in window) * MS, 1),
            "orchestration_ms": round(statistics.median(s.overhead_s for s in window) * MS, 1),
        }
    return found


# --- the load ------------------------------------------------------------------------------------------


@dataclass
class Turn:
    latency_s: float
    stop: str  # completed, limit_reached, error, timeout, or NO_IDLE_CONVERSATION


async def one_turn(client: Client, workflow_id: str, timeout_s: float = TURN_TIMEOUT_S) -> Turn:
    """Send a user message and wait for its reply: "timeout" when none came within `timeout_s`."""
    message = SubmitMessage(user_id=workloads.REQUESTER, text=LOAD_MESSAGE, message_id=uuid.uuid4().hex)
    handle = client.get_workflow_handle(workflow_id)  # no run id: the latest run, after continue-as-new too
    this = asyncio.current_task()
    assert this is not None
    began = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            await handle.signal(AgentWorkflow.submit_message, message)
            reply: TurnResult | None = None
            while reply is None:  # None: the run continued as new; ask the next one
                try:
                    reply = await handle.execute_update(
                        "wait_reply", message.message_id, result_type=TurnResult
                    )
                except WorkflowUpdateRPCTimeoutOrCancelledError:
                    # the client raises it when the server's long poll ends and when this task is
                    # cancelled (the deadline above, or the run interrupted): only the first asks again
                    if this.cancelling():
                        raise asyncio.CancelledError from None
    except TimeoutError:
        return Turn(time.perf_counter() - began, "timeout")
    return Turn(time.perf_counter() - began, reply.stop)


async def start_idle(parts: stack.Parts, count: int, in_flight: int = 50) -> list[str]:
    gate = asyncio.Semaphore(in_flight)
    start = StartConversation(tenant_id=workloads.TENANT, user_id=workloads.REQUESTER, agent=workloads.AGENT)

    async def one(n: int) -> str:
        async with gate:
            handle = await parts.client.start_workflow(
                AgentWorkflow.run,
                start,
                id=f"bench-load-{n}-{uuid.uuid4().hex[:8]}",
                task_queue=parts.settings.task_queue,
            )
            return handle.id

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def steady_turns(
    client: Client, ids: list[str], rate_per_s: float, duration_s: float, timeout_s: float = TURN_TIMEOUT_S
) -> list[Turn]:
    """A turn every 1/rate seconds for `duration_s`, each to the next conversation not in a turn; the
    turns sent, then those that found every conversation in a turn (lost: the system fell behind)."""
    busy: set[str] = set()
    idle = itertools.cycle(ids)
    tasks: list[asyncio.Task[Turn]] = []
    lost: list[Turn] = []

    async def run(workflow_id: str) -> Turn:
        busy.add(workflow_id)
        try:
            return await one_turn(client, workflow_id, timeout_s)
        finally:
            busy.discard(workflow_id)

    began = time.perf_counter()
    async with asyncio.TaskGroup() as group:  # interrupted, the turns in flight end with it
        for n in itertools.count():
            due = began + n / rate_per_s
            if due - began >= duration_s:
                break
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            workflow_id = next((w for w in itertools.islice(idle, len(ids)) if w not in busy), None)
            if workflow_id is None:
                lost.append(Turn(0.0, NO_IDLE_CONVERSATION))
            else:
                tasks.append(group.create_task(run(workflow_id)))
    return [task.result() for task in tasks] + lost


async def tool_latencies(
    parts: stack.Parts, prefix: str, since: datetime
) -> tuple[list[float], dict[str, int]]:
    """Per tool call of the load (finished after `since`): its model reply stored → its audit row
    finished (seconds); and the calls by outcome."""
    query = text(
        """
        SELECT EXTRACT(EPOCH FROM (t.finished_at - m.created_at)), t.outcome
        FROM tool_executions t
        JOIN model_calls m ON m.workflow_id = t.workflow_id AND m.turn = t.turn AND m.tool_calls > 0
        WHERE t.workflow_id LIKE :prefix AND t.finished_at >= :since
        """
    )
    async with parts.engine.connect() as connection:
        rows = (await connection.execute(query, {"prefix": f"{prefix}%", "since": since})).all()
    outcomes: dict[str, int] = {}
    for _, outcome in rows:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return [float(r[0]) for r in rows if r[0] is not None], outcomes


@asynccontextmanager
async def workers(parts: stack.Parts, root: Path, count: int) -> AsyncIterator[tuple[stack.Parts, list[int]]]:
    settings = parts.settings.model_copy(update={"task_queue": f"bench-load-{time.monotonic_ns()}"})
    sub = stack.Parts(parts.client, settings, parts.engine, parts.model)
    async with stack.worker_subprocesses(settings, root / settings.task_queue, count) as pids:
        yield sub, pids


def spread(samples: list[float]) -> Json:
    return {
        "n": len(samples),
        **{f"p{q}": round(percentile(samples, q) * MS, 1) if samples else None for q in (50, 95, 99)},
    }


async def cores_during(
    root: Path, pids: list[int], server_pid: int, work: Awaitable[T]
) -> tuple[T, float, Json]:
    """`work`'s result, its wall seconds, and the cores each part used meanwhile (CPU seconds ÷ wall
    seconds): the worker processes, the dev server, PostgreSQL, and this process (the client sending
    the turns, the scripted model)."""
    groups = {
        "worker processes": pids,
        "Temporal dev server": [server_pid],
        "PostgreSQL": [stack.postmaster_pid(root)],
    }
    own = psutil.Process().pid
    before = {k: sum(stack.cpu_s(p) for p in v) for k, v in groups.items()}
    own_before = stack.cpu_s(own, children=False)
    began = time.perf_counter()
    done = await work
    wall = time.perf_counter() - began
    busy = {k: round((sum(stack.cpu_s(p) for p in v) - before[k]) / wall, 2) for k, v in groups.items()}
    busy["bench process (client, scripted model)"] = round(
        (stack.cpu_s(own, children=False) - own_before) / wall, 2
    )
    return done, wall, busy


async def load(parts: stack.Parts, root: Path, sizes: Sizes, server_pid: int) -> Json:
    async with workers(parts, root, sizes.workers) as (sub, pids):
        progress(f"starting {sizes.conversations} conversations on {sizes.workers} worker processes")
        ids = await start_idle(sub, sizes.conversations)
        progress("warm-up: one turn in each of ten conversations")
        await asyncio.gather(*(one_turn(sub.client, w) for w in ids[:10]))
        since = datetime.now(UTC)
        progress(f"turns at {sizes.rate_per_s}/s for {sizes.duration_s:g} s")
        arriving = steady_turns(sub.client, ids, sizes.rate_per_s, sizes.duration_s)
        turns, wall, busy = await cores_during(root, pids, server_pid, arriving)
    tools, outcomes = await tool_latencies(parts, "bench-load-", since)
    completed = [t for t in turns if t.stop == "completed"]
    return {
        "turns": len(turns),
        "wall_s": round(wall, 1),
        "turns_per_s": round(len(turns) / wall, 2),
        "reply_ms": spread([t.latency_s for t in completed]),
        "turn_stops": {s: sum(t.stop == s for t in turns) for s in sorted({t.stop for t in turns})},
        "success": round(len(completed) / max(len(turns), 1), 4),
        "tool_ms": spread(tools),
        "tool_outcomes": outcomes,
        "tool_success": round(outcomes.get("executed", 0) / max(sum(outcomes.values()), 1), 4),
        "cores_busy": busy,
    }


async def measure(sizes: Sizes, skip_long: bool) -> Json:
    began = time.perf_counter()
    progress("starting PostgreSQL and the dev server")
    async with stack.started("load", scenario()) as (root, server, parts):
        result: Json = {}
        if not skip_long:
            progress(f"one turn of {sizes.long_turn} tool calls")
            result["long_turn"] = await long_turn(parts, sizes.long_turn)
        result["load"] = await load(parts, root, sizes, server.pid)
    return {**result, "sizes": asdict(sizes), "duration_s": round(time.perf_counter() - began, 1)}


def met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def render(r: Json) -> str:
    sizes, host, lo = r["sizes"], r["machine"], r["load"]
    reply, tool = lo["reply_ms"], lo["tool_ms"]
    rows = [
        ["reply (signal → `wait_reply` answered)", *(num(reply[f"p{q}"]) for q in (50, 95, 99))],
        ["tool call (model reply stored → audit row finished)", *(num(tool[f"p{q}"]) for q in (50, 95, 99))],
    ]
    p95_reply, p95_tool = reply["p95"] or float("inf"), tool["p95"] or float("inf")
    targets = [
        ["reply within 3 s (p95)", f"{num(p95_reply)} ms", met(p95_reply <= TARGET_REPLY_S * MS)],
        ["tool call within 500 ms (p95)", f"{num(p95_tool)} ms", met(p95_tool <= TARGET_TOOL_S * MS)],
        ["over 95 % of tool calls succeed", f"{lo['tool_success'] * 100:.1f} %",
         met(lo["tool_success"] > TARGET_SUCCESS)],
        [f"conversations active at once (target 1,000+): {sizes['conversations']}",
         f"{lo['turns_per_s']} turns/s", met(sizes["conversations"] >= 1000 and lo["success"] > 0.95)],
    ]  # fmt: skip
    busy = lo["cores_busy"]
    every = 1 / sizes["rate_per_s"]
    lines = [
        "## Load: many conversations at once (`python -m bench.load`)",
        "",
        f"Produced by `{r['command']}` ({r['duration_s']} s). Load average"
        f" {host['load_average_at_start']} at the start, {host['load_average_at_end']} at the end: 2 cores"
        " shared with other engineers' test runs.",
        "",
        f"{sizes['conversations']} conversations active at once (`lead-qualifier`, multi-turn),"
        f" {sizes['workers']} `python worker.py` processes; a user message every {every:.2f} s for"
        f" {sizes['duration_s']:g} s, each to the next conversation not in a turn; a turn is one"
        f" `search_leads` call and a text reply. {lo['turns']} turns, {lo['turns_per_s']} a second;"
        f" turns by how they ended: {lo['turn_stops']}; tool calls by outcome: {lo['tool_outcomes']}.",
        "",
        *table(["ms", "p50", "p95", "p99"], rows),
        "",
        *table(["target (the scheduling design's)", "measured", ""], targets),
        "",
        "Cores busy during the turns (CPU seconds ÷ wall seconds; the machine has 2): "
        + ", ".join(f"{k} {v:.2f}" for k, v in busy.items())
        + f"; {sum(busy.values()):.2f} in all.",
        "",
    ]
    if "long_turn" in r:
        turns = r["long_turn"]
        rows = [
            [name, at, num(c["step_wall_ms"]), num(c["own_ms"]), num(c["orchestration_ms"])]
            for name, turn in turns.items()
            for at, c in turn["checkpoints"].items()
        ]
        made = ", ".join(
            f"{name} {t['tool_calls']} calls in {t['wall_s']} s, {t['history_kb']} KB of history"
            for name, t in turns.items()
        )
        lines += [
            "**Step cost inside one long turn**: one turn of sequential `get_lead` calls on in-process"
            f" workers, nothing else running ({made}); medians of the {WINDOW} steps before each call"
            " (model call scheduled → next model call scheduled). Countersign's model sees at most 200"
            " messages (the default window); the bare loop sends the whole transcript and keeps it in"
            " workflow history.",
            "",
            *table(
                ["implementation", "at call", "step wall ms", "activities' own ms", "orchestration ms"], rows
            ),
            "",
        ]
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="1,000 conversations, 4 workers, 5 min of turns")
    parser.add_argument("--conversations", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--rate", type=float, help="turns per second")
    parser.add_argument("--duration", type=float, help="seconds of turns")
    parser.add_argument("--long", type=int, help="tool calls in the long turn")
    parser.add_argument("--skip-long", action="store_true", help="only the load")
    parser.add_argument("--users", type=int, help="people: this many users, each writing, reading, thinking")
    parser.add_argument("--think", type=float, default=60.0, help="people: mean think time, seconds")
    parser.add_argument(
        "--find",
        action="store_true",
        help="people: the largest number of users holding reply p95 < 3 s and tool-call p95 < 500 ms,"
        " for 1, 2 and 3 worker processes (or --workers)",
    )
    parser.add_argument("--out", type=Path, help="default: docs/benchmark-load.json (people: -people.json)")
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmark.md"))
    return parser.parse_args(argv)


def main_people(args: argparse.Namespace, given: list[str]) -> None:
    """`--users N --think S` and `--find`: bench/people.py; its own JSON and section."""
    from bench import people  # it builds on this module's turns and workers

    workers = [args.workers] if args.workers else ([1, 2, 3] if args.find else [1])
    duration = args.duration or PEOPLE_DURATION_S
    run = people.measure(args.users, args.think, duration, workers, args.find)
    results = recorded_run("bench.load", given, run)
    out = args.out or Path("docs/benchmark-people.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    put_section(args.markdown, "bench.people", people.render(results))
    progress(f"wrote {out} and {args.markdown}")


def main(argv: list[str] | None = None) -> None:
    given = sys.argv[1:] if argv is None else argv
    args = parse(given)
    if args.users or args.find:
        configure_logging("WARNING")
        main_people(args, given)
        return
    base = FULL if args.full else DEFAULT
    sizes = Sizes(
        conversations=args.conversations or base.conversations,
        workers=args.workers or base.workers,
        rate_per_s=args.rate or base.rate_per_s,
        duration_s=args.duration or base.duration_s,
        long_turn=args.long or base.long_turn,
    )
    configure_logging("WARNING")
    results = recorded_run("bench.load", given, measure(sizes, args.skip_long))
    out = args.out or Path("docs/benchmark-load.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    put_section(args.markdown, "bench.load", render(results))
    progress(f"wrote {out} and {args.markdown}")


if __name__ == "__main__":
    main()
