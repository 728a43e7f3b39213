"""Run the benchmark and write its JSON and markdown.

    .venv/bin/python -m bench.run [--quick] [--out docs/benchmark.json] [--markdown docs/benchmark.md]

Everything runs on parts this script starts itself (free ports, a temporary directory) and stops on
the way out. What each number means is written next to it in the markdown (bench/report.py).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from temporalio.worker import PollerBehaviorAutoscaling

from bench import stack, workloads
from bench.report import render
from bench.scenario import APPROVAL_STATUSES, STEPS_MESSAGE, bench_scenario
from bench.stats import Summary
from countersign.logs import configure as configure_logging

Json = dict[str, Any]
MS = 1000.0


@dataclass(frozen=True)
class Sizes:
    steps: int  # sequential tool calls per step conversation (K)
    conversations: int  # sequential step conversations, workflow and loop each (N)
    approvals: int  # approvals decided with the `decide` update
    signal_approvals: int  # approvals decided with the `approve` signal
    throughput: Mapping[int, int]  # concurrency -> conversations
    waiting: int  # conversations left waiting on approval for the RSS measurement
    lever_conversations: int
    lever_approvals: int
    lever_throughput: Mapping[int, int]


FULL = Sizes(5, 20, 30, 10, {1: 10, 10: 40, 100: 150}, 1000, 8, 8, {100: 60})
QUICK = Sizes(3, 4, 6, 2, {1: 3, 10: 10, 100: 100}, 100, 3, 3, {10: 20})


@dataclass(frozen=True)
class Lever:
    """One thing tried on the worker side: `Worker(...)` options on top of `build_worker`'s, and/or a
    bytecode cache for the workflow sandbox's imports (see `stack.bytecode_cache`)."""

    worker_options: Mapping[str, Any] = field(default_factory=dict)
    bytecode_cache: bool = False


WORKER_LEVERS = {
    "bytecode cache for the sandbox's imports": Lever(bytecode_cache=True),
    "disable_eager_activity_execution=True": Lever({"disable_eager_activity_execution": True}),
    "autoscaling pollers (workflow and activity)": Lever(
        {
            "workflow_task_poller_behavior": PollerBehaviorAutoscaling(),
            "activity_task_poller_behavior": PollerBehaviorAutoscaling(),
        }
    ),
}
RPS_1000 = f"{stack.POLL_RPS_KEY}=1000"


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ms(seconds: list[float]) -> Json:
    return asdict(Summary.of([s * MS for s in seconds]))


# --- metric collectors ---------------------------------------------------------------------------------


async def steps_and_loop(parts: stack.Parts, count: int, with_loop: bool) -> Json:
    """Metrics 1, 5 (per step and per turn) and 6: workflow and loop conversations, interleaved."""
    loop = workloads.InProcessLoop(parts)
    flows: list[workloads.StepsSample] = []
    loops: list[workloads.LoopSample] = []
    for _ in range(count):
        flows.append(await workloads.steps_conversation(parts))
        if with_loop:
            loops.append(await loop.converse(STEPS_MESSAGE))
    all_steps = [s for f in flows for s in f.steps]
    result: Json = {
        "conversations": count,
        "steps": len(all_steps),
        "overhead_ms": ms([s.overhead_s for s in all_steps]),
        "step_wall_ms": ms([s.interval_s for s in all_steps]),
        "step_own_ms": ms([s.own_s for s in all_steps]),
        "conversation_wall_ms": ms([f.wall_s for f in flows]),
        "events_per_step": asdict(Summary.of([float(s.events) for s in all_steps])),
        "events_per_turn": asdict(Summary.of([float(f.events) for f in flows])),
        "tool_calls_per_conversation": flows[0].tool_calls if flows else 0,
    }
    if with_loop:
        result["loop"] = {
            "step_wall_ms": ms([s for sample in loops for s in sample.step_s]),
            "conversation_wall_ms": ms([sample.wall_s for sample in loops]),
        }
    return result


async def approvals(parts: stack.Parts, count: int, via: workloads.Via, statuses: Iterator[str]) -> Json:
    """Metrics 2 and 5 (per approved call): one approval after the other."""
    samples = [await workloads.approval(parts, next(statuses), via) for _ in range(count)]
    return {
        "via": via,
        "approvals": count,
        "to_execution_ms": ms([s.to_execution_s for s in samples]),
        "acknowledged_ms": ms([s.acknowledged_s for s in samples]),
        "events_per_approved_call": asdict(Summary.of([float(s.call_events) for s in samples])),
        "events_per_turn": asdict(Summary.of([float(s.events) for s in samples])),
    }


async def throughputs(parts: stack.Parts, plan: Mapping[int, int]) -> list[Json]:
    """Metric 3: tool calls completed per second of wall time, by concurrency."""
    rows = []
    for concurrency, conversations in plan.items():
        run = await workloads.throughput(parts, concurrency, conversations)
        rows.append({**asdict(run), "tool_calls_per_s": round(run.tool_calls_per_s, 1)})
        progress(f"throughput at {concurrency}: {run.tool_calls_per_s:.1f} tool calls/s")
    return rows


