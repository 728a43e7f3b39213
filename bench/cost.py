"""The cost of safety (issues 25, 52): Countersign against a minimal loop and two durable peers.

    .venv/bin/python -m bench.cost                   # bounded: about four minutes
    .venv/bin/python -m bench.cost --full            # more conversations and rounds
    .venv/bin/python -m bench.cost --profile worker.svg   # py-spy flame graphs of every worker at c=10
    .venv/bin/python -m bench.cost --check           # a run, then exit 1 if a ratio misses its target
    .venv/bin/python -m bench.cost --render --check  # the same check of the recorded JSON, no run

One interleaved run; every implementation runs against the same dev server, PostgreSQL and
scripted model, started by this script (the peers need the `bench` extra): Countersign, the minimal
loop (bench/plain.py), the OpenAI Agents SDK's Temporal plugin (bench/peer_agents.py), pydantic-ai's
Temporal integration (bench/peer_pydantic.py) and the bare loop (bench/bare.py). **Steps**:
single-turn conversations of K sequential `search_leads` calls, one of each implementation in turn,
on in-process workers whose activities are timed by the same interceptor (bench/clock.py).
**Concurrency 10**: each implementation's worker as its own process (`python worker.py`,
`python -m bench.plain`, ...); rounds alternate a batch of each, in turn and then in reverse, and
each batch reports tool calls per second and the CPU its worker process used per tool call. Every
figure compared is a ratio within the run; the medians over rounds are quoted. The markdown section
is `bench.cost` of docs/benchmark.md.

`--check` is the regression gate (issues 36, 52): it prints each ratio beside its target (TARGETS,
the same table the section shows) and exits non-zero when one is missed: Countersign must be ahead
of both peers on step p50, throughput and worker CPU per tool call, and within 1.3x the minimal
loop's worker CPU. It judges a benchmark run, not a timed unit test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from temporalio.client import Client

from activities.context import ContextActivities
from bench import bare, plain, stack, workloads
from bench.clock import ActivityClock
from bench.history import MODEL_ACTIVITY, TOOL_ACTIVITY
from bench.report import met, num, table
from bench.scenario import STEPS_MESSAGE, bench_scenario
from bench.sections import put_section, recorded_run, write_section
from bench.stats import Summary
from countersign.core.policy import offered_tools
from countersign.db.engine import session_factory
from countersign.db.ratelimit import UNLIMITED_ENV
from countersign.devstack.worker import WorkerProcess
from countersign.runtime.config import PROJECT_ROOT
from countersign.runtime.logs import configure as configure_logging

Json = dict[str, Any]
SPY = Path(sys.executable).with_name("py-spy")  # the profiler, beside this Python
MS = 1000.0
COUNTERSIGN, BARE, MINIMAL = "Countersign", "bare loop", "minimal loop"
AGENTS, PYDANTIC = "OpenAI Agents SDK", "pydantic-ai"  # the durable peers, each with its Temporal plugin
DEFAULT_OUT = Path("docs/benchmark-cost.json")
TARGET_ORCHESTRATION_MS = 10.0  # the long goal: shown in the section, not gated (not a ratio)


@dataclass(frozen=True)
class Target:
    """A bound on one of `ratios()`: Countersign's figure over another implementation's in the same
    run."""

    ratio: str  # key of ratios(): figure:implementation
    label: str
    bound: float
    at_most: bool  # True: the ratio may not exceed the bound; False: it may not fall below it
    strict: bool = False  # True: not equal to it either (ahead, not level)

    def met(self, value: float) -> bool:
        if self.strict and value == self.bound:
            return False
        return value <= self.bound if self.at_most else value >= self.bound

    def wanted(self) -> str:
        sign = ("<" if self.at_most else ">") if self.strict else ("≤" if self.at_most else "≥")
        return f"{sign} {self.bound} x"


TARGETS = (
    # ahead of both durable peers on all three figures (issue 52)
    *(
        Target(f"{figure}:{peer}", f"{label} vs {peer}", 1.0, at_most=at_most, strict=True)
        for peer in (AGENTS, PYDANTIC)
        for figure, label, at_most in (
            ("step_wall", "step wall p50", True),
            ("tool_calls_per_s", "tool calls/s at c=10", False),
            ("worker_cpu", "worker CPU per tool call", True),
        )
    ),
    # and as light per call as the minimal loop, within 30 %
    Target(f"worker_cpu:{MINIMAL}", f"worker CPU per tool call vs {MINIMAL}", 1.3, at_most=True),
)


@dataclass(frozen=True)
class Sizes:
    steps: int  # sequential tool calls per conversation (K)
    conversations: int  # step conversations of each implementation, interleaved
    rounds: int  # c=10 batches of each implementation, alternated
    batch: int  # conversations per batch
    concurrency: int = 10


DEFAULT = Sizes(steps=5, conversations=20, rounds=3, batch=30)
FULL = Sizes(steps=5, conversations=60, rounds=7, batch=50)


def progress(message: str) -> None:
    print(f"[bench.cost {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the implementations ---------------------------------------------------------------------------


Converse = Callable[[str], Awaitable[tuple[Any, int]]]


@dataclass
class Side:
    """One implementation as the workloads drive it: run a steps conversation (its handle and tool
    calls) on a task queue; its worker in this process (`build`) or as its own (`python -m module`);
    the names of its model call's and tool call's activities in the history."""

    name: str
    converse: Converse
    module: str | None = None  # None: `python worker.py`
    build: bare.WorkerBuilder | None = None  # None: worker.build_worker, as stack.in_process_worker
    names: tuple[str, str] = (MODEL_ACTIVITY, TOOL_ACTIVITY)


def countersign_side(parts: stack.Parts) -> Side:
    async def converse(task_queue: str) -> tuple[Any, int]:
        sub = stack.Parts(
            parts.client,
            parts.settings.model_copy(update={"task_queue": task_queue}),
            parts.engine,
            parts.model,
        )
        handle = await workloads.start(sub, STEPS_MESSAGE)
        return handle, (await handle.result()).usage.tool_calls

    return Side(COUNTERSIGN, converse)


async def bare_start(parts: stack.Parts, message: str, max_calls: int = 0) -> bare.BareStart:
    """The bare loop's conversation of `message`, offered what the same agent offers, with its
    system prompt."""
    start = workloads.conversation(message)
    context = await ContextActivities(session_factory(parts.engine)).load_conversation_context(start)
    offered = [t.openai_tool() for t in offered_tools(context.tools)]
    return bare.BareStart(
        start.tenant_id, start.user_id, context.agent.system_prompt, message, offered, max_calls
    )


async def idle(task_queue: str) -> tuple[Any, int]:
    """The converse of a side only given a worker (its conversations are started elsewhere)."""
    raise NotImplementedError(f"no conversation to start on {task_queue}")


def started(client: Client, workflow: str, start: Any, prefix: str) -> Converse:
    """A converse of a loop whose workflow `workflow` returns its number of tool calls."""

    async def converse(task_queue: str) -> tuple[Any, int]:
        handle = await client.start_workflow(
            workflow, start, id=f"{prefix}-{uuid.uuid4()}", task_queue=task_queue, result_type=int
        )
        return handle, await handle.result()

    return converse


async def sides_of(parts: stack.Parts) -> list[Side]:
    """Countersign, the minimal loop, the two peers and the bare loop, in that order. The minimal
    loop and the peers offer the agent's system prompt and bench.plain's `search_leads` definition;
    Countersign and the bare loop offer everything the agent offers, as the product does."""
    try:
        from bench import peer_agents, peer_pydantic
    except ImportError as missing:
        raise SystemExit(f"bench.cost needs the bench extra (pip install -e '.[bench]'): {missing}") from None
    offered = await bare_start(parts, STEPS_MESSAGE)
    client = bare.bare_client(parts.client)
    peer = plain.PeerStart(offered.system_prompt, STEPS_MESSAGE, parts.settings.llm_model)
    minimal = replace(offered, tools=[plain.SEARCH_TOOL])
    agents = bare.bare_client(parts.client, peer_agents.client_plugins(parts.settings))
    pydantic = bare.bare_client(parts.client, peer_pydantic.client_plugins(parts.settings))
    return [
        countersign_side(parts),
        Side(MINIMAL, started(client, bare.WORKFLOW, minimal, "minimal"), "bench.plain", plain.build_worker),
        Side(
            AGENTS,
            started(agents, peer_agents.WORKFLOW, peer, "agents"),
            "bench.peer_agents",
            peer_agents.build_worker,
            peer_agents.ACTIVITIES,
        ),
        Side(
            PYDANTIC,
            started(pydantic, peer_pydantic.WORKFLOW, peer, "pydantic"),
            "bench.peer_pydantic",
            peer_pydantic.build_worker,
            peer_pydantic.ACTIVITIES,
        ),
        Side(BARE, started(client, bare.WORKFLOW, offered, "bare"), "bench.bare", bare.build_worker),
    ]


# --- steps, in-process workers ---------------------------------------------------------------------


@asynccontextmanager
async def in_process(
    parts: stack.Parts, sides: Sequence[Side]
) -> AsyncIterator[dict[str, tuple[str, ActivityClock]]]:
    """Every side's worker in this process, each on a fresh task queue with its activities timed."""
    engine = create_async_engine(parts.settings.database_url or "")
    found: dict[str, tuple[str, ActivityClock]] = {}
    try:
        async with AsyncExitStack() as scope:
            for side in sides:
                if side.build is None:
                    product = await scope.enter_async_context(stack.in_process_worker(parts, {}))
                    found[side.name] = (product.settings.task_queue, product.clock)
                    continue
                queue, clock = f"bench-{side.name.split()[0].lower()}-{time.monotonic_ns()}", ActivityClock()
                settings = parts.settings.model_copy(update={"task_queue": queue})
                worker = side.build(parts.client, settings, async_sessionmaker(engine), [clock])
                await scope.enter_async_context(worker)
                found[side.name] = (queue, clock)
            yield found
    finally:
        await engine.dispose()


