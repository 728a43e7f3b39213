"""Run the benchmark and write its JSON and markdown.

    .venv/bin/python -m bench.run [--quick] [--out docs/benchmark.json] [--markdown docs/benchmark.md]

Everything runs on parts this script starts itself (free ports, a temporary directory) and stops on
the way out. What each number means is written next to it in the markdown (bench/report.py). The
report is the `bench.run` section of the markdown, first in the file; the other bench modules'
sections (bench/sections.py) are left as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import psutil

from bench import stack, workloads
from bench.report import render
from bench.scenario import APPROVAL_STATUSES, PARALLEL_MESSAGE, STEPS_MESSAGE, bench_scenario
from bench.sections import put_section, run_to_the_end
from bench.stats import Summary
from countersign.devstack.temporal import DYNAMIC_CONFIG, SQLITE_PRAGMAS
from countersign.runtime.config import Settings
from countersign.runtime.logs import configure as configure_logging

Json = dict[str, Any]
MS = 1000.0


@dataclass(frozen=True)
class Sizes:
    steps: int  # sequential tool calls per step conversation (K)
    conversations: int  # sequential step conversations, workflow and loop each (N)
    approvals: int  # approvals decided with the `decide` update
    signal_approvals: int  # approvals decided with the `approve` signal
    throughput: Sequence[Run]  # the throughput runs
    waiting: int  # conversations left waiting on approval for the RSS measurement
    waiting_approvals: int  # of those, approved one by one afterwards (cached, then evicted)
    lever_conversations: int
    lever_approvals: int
    lever_throughput: Run


@dataclass(frozen=True)
class Run:
    """One throughput run: `conversations` of `workload`, at most `concurrency` in flight, on the
    in-process worker (`workers` = 0) or on that many `python worker.py` processes."""

    workload: Workload
    workers: int
    concurrency: int
    conversations: int


Workload = Literal["sequential", "parallel"]
MESSAGES: dict[Workload, str] = {"sequential": STEPS_MESSAGE, "parallel": PARALLEL_MESSAGE}


def runs(workload: Workload, workers: int, plan: Mapping[int, int]) -> list[Run]:
    return [Run(workload, workers, c, n) for c, n in plan.items()]


FULL = Sizes(
    steps=5,
    conversations=20,
    approvals=30,
    signal_approvals=10,
    throughput=[
        *runs("sequential", 0, {1: 10, 10: 40, 100: 150}),
        *runs("sequential", 2, {100: 150}),
        *runs("parallel", 1, {1: 5, 10: 20, 100: 100}),
        *runs("parallel", 2, {100: 100}),
    ],
    waiting=1000,
    waiting_approvals=20,
    lever_conversations=8,
    lever_approvals=8,
    lever_throughput=Run("sequential", 0, 10, 30),
)
QUICK = Sizes(
    steps=3,
    conversations=4,
    approvals=6,
    signal_approvals=2,
    throughput=[*runs("sequential", 0, {1: 3, 10: 10, 100: 40}), *runs("parallel", 2, {100: 30})],
    waiting=100,
    waiting_approvals=5,
    lever_conversations=3,
    lever_approvals=3,
    lever_throughput=Run("sequential", 0, 10, 10),
)
SDK_DEFAULT_CACHE = 1000  # WORKER_MAX_CACHED_WORKFLOWS of the memory lever: what the SDK would keep

EAGER = "system.enableActivityEagerExecution=true"
RPS_1000 = "history.transferProcessorMaxPollRPS=1000"
PRODUCT = "product"
SERVER_LEVERS: dict[str, stack.ServerSetup] = {
    PRODUCT: stack.ServerSetup(),
    "default dev server: no dynamic config, rollback journal": stack.ServerSetup((), ()),
    "without eager activity execution": stack.ServerSetup((RPS_1000,), SQLITE_PRAGMAS),
    "transfer queue polled at the default 20/s": stack.ServerSetup((EAGER,), SQLITE_PRAGMAS),
    "rollback journal instead of WAL": stack.ServerSetup(DYNAMIC_CONFIG, ()),
    "WAL with synchronous=normal (not adopted: a power loss may drop the last commits)": stack.ServerSetup(
        DYNAMIC_CONFIG, (*SQLITE_PRAGMAS, "synchronous=normal")
    ),
    "in memory (reference: nothing persisted)": stack.ServerSetup(in_memory=True),
}
Scope = Callable[[Path], AbstractContextManager[None]]
WORKER_LEVERS: dict[str, Scope] = {
    "regular activities only (tools and bookkeeping as before local activities)": lambda _: (
        stack.remote_activities()
    ),
    "workflow sandbox compiling from source (no bytecode)": stack.compiled_from_source,
    "unsandboxed workflow runner (not adopted: no guard against non-determinism)": lambda _: (
        stack.unsandboxed()
    ),
}


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
    all_parts = [p for f in flows for p in f.parts]
    result: Json = {
        "conversations": count,
        "steps": len(all_steps),
        "overhead_ms": ms([s.overhead_s for s in all_steps]),
        "step_wall_ms": ms([s.interval_s for s in all_steps]),
        "step_own_ms": ms([s.own_s for s in all_steps]),
        "parts_ms": {
            name: ms([getattr(p, f"{name}_s") for p in all_parts])
            for name in ("model_dispatch", "model_report", "task_dispatch", "task_processing")
        },
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


def approval_summary(samples: list[workloads.ApprovalSample]) -> Json:
    return {
        "approvals": len(samples),
        "to_execution_ms": ms([s.to_execution_s for s in samples]),
        "acknowledged_ms": ms([s.acknowledged_s for s in samples]),
        "events_per_approved_call": asdict(Summary.of([float(s.call_events) for s in samples])),
        "events_per_turn": asdict(Summary.of([float(s.events) for s in samples])),
    }


async def approvals(parts: stack.Parts, count: int, via: workloads.Via, statuses: Iterator[str]) -> Json:
    """Metrics 2 and 5 (per approved call): one approval after the other."""
    samples = [await workloads.approval(parts, next(statuses), via) for _ in range(count)]
    return {"via": via, **approval_summary(samples)}


@dataclass
class CpuParts:
    """The processes whose CPU time a throughput run accounts for."""

    server_pid: int
    postgres_pid: int
    worker_pids: list[int] = field(default_factory=list)

    def seconds(self) -> dict[str, float]:
        return {
            "bench process (client, scripted model, in-process worker)": stack.cpu_s(
                os.getpid(), children=False
            ),
            "worker processes": sum(stack.cpu_s(pid) for pid in self.worker_pids),
            "Temporal dev server": stack.cpu_s(self.server_pid),
            "PostgreSQL": stack.cpu_s(self.postgres_pid),
        }


async def throughput(parts: stack.Parts, run: Run, cpu: CpuParts) -> Json:
    """Metric 3: tool calls completed per second of wall time, and CPU per tool call by process."""
    before = cpu.seconds()
    done = await workloads.throughput(parts, run.concurrency, run.conversations, MESSAGES[run.workload])
    after = cpu.seconds()
    per_call = {k: round((after[k] - before[k]) * MS / max(done.tool_calls, 1), 2) for k in after}
    progress(f"throughput {run}: {done.tool_calls_per_s:.1f} tool calls/s")
    return {
        **asdict(run),
        "tool_calls": done.tool_calls,
        "wall_s": round(done.wall_s, 2),
        "tool_calls_per_s": round(done.tool_calls_per_s, 1),
        "cpu_ms_per_tool_call": per_call,
        "cpu_utilisation": round(sum(after[k] - before[k] for k in after) / done.wall_s, 2),
    }


async def throughputs(parts: stack.Parts, plan: Sequence[Run], root: Path, cpu: CpuParts) -> list[Json]:
    rows = []
    for run in plan:
        if run.workers == 0:
            async with stack.in_process_worker(parts, {}) as worker:
                rows.append(await throughput(worker, run, cpu))
            continue
        settings = parts.settings.model_copy(update={"task_queue": f"bench-tp-{time.monotonic_ns()}"})
        sub = stack.Parts(parts.client, settings, parts.engine, parts.model)
        async with stack.worker_subprocesses(settings, root / settings.task_queue, run.workers) as pids:
            rows.append(await throughput(sub, run, replace(cpu, worker_pids=pids)))
    return rows


async def worker_rss(parts: stack.Parts, root: Path, count: int, approve: int, cache: int | None) -> Json:
    """Metric 4: RSS of a `python worker.py` subprocess holding `count` conversations awaiting approval
    (its workflow cache at `cache`, or the default), then `approve` of them approved one by one."""
    settings = parts.settings.model_copy(update={"task_queue": f"bench-rss-{time.monotonic_ns()}"})
    sub = stack.Parts(parts.client, settings, parts.engine, parts.model)
    env = {"WORKER_MAX_CACHED_WORKFLOWS": str(cache)} if cache else {}
    async with stack.worker_subprocesses(settings, root / settings.task_queue, 1, env) as (pid,):
        process = psutil.Process(pid)
        await asyncio.sleep(2)
        idle = process.memory_info().rss
        began = time.perf_counter()
        handles = await workloads.start_waiting(sub, count)
        settle_s = await workloads.all_awaiting(sub, count, timeout_s=300)
        await asyncio.sleep(2)
        loaded = process.memory_info().rss
        # the first conversations started are the ones a small cache pushed out first
        samples = [await workloads.approve(h, workloads.WAITING_CALL_ID, "update") for h in handles[:approve]]
    return {
        "conversations": count,
        "max_cached_workflows": cache or Settings().max_cached_workflows,
        "idle_rss_mb": round(idle / 2**20, 1),
        "rss_mb": round(loaded / 2**20, 1),
        "per_conversation_kb": round((loaded - idle) / count / 1024, 1),
        "all_awaiting_after_s": round(time.perf_counter() - began, 1),
        "visibility_poll_s": round(settle_s, 1),
        "approvals": approval_summary(samples),
    }


# --- runs ------------------------------------------------------------------------------------------------


async def main_run(
    parts: stack.Parts, sizes: Sizes, root: Path, statuses: Iterator[str], cpu: CpuParts
) -> Json:
    async with stack.in_process_worker(parts, {}) as worker:
        progress("metric 1/5/6: sequential step conversations, workflow and in-process loop")
        steps = await steps_and_loop(worker, sizes.conversations, with_loop=True)
        progress("metric 2: approvals")
        by_update = await approvals(worker, sizes.approvals, "update", statuses)
        by_signal = await approvals(worker, sizes.signal_approvals, "signal", statuses)
    progress("metric 3: throughput")
    rates = await throughputs(parts, sizes.throughput, root, cpu)
    progress(f"metric 4: worker subprocess RSS with {sizes.waiting} conversations awaiting approval")
    rss = [
        await worker_rss(parts, root, sizes.waiting, sizes.waiting_approvals, cache)
        for cache in (None, SDK_DEFAULT_CACHE)
    ]
    return {"steps": steps, "approvals": [by_update, by_signal], "throughput": rates, "rss": rss}


async def lever_run(
    parts: stack.Parts, sizes: Sizes, scope: Scope | None, root: Path, statuses: Iterator[str], cpu: CpuParts
) -> Json:
    """A smaller sample of metrics 1, 2 and 3 under one lever."""
    with scope(root) if scope else nullcontext():
        async with stack.in_process_worker(parts, {}) as worker:
            return {
                "steps": await steps_and_loop(worker, sizes.lever_conversations, with_loop=False),
                "approvals": await approvals(worker, sizes.lever_approvals, "update", statuses),
                "throughput": [await throughput(worker, sizes.lever_throughput, cpu)],
            }


async def on_server(root: Path, database_url: str, name: str, sizes: Sizes, statuses: Iterator[str]) -> Json:
    """Every measurement made against one dev server: on the product's, the main run and the
    worker levers; on the others, the lever sample only."""
    scenario = bench_scenario(sizes.steps)
    label = re.sub(r"[^a-z0-9]+", "-", name.lower())[:40]
    async with (
        stack.temporal(root, label, SERVER_LEVERS[name]) as server,
        stack.parts(database_url, server.config, scenario) as parts,
    ):
        cpu = CpuParts(server.pid, stack.postmaster_pid(root))
        progress(f"lever sample: dev server {name}")
        result: Json = {"server": {name: await lever_run(parts, sizes, None, root, statuses, cpu)}}
        if name != PRODUCT:
            return result
        result["main"] = await main_run(parts, sizes, root, statuses, cpu)
        result["worker"] = {}
        for lever, scope in WORKER_LEVERS.items():
            progress(f"lever sample: worker {lever}")
            result["worker"][lever] = await lever_run(parts, sizes, scope, root, statuses, cpu)
        return result


async def benchmark(sizes: Sizes) -> Json:
    statuses = itertools.cycle(APPROVAL_STATUSES)  # Jane starts `new` (seed): every approval changes her
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="countersign-bench-") as tmp:
        root = Path(tmp)
        progress(f"starting PostgreSQL in {root}")
        async with stack.postgres(root) as url:
            results: Json = {"server": {}}
            for name in SERVER_LEVERS:
                found = await on_server(root, url, name, sizes, statuses)
                results["server"].update(found.pop("server"))
                results.update(found)
    return {**results, "sizes": asdict(sizes), "duration_s": round(time.perf_counter() - began, 1)}


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
    parser.add_argument(
        "--render", action="store_true", help="only rewrite the markdown's bench.run section from --out"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    markdown = args.markdown or args.out.with_suffix(".md")
    if args.render:
        put_section(markdown, "bench.run", render(json.loads(args.out.read_text())), first=True)
        return
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *(sys.argv[1:] if argv is None else argv)])
    configure_logging("WARNING")  # the in-process worker's DEBUG/INFO lines would cost CPU being measured
    host = machine()
    results = {
        "command": command,
        "machine": host,
        **run_to_the_end(benchmark(QUICK if args.quick else FULL)),
    }
    host["load_average_at_end"] = [round(x, 2) for x in psutil.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    put_section(markdown, "bench.run", render(results), first=True)
    progress(f"wrote {args.out} and {markdown} in {results['duration_s']} s")


if __name__ == "__main__":
    main()