async def worker_rss(parts: stack.Parts, root: Path, count: int) -> Json:
    """Metric 4: RSS of a `python worker.py` subprocess holding `count` conversations awaiting approval."""
    settings = parts.settings.model_copy(update={"task_queue": f"bench-rss-{time.monotonic_ns()}"})
    sub = stack.Parts(parts.client, settings, parts.engine, parts.model)
    async with stack.worker_subprocess(settings, root) as pid:
        process = psutil.Process(pid)
        await asyncio.sleep(2)
        idle = process.memory_info().rss
        began = time.perf_counter()
        await workloads.start_waiting(sub, count)
        settle_s = await workloads.all_awaiting(sub, count, timeout_s=300)
        await asyncio.sleep(2)
        loaded = process.memory_info().rss
    return {
        "conversations": count,
        "idle_rss_mb": round(idle / 2**20, 1),
        "rss_mb": round(loaded / 2**20, 1),
        "per_conversation_kb": round((loaded - idle) / count / 1024, 1),
        "all_awaiting_after_s": round(time.perf_counter() - began, 1),
        "visibility_poll_s": round(settle_s, 1),
    }


# --- runs ------------------------------------------------------------------------------------------------


async def main_run(parts: stack.Parts, sizes: Sizes, root: Path, statuses: Iterator[str]) -> Json:
    async with stack.in_process_worker(parts, {}) as worker:
        progress("metric 1/5/6: sequential step conversations, workflow and in-process loop")
        steps = await steps_and_loop(worker, sizes.conversations, with_loop=True)
        progress("metric 2: approvals")
        by_update = await approvals(worker, sizes.approvals, "update", statuses)
        by_signal = await approvals(worker, sizes.signal_approvals, "signal", statuses)
        progress("metric 3: throughput")
        rates = await throughputs(worker, sizes.throughput)
    progress(f"metric 4: worker subprocess RSS with {sizes.waiting} conversations awaiting approval")
    rss = await worker_rss(parts, root, sizes.waiting)
    return {"steps": steps, "approvals": [by_update, by_signal], "throughput": rates, "rss": rss}


async def lever_run(
    parts: stack.Parts, sizes: Sizes, lever: Lever, root: Path, statuses: Iterator[str]
) -> Json:
    """A smaller sample of metrics 1, 2 and 3 under one lever."""
    with ExitStack() as scope:
        if lever.bytecode_cache:
            scope.enter_context(stack.bytecode_cache(root))
        async with stack.in_process_worker(parts, lever.worker_options) as worker:
            return {
                "steps": await steps_and_loop(worker, sizes.lever_conversations, with_loop=False),
                "approvals": await approvals(worker, sizes.lever_approvals, "update", statuses),
                "throughput": await throughputs(worker, sizes.lever_throughput),
            }


async def on_server(
    root: Path, database_url: str, name: str, dynamic_config: list[str], sizes: Sizes, statuses: Iterator[str]
) -> Json:
    """Every measurement made against one dev server: the main run on the product's settings,
    only the lever sample on the others."""
    scenario = bench_scenario(sizes.steps)
    async with (
        stack.temporal(root, name, dynamic_config) as server,
        stack.parts(database_url, server, scenario) as parts,
    ):
        if name != "rps1000":
            progress(f"lever: dev server {name}")
            return {"server": {name: await lever_run(parts, sizes, Lever(), root, statuses)}}
        result = {"main": await main_run(parts, sizes, root, statuses), "worker": {}}
        progress("lever: product worker, same sample size (the comparison point)")
        result["server"] = {name: await lever_run(parts, sizes, Lever(), root, statuses)}
        for label, lever in WORKER_LEVERS.items():
            progress(f"lever: worker {label}")
            result["worker"][label] = await lever_run(parts, sizes, lever, root, statuses)
        return result


async def benchmark(sizes: Sizes) -> Json:
    statuses = itertools.cycle(APPROVAL_STATUSES)  # Jane starts `new` (seed): every approval changes her
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="countersign-bench-") as tmp:
        root = Path(tmp)
        progress(f"starting PostgreSQL in {root}")
        async with stack.postgres(root) as url:
            product = await on_server(root, url, "rps1000", [RPS_1000], sizes, statuses)
            default = await on_server(root, url, "rps20", [], sizes, statuses)
    product["server"].update(default["server"])
    return {**product, "sizes": asdict(sizes), "duration_s": round(time.perf_counter() - began, 1)}


def machine() -> Json:
    return {
        "cores": psutil.cpu_count(logical=True),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "load_average_at_start": [round(x, 2) for x in psutil.getloadavg()],
    }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a fast check")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmark.json"), help="the JSON results")
    parser.add_argument("--markdown", type=Path, help="the markdown (default: --out with .md)")
    parser.add_argument("--render", action="store_true", help="only rewrite the markdown from --out's JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    markdown = args.markdown or args.out.with_suffix(".md")
    if args.render:
        markdown.write_text(render(json.loads(args.out.read_text())))
        return
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *(sys.argv[1:] if argv is None else argv)])
    configure_logging("WARNING")  # the in-process worker's DEBUG/INFO lines would cost CPU being measured
    host = machine()
    results = {"command": command, "machine": host, **asyncio.run(benchmark(QUICK if args.quick else FULL))}
    host["load_average_at_end"] = [round(x, 2) for x in psutil.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    markdown.write_text(render(results))
    progress(f"wrote {args.out} and {markdown} in {results['duration_s']} s")


if __name__ == "__main__":
    main()