def step_summary(samples: list[workloads.StepsSample]) -> Json:
    all_steps = [s for sample in samples for s in sample.steps]
    wall = Summary.of([s.interval_s * MS for s in all_steps])
    own = Summary.of([s.own_s * MS for s in all_steps])
    orchestration = Summary.of([s.overhead_s * MS for s in all_steps])
    return {
        "steps": len(all_steps),
        "step_wall_ms": asdict(wall),
        "own_ms": asdict(own),
        "orchestration_ms": asdict(orchestration),
        "events_per_step": statistics.mean(s.events for s in all_steps) if all_steps else 0,
    }


async def steps(parts: stack.Parts, sides: list[Side], count: int) -> Json:
    samples: dict[str, list[workloads.StepsSample]] = {side.name: [] for side in sides}
    async with in_process(parts, sides) as queues:
        for _ in range(count):
            for side in sides:  # interleaved: one of each, in turn
                queue, clock = queues[side.name]
                began = time.perf_counter()
                handle, calls = await side.converse(queue)
                wall = time.perf_counter() - began
                sample = await workloads.steps_sample(handle, clock, wall, calls, side.names)
                samples[side.name].append(sample)
    return {name: step_summary(found) for name, found in samples.items()}


# --- concurrency 10, worker processes --------------------------------------------------------------


# What `--without` can switch off in the Countersign worker process (bench/without/sitecustomize.py;
# `stream` is the LLM_STREAM setting): each is a guarantee, so a run without one is a measurement of
# what it costs, never a configuration.
WITHOUT = ("sandbox", "chain", "events", "access", "savepoint", "stream")
WITHOUT_PATH = PROJECT_ROOT / "bench" / "without"


def without_env(without: Sequence[str]) -> dict[str, str]:
    """The Countersign worker's environment for a run `--without` these guarantees."""
    if not without:
        return {}
    path = os.pathsep.join(p for p in (str(WITHOUT_PATH), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "COUNTERSIGN_BENCH_WITHOUT": ",".join(without)}
    return env | ({"LLM_STREAM": "false"} if "stream" in without else {})


@asynccontextmanager
async def worker_processes(
    parts: stack.Parts, root: Path, sides: Sequence[Side], without: Sequence[str] = ()
) -> AsyncIterator[dict[str, tuple[str, int]]]:
    """One worker process of each implementation, each on its own task queue: (queue, pid)."""
    found: dict[str, tuple[str, int]] = {}
    async with AsyncExitStack() as scope:
        for side in sides:
            queue = f"bench-cost-{side.name.split()[0].lower()}-{time.monotonic_ns()}"
            settings = parts.settings.model_copy(update={"task_queue": queue})
            if side.module is None:
                process = WorkerProcess(settings, root / queue, UNLIMITED_ENV | without_env(without))
            else:
                process = WorkerProcess(settings, root / queue, UNLIMITED_ENV, program=("-m", side.module))
            scope.callback(process.stop)
            found[side.name] = (queue, await process.start())
        yield found


@contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy sampling `pid` for the block: a flame graph (.svg) or collapsed stacks (other)."""
    if out is None:
        yield
        return
    form = "flamegraph" if out.suffix == ".svg" else "raw"
    # --gil: only the thread holding the GIL, so a thread waiting for it is not counted where it waits
    command = [
        str(SPY),
        "record",
        "--pid",
        str(pid),
        "--gil",
        "--rate",
        "200",
        "--format",
        form,
        "-o",
        str(out),
    ]
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached before the load starts
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        _, err = recorder.communicate(timeout=120)
        if recorder.returncode:
            progress(f"py-spy: {err.decode(errors='replace').strip()[-500:]}")


CONVERSATION_TIMEOUT_S = 120.0
STATS_FLUSH_S = 1.5  # a backend reports its counts to pg_stat_database at most once a second


async def transactions(engine: AsyncEngine) -> int:
    """PostgreSQL's count of transactions in the database so far (this query's own included)."""
    query = text(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    )
    async with engine.connect() as connection:
        return int((await connection.execute(query)).scalar_one())


async def batch(
    side: Side, queue: str, pids: dict[str, int], concurrency: int, count: int, engine: AsyncEngine
) -> Json:
    before = {k: stack.cpu_s(pid) for k, pid in pids.items()}
    xacts = await transactions(engine)

    async def one() -> int:
        async with asyncio.timeout(CONVERSATION_TIMEOUT_S):  # a stuck loop fails the run, not hangs it
            return (await side.converse(queue))[1]

    done = await workloads.throughput_of(one, concurrency, count)
    used = {k: stack.cpu_s(pid) - before[k] for k, pid in pids.items()}
    await asyncio.sleep(STATS_FLUSH_S)
    calls = max(done.tool_calls, 1)
    return {
        "tool_calls": done.tool_calls,
        "wall_s": round(done.wall_s, 3),
        "tool_calls_per_s": round(done.tool_calls_per_s, 2),
        "cpu_ms_per_tool_call": {k: round(v * MS / calls, 2) for k, v in used.items()},
        # the first query's transaction is counted by the second
        "transactions_per_tool_call": round((await transactions(engine) - xacts - 1) / calls, 2),
    }


async def concurrent(
    parts: stack.Parts,
    sides: list[Side],
    sizes: Sizes,
    root: Path,
    others: dict[str, int],
    profile: Path | None,
    without: Sequence[str] = (),
) -> Json:
    rows: dict[str, list[Json]] = {side.name: [] for side in sides}
    async with worker_processes(parts, root, sides, without) as workers:
        for side in sides:  # warm-up: imports, connection pools, sandbox caches
            await batch(side, workers[side.name][0], {}, sizes.concurrency, sizes.concurrency, parts.engine)
        for round_ in range(sizes.rounds):
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                queue, pid = workers[side.name]
                pids = {"worker": pid, **others}
                out = profile.with_stem(f"{profile.stem}-{side.name.split()[0].lower()}") if profile else None
                with profiled(pid, out if round_ == 0 else None):
                    row = await batch(side, queue, pids, sizes.concurrency, sizes.batch, parts.engine)
                progress(f"round {round_ + 1} {side.name}: {row['tool_calls_per_s']} tool calls/s")
                rows[side.name].append(row)
    return {name: {"batches": found, **medians(found)} for name, found in rows.items()}


def medians(batches: list[Json]) -> Json:
    parts = batches[0]["cpu_ms_per_tool_call"]
    return {
        "tool_calls_per_s": statistics.median(b["tool_calls_per_s"] for b in batches),
        "transactions_per_tool_call": statistics.median(b["transactions_per_tool_call"] for b in batches),
        "cpu_ms_per_tool_call": {
            k: statistics.median(b["cpu_ms_per_tool_call"][k] for b in batches) for k in parts
        },
    }


# --- the run ---------------------------------------------------------------------------------------


async def measure(sizes: Sizes, profile: Path | None, without: Sequence[str] = ()) -> Json:
    began = time.perf_counter()
    progress("starting PostgreSQL and the dev server")
    async with stack.started("cost", bench_scenario(sizes.steps)) as (root, server, parts):
        sides = await sides_of(parts)
        progress(f"steps: {sizes.conversations} conversations of each, interleaved")
        stepped = await steps(parts, sides, sizes.conversations)
        progress(f"concurrency {sizes.concurrency}: {sizes.rounds} rounds of {sizes.batch} conversations")
        others = {"Temporal dev server": server.pid, "PostgreSQL": stack.postmaster_pid(root)}
        rates = await concurrent(parts, sides, sizes, root, others, profile, without)
    return {
        "without": list(without),
        "steps": stepped,
        "concurrent": rates,
        "sizes": asdict(sizes),
        "duration_s": round(time.perf_counter() - began, 1),
    }


def figures(r: Json, name: str) -> dict[str, float]:
    """One implementation's three compared figures in a run."""
    stepped, rates = r["steps"][name], r["concurrent"][name]
    return {
        "step_wall": stepped["step_wall_ms"]["p50"],
        "worker_cpu": rates["cpu_ms_per_tool_call"]["worker"],
        "tool_calls_per_s": rates["tool_calls_per_s"],
    }


def ratios(r: Json) -> Json:
    """Countersign's figures over each other implementation's in the same run: `figure:name`."""
    ours = figures(r, COUNTERSIGN)
    found: Json = {}
    for name in r["steps"]:
        if name != COUNTERSIGN:
            theirs = figures(r, name)
            found |= {f"{figure}:{name}": ours[figure] / theirs[figure] for figure in ours}
    return found


def render(r: Json) -> str:
    sizes, host = r["sizes"], r["machine"]
    q = ratios(r)
    rows = []
    for name in r["steps"]:
        s, c = r["steps"][name], r["concurrent"][name]
        against = (
            ""
            if name == COUNTERSIGN
            else " / ".join(
                f"{q[f'{f}:{name}']:.2f}" for f in ("step_wall", "tool_calls_per_s", "worker_cpu")
            )
        )
        rows.append(
            [name, num(s["step_wall_ms"]["p50"]), num(s["own_ms"]["p50"]), num(s["orchestration_ms"]["p50"]),
             num(s["events_per_step"]), num(c["tool_calls_per_s"]), num(c["cpu_ms_per_tool_call"]["worker"]),
             against]
        )  # fmt: skip
    orchestration = r["steps"][COUNTERSIGN]["orchestration_ms"]["p50"]
    targets = [
        [t.label, t.wanted(), f"{q[t.ratio]:.2f} x", met(t.met(q[t.ratio]))] for t in TARGETS
    ] + [
        ["orchestration per step (long goal)", f"≤ {TARGET_ORCHESTRATION_MS:g} ms",
         f"{num(orchestration)} ms",
         met(orchestration <= TARGET_ORCHESTRATION_MS)],
    ]  # fmt: skip
    shared = ("Temporal dev server", "PostgreSQL")
    other = [
        [name, *(num(r["concurrent"][name]["cpu_ms_per_tool_call"][k]) for k in shared),
         num(r["concurrent"][name].get("transactions_per_tool_call"))]
        for name in r["concurrent"]
    ]  # fmt: skip
    lines = [
        "## The cost of safety: Countersign against a minimal loop and two durable peers"
        " (`python -m bench.cost`)",
        "",
        f"Produced by `{r['command']}` ({r['duration_s']} s). Load average {host['load_average_at_start']} at"
        f" the start, {host['load_average_at_end']} at the end (2 cores shared with other engineers' test"
        " runs): compare the ratios, not the absolute times.",
        "",
        "Every implementation runs against the same dev server, PostgreSQL and scripted model (the `openai`"
        " client over HTTP): the minimal loop (bench/plain.py: bench.bare's workflow, the tool a plain SQL"
        " SELECT, nothing of ours in its activities), the OpenAI Agents SDK with its Temporal plugin"
        " (bench/peer_agents.py) and pydantic-ai's Temporal integration (bench/peer_pydantic.py) offer the"
        " agent's system prompt and Countersign's `search_leads` schema; Countersign and the bare loop"
        " (bench/bare.py: our tool code in its activity) offer everything the agent offers.",
        "",
        f"Steps: {sizes['conversations']} conversations of each of {sizes['steps']} sequential `search_leads`"
        " calls, interleaved, on in-process workers; p50 over their steps (model call scheduled → next model"
        " call scheduled). Own time: the model call's and the tool's activity functions (bench/clock.py);"
        f" orchestration: the rest. Concurrency {sizes['concurrency']}: {sizes['rounds']} rounds of"
        f" {sizes['batch']} conversations of each, alternated, each implementation's worker in its own"
        " process; medians over the rounds. Countersign over the row's implementation: step / throughput /"
        " worker CPU.",
        "",
        *table(
            [
                "implementation",
                "step wall p50 ms",
                "of which activities' own time",
                "orchestration",
                "history events per step",
                f"tool calls/s at c={sizes['concurrency']}",
                "worker CPU ms per tool call",
                "Countersign ÷ this",
            ],
            rows,
        ),
        "",
        *table(["target (`--check`)", "", "measured", ""], targets),
        "",
        "CPU per tool call of the shared parts in the same batches (ms), and PostgreSQL's transactions"
        " per tool call (`pg_stat_database`; a statement outside a transaction counts as one):",
        "",
        *table(["implementation", "Temporal dev server CPU", "PostgreSQL CPU", "transactions"], other),
        "",
    ]
    return "\n".join(lines)


def missed(q: dict[str, float]) -> list[Target]:
    """The targets that the ratios `q` miss, in TARGETS' order."""
    return [t for t in TARGETS if not t.met(q[t.ratio])]


def verdict(q: dict[str, float]) -> str:
    """What `--check` prints: each ratio beside its target, then which failed."""
    failed = missed(q)
    width = max(len(t.label) for t in TARGETS)
    lines = [
        f"{t.label:<{width}}  {q[t.ratio]:.3f} x  target {t.wanted()}  {'FAILED' if t in failed else 'ok'}"
        for t in TARGETS
    ]
    if failed:
        lines.append(f"bench.cost --check: failed: {', '.join(t.label for t in failed)}")
    else:
        lines.append("bench.cost --check: every ratio within its target")
    return "\n".join(lines)


def check(results: Json) -> int:
    """Print the verdict on a run's results; the exit status: 1 when a target is missed."""
    q = ratios(results)
    print(verdict(q))
    return 1 if missed(q) else 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="more conversations and rounds (about 6 minutes)")
    parser.add_argument("--rounds", type=int, help="c=10 rounds of each implementation")
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy of each worker's first batch: PATH-countersign.svg and PATH-bare.svg (.svg: flame"
        " graphs; another suffix: collapsed stacks)",
    )
    parser.add_argument(
        "--without",
        type=lambda text: [w.strip() for w in text.split(",") if w.strip()],
        default=[],
        help=f"switch these guarantees off in the Countersign worker process, to measure what they cost"
        f" (comma-separated: {', '.join(WITHOUT)}); only the c=10 figures change, the markdown is"
        " only printed, and the JSON written only with --out",
    )
    parser.add_argument("--out", type=Path, help="default: docs/benchmark-cost.json (none with --without)")
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmark.md"))
    parser.add_argument("--no-markdown", action="store_true", help="only the JSON (and print the section)")
    parser.add_argument("--render", action="store_true", help="only rewrite the markdown section from --out")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a ratio misses its target (of this run, or with --render of the recorded --out)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run (or with --render, re-render) and return the exit status: non-zero only when --check
    finds a target missed."""
    given = sys.argv[1:] if argv is None else argv
    args = parse(given)
    unknown = sorted(set(args.without) - set(WITHOUT))
    if unknown:
        raise SystemExit(
            f"--without: no guarantee named {', '.join(unknown)} (there are: {', '.join(WITHOUT)})"
        )
    if args.render:
        recorded = json.loads((args.out or DEFAULT_OUT).read_text())
        put_section(args.markdown, "bench.cost", render(recorded))
        return check(recorded) if args.check else 0
    if args.profile and not SPY.exists():  # before minutes of measuring, not after
        raise SystemExit(
            f"--profile needs py-spy (from PyPI): {Path(sys.executable).with_name('pip')} install py-spy"
        )
    sizes = FULL if args.full else DEFAULT
    if args.rounds:
        sizes = Sizes(sizes.steps, sizes.conversations, args.rounds, sizes.batch, sizes.concurrency)
    out = args.out or (None if args.without else DEFAULT_OUT)  # a run --without is no record
    configure_logging("WARNING")
    results = recorded_run("bench.cost", given, measure(sizes, args.profile, args.without))
    results["ratios"] = ratios(results)
    if out is not None:
        out.write_text(json.dumps(results, indent=2) + "\n")
    text = render(results)
    write_section(args.markdown, "bench.cost", text, only_print=args.no_markdown or bool(args.without))
    progress(f"ratios: {json.dumps({k: round(v, 2) for k, v in results['ratios'].items()})}")
    return check(results) if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
