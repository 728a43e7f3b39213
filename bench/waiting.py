"""Waiting at scale (issue 36): conversations waiting for a reviewer on one worker, then worker scale-out.

    .venv/bin/python -m bench.waiting                      # small (CI-sized): 200 waiting, 1..3 workers
    .venv/bin/python -m bench.waiting --waiting 10000      # the issue's size
    .venv/bin/python -m bench.waiting --skip-scale-out     # only the waiting part (or --skip-waiting)

**Waiting**: one `python worker.py` process (the product's workflow cache) and N single-turn
conversations that each stop on an `update_lead_status` approval nobody decides. Measured: the
worker's RSS idle and once visibility counts all N `awaiting_approval`; the reviewer's inbox: the
page it shows (`Inbox.pending_for` with the page's limit, as the inbox page's events stream and
`GET /api/approvals?limit=` read it: only the page's conversations asked of Temporal, the rest
counted), and beside it the full list of all N (`GET /api/approvals` without a limit), each cold (a
new server process: each conversation listed is asked of Temporal and its last messages read) and
warm (the same process again within its cache's lifetime); then approval → execution of a few of them spread
over the start order (the first started are the first the workflow cache pushed out, so their
decision replays their history), one at a time, while the others go on waiting.

**Scale-out**: 1, 2, … `--workers` `python worker.py` processes on one task queue, the five-step
`search_leads` conversation of bench.cost at concurrency `--concurrency`; tool calls per second and
the cores each part kept busy (CPU seconds ÷ wall seconds): the worker processes, the Temporal dev
server, PostgreSQL and this process (client and scripted model). The part whose cores stop growing
while it stays near a full core is the one that saturates (`saturated`). The markdown section is
`bench.waiting` of docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select, update

from bench import stack, workloads
from bench.report import met, num, rss_at, table
from bench.scenario import JOHN, STEPS_MESSAGE, bench_scenario
from bench.sections import recorded_run, write_section
from bench.stats import Summary
from countersign.db.engine import session_factory
from countersign.db.schema import Lead
from countersign.runtime.config import Settings
from countersign.runtime.logs import configure as configure_logging
from countersign.server.auth import Reviewer
from countersign.server.inbox import FIRST_PAGE, Inbox
from tests.fixtures.smtp import SmtpServer

Json = dict[str, Any]
MB = 2**20
MS = 1000.0
TARGET_RSS_MB = 1024.0  # at 10,000 waiting
TARGET_INBOX_MS = 300.0
TARGET_APPROVAL_P95_MS = 100.0
ISSUE_WAITING = 10_000
STALLED_S = 60.0  # no conversation newly waiting for this long: the rest are not coming
SATURATED_CORES = 0.85  # a single-threaded process this busy has no headroom left
STEPS = 5
WORKER, SERVER, POSTGRES = "worker processes", "Temporal dev server", "PostgreSQL"
BENCH = "bench process (client, scripted model)"


@dataclass(frozen=True)
class Sizes:
    waiting: int = 200
    approvals: int = 20
    workers: int = 3  # the scale-out goes 1..workers
    concurrency: int = 30
    batch: int = 60  # conversations per scale-out batch (five tool calls each)
    wave: int = 200  # waiting conversations on their way at once (under the workflow cache's 250)


def progress(message: str) -> None:
    print(f"[bench.waiting {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def spread(items: Sequence[Any], count: int) -> list[Any]:
    """`count` items evenly spaced over `items`, the first and the last included (all, if fewer)."""
    if count >= len(items):
        return list(items)
    if count == 1:
        return [items[0]]
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]


def saturated(rows: list[Json]) -> str:
    """Which shared part limits the scale-out `rows` (one per worker count, in order): the dev server,
    PostgreSQL, or this bench's own process (the client and the scripted model: one Python thread)
    when one of them is near a full core at the largest count; else the machine's cores when all the
    parts together keep them busy; else none."""
    last = rows[-1]
    busy = last["cores_busy"]
    for part in (SERVER, POSTGRES, BENCH):
        if busy[part] >= SATURATED_CORES:
            return f"the {part} ({busy[part]:.2f} cores at {last['workers']} workers)"
    total = sum(busy.values())
    if total >= SATURATED_CORES * last["machine_cores"]:
        return (
            f"the machine's {last['machine_cores']} cores ({total:.2f} busy with this bench's parts at"
            f" {last['workers']} workers, before the {SERVER} or {POSTGRES} reached a core)"
        )
    return "none of the parts"


# --- waiting -----------------------------------------------------------------------------------------


async def inbox_listing(parts: stack.Parts, expected: int) -> Json:
    """The reviewer's first page (what the inbox shows) and, for comparison, the full list: each cold
    (a new Inbox: nothing known of any conversation) and warm."""
    reviewer = Reviewer(tenant_id=workloads.TENANT, user_id=workloads.APPROVER)
    timed: Json = {"items": expected, "page": min(FIRST_PAGE, expected)}
    for listing, limit in (("page", FIRST_PAGE), ("full", None)):
        inbox = Inbox(parts.client, session_factory(parts.engine), Ed25519PrivateKey.generate())
        for kind in ("cold", "warm"):
            began = time.perf_counter()
            page = await inbox.pending_for(reviewer, limit)
            timed[f"{listing}_{kind}_ms"] = round((time.perf_counter() - began) * MS, 1)
            if len(page.items) + page.more < expected:
                raise RuntimeError(
                    f"the inbox counted {len(page.items) + page.more} of {expected} waiting calls"
                )
    return timed


async def settled(parts: stack.Parts, count: int) -> set[str]:
    """The ids of the task queue's conversations that await approval (visibility's view), once all
    `count` do or their number has not grown for STALLED_S (a straggler is reported, not waited for)."""
    query = f'TaskQueue="{parts.settings.task_queue}" AND AgentStatus="awaiting_approval"'
    await workloads.until_awaiting(parts, count, STALLED_S, poll_s=1.0)
    return {w.id async for w in parts.client.list_workflows(query)}


async def waiting(parts: stack.Parts, root: Path, count: int, approvals: int, wave: int) -> Json:
    john = (Lead.tenant_id == workloads.TENANT, Lead.email == JOHN)
    lead_status = select(Lead.status).where(*john)
    settings = parts.settings.model_copy(update={"task_queue": f"bench-waiting-{time.monotonic_ns()}"})
    sub = stack.Parts(parts.client, settings, parts.engine, parts.model)
    async with stack.worker_subprocesses(settings, root / settings.task_queue) as (pid,):
        process = psutil.Process(pid)
        await asyncio.sleep(2)
        idle = process.memory_info().rss
        began = time.perf_counter()
        handles = await workloads.start_waiting(sub, count, wave=wave, stalled_s=STALLED_S)
        started_s = time.perf_counter() - began
        progress(f"{count} started in waves of {wave} in {started_s:.0f} s; waiting for the last")
        awaiting = await settled(sub, count)
        settled_s = time.perf_counter() - began
        await asyncio.sleep(2)
        loaded = process.memory_info().rss
        progress(
            f"{len(awaiting)} await approval after {settled_s:.0f} s; RSS {loaded / MB:.0f} MB; the inbox"
        )
        listing = await inbox_listing(parts, len(awaiting))
        progress(
            f"inbox page: cold {listing['page_cold_ms']} ms, warm {listing['page_warm_ms']} ms; full list:"
            f" cold {listing['full_cold_ms']} ms, warm {listing['full_warm_ms']} ms; approvals"
        )
        samples = []
        async with parts.engine.begin() as connection:
            status = (await connection.execute(lead_status)).scalar_one()
        for handle in spread([h for h in handles if h.id in awaiting], approvals):
            # every waiting call would change the same lead: put it back as the requests saw it, or
            # each approval after the first would be voided as an effect changed (issue 34)
            async with parts.engine.begin() as connection:
                await connection.execute(update(Lead).where(*john).values(status=status))
            samples.append(await workloads.approve(handle, workloads.WAITING_CALL_ID, "update"))
        after = process.memory_info().rss
    return {
        "conversations": count,
        "awaiting": len(awaiting),
        "max_cached_workflows": Settings().max_cached_workflows,
        "idle_rss_mb": round(idle / MB, 1),
        "rss_mb": round(loaded / MB, 1),
        "rss_after_approvals_mb": round(after / MB, 1),
        "wave": wave,
        "started_s": round(started_s, 1),
        "all_awaiting_after_s": round(settled_s, 1),
        "inbox": listing,
        "approval_to_execution_ms": asdict(Summary.of([s.to_execution_s * MS for s in samples])),
    }


# --- scale-out ---------------------------------------------------------------------------------------


def part_cpu_s(part: str, pid: int) -> float:
    """CPU seconds of one part of the scale-out: a process with its descendants (PostgreSQL's
    backends), except the bench process itself, whose descendants are the other parts (the worker
    processes, the dev server, PostgreSQL): counted with them, it read as the part that saturated."""
    return stack.cpu_s(pid, children=part != BENCH)


async def scale_out(
    parts: stack.Parts, root: Path, workers: int, sizes: Sizes, others: dict[str, int]
) -> Json:
    """`workers` worker processes on one fresh task queue: a warm-up batch, then one measured batch."""
    queue = f"bench-scale-{workers}-{time.monotonic_ns()}"
    settings = parts.settings.model_copy(update={"task_queue": queue})
    sub = stack.Parts(parts.client, settings, parts.engine, parts.model)
    async with stack.worker_subprocesses(settings, root / settings.task_queue, workers) as pids:
        await workloads.throughput(sub, sizes.concurrency, sizes.concurrency, STEPS_MESSAGE)
        processes = {WORKER: pids, **{k: [pid] for k, pid in others.items()}}
        before = {k: sum(part_cpu_s(k, p) for p in ps) for k, ps in processes.items()}
        done = await workloads.throughput(sub, sizes.concurrency, sizes.batch, STEPS_MESSAGE)
        used = {k: sum(part_cpu_s(k, p) for p in ps) - before[k] for k, ps in processes.items()}
    return {
        "workers": workers,
        "concurrency": sizes.concurrency,
        "tool_calls": done.tool_calls,
        "wall_s": round(done.wall_s, 2),
        "tool_calls_per_s": round(done.tool_calls_per_s, 1),
        "cores_busy": {k: round(v / done.wall_s, 2) for k, v in used.items()},
        "machine_cores": psutil.cpu_count() or 1,
    }


# --- the run -----------------------------------------------------------------------------------------


async def measure(sizes: Sizes, do_waiting: bool, do_scale: bool) -> Json:
    began = time.perf_counter()
    # the reviewers' notices of every waiting call go here: without a mail server they would retry
    # (and a decided conversation wait for its notices) instead of being delivered
    mail = SmtpServer(host="127.0.0.1", port=stack.bench_port())
    mail.start()
    try:
        results = await measure_with(sizes, do_waiting, do_scale, mail)
    finally:
        mail.stop()
    results["duration_s"] = round(time.perf_counter() - began, 1)
    return results


async def measure_with(sizes: Sizes, do_waiting: bool, do_scale: bool, mail: SmtpServer) -> Json:
    results: Json = {"sizes": asdict(sizes)}
    progress("starting PostgreSQL and the dev server")
    async with stack.started("waiting", bench_scenario(STEPS)) as (root, server, base):
        mailed = base.settings.model_copy(update={"smtp_host": mail.host, "smtp_port": mail.port})
        parts = stack.Parts(base.client, mailed, base.engine, base.model)
        if do_scale:
            others = {SERVER: server.pid, POSTGRES: stack.postmaster_pid(root), BENCH: os.getpid()}
            rows = []
            for n in range(1, sizes.workers + 1):
                rows.append(await scale_out(parts, root, n, sizes, others))
                progress(f"{n} worker(s): {rows[-1]['tool_calls_per_s']} tool calls/s")
            results["scale_out"] = rows
        if do_waiting:  # last: its conversations stay in the server
            progress(f"waiting: {sizes.waiting} conversations on one worker")
            results["waiting"] = await waiting(parts, root, sizes.waiting, sizes.approvals, sizes.wave)
    return results


def inbox_rows(inbox: Json) -> list[list[str]]:
    """The inbox's page against the target, then the full list beside it (no target: nobody reads
    it all; a run from before paging has only the full list, as `cold_ms`/`warm_ms`)."""
    count = f"{inbox['items']:,}"
    full = {k: inbox.get(f"full_{k}_ms", inbox.get(f"{k}_ms")) for k in ("cold", "warm")}
    rows = [
        [f"the full list of all {count} waiting calls, {kind}", "", f"{num(full[kind])} ms", ""]
        for kind in ("cold", "warm")
    ]
    if "page_cold_ms" not in inbox:
        return rows
    page = [
        [f"the inbox's page ({inbox['page']} of {count} waiting, the rest counted), {kind}",
         f"≤ {TARGET_INBOX_MS:g} ms", f"{num(inbox[f'page_{kind}_ms'])} ms",
         met(inbox[f"page_{kind}_ms"] <= TARGET_INBOX_MS)]
        for kind in ("cold", "warm")
    ]  # fmt: skip
    return page + rows


def render_waiting(w: Json) -> list[str]:
    count, approval = w["conversations"], w["approval_to_execution_ms"]
    at_issue = rss_at(w, ISSUE_WAITING)
    measured_at = "measured" if count >= ISSUE_WAITING else f"from {count:,}: {num(at_issue)} MB"
    rows = [
        [f"worker RSS at {ISSUE_WAITING:,} waiting", f"≤ {TARGET_RSS_MB:g} MB",
         f"{num(w['rss_mb'])} MB at {count:,} ({measured_at})", met(at_issue <= TARGET_RSS_MB)],
        *inbox_rows(w["inbox"]),
        [f"approval → execution while they wait, p50 / p95 (n={approval['n']})",
         f"p95 ≤ {TARGET_APPROVAL_P95_MS:g} ms", f"{num(approval['p50'])} / {num(approval['p95'])} ms",
         met(approval["p95"] <= TARGET_APPROVAL_P95_MS)],
    ]  # fmt: skip
    return [
        f"**Waiting**: {count:,} conversations on one `python worker.py` (`max_cached_workflows`"
        f" {w['max_cached_workflows']}), started in waves of {w.get('wave', 'all')} in {w['started_s']} s,"
        f" {w.get('awaiting', count):,} `awaiting_approval` after"
        f" {w['all_awaiting_after_s']} s. Worker RSS idle {num(w['idle_rss_mb'])} MB, with them waiting"
        f" {num(w['rss_mb'])} MB, after the approvals {num(w['rss_after_approvals_mb'])} MB.",
        "",
        *table(["measure", "target", "measured", ""], rows),
    ]


def render_scale(rows: list[Json]) -> list[str]:
    parts = list(rows[0]["cores_busy"])
    body = [
        [str(r["workers"]), str(r["tool_calls"]), num(r["wall_s"]), num(r["tool_calls_per_s"]),
         *(num(r["cores_busy"][p], 2) for p in parts)]
        for r in rows
    ]  # fmt: skip
    first = rows[0]["tool_calls_per_s"]
    growth = ", ".join(f"{r['tool_calls_per_s'] / first:.2f} x" for r in rows)
    return [
        f"**Scale-out**: 1 to {rows[-1]['workers']} `python worker.py` processes on one task queue, the"
        f" five-step conversation at c={rows[0]['concurrency']}; cores busy = CPU seconds ÷ wall seconds"
        f" of each part during the batch ({rows[-1]['machine_cores']} cores in the machine).",
        "",
        *table(["workers", "tool calls", "wall s", "tool calls/s", *(f"cores: {p}" for p in parts)], body),
        "",
        f"Tool calls/s against one worker: {growth}. What saturates first: {saturated(rows)}.",
    ]


def render(r: Json) -> str:
    host = r["machine"]
    lines = [
        "## Waiting at scale and scale-out (`python -m bench.waiting`)",
        "",
        f"Produced by `{r['command']}` ({r['duration_s']} s). Load average {host['load_average_at_start']} at"
        f" the start, {host['load_average_at_end']} at the end: a busy machine (2 cores shared with other"
        " engineers' test runs), so times are high and noisy; compare within the run.",
        "",
    ]
    if "waiting" in r:
        lines += [*render_waiting(r["waiting"]), ""]
    if "scale_out" in r:
        lines += [*render_scale(r["scale_out"]), ""]
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    d = Sizes()
    parser = argparse.ArgumentParser(prog="python -m bench.waiting", description=__doc__.splitlines()[0])
    knobs = {
        "--waiting": (d.waiting, f"conversations waiting (the issue's: {ISSUE_WAITING})"),
        "--approvals": (d.approvals, "of them approved, one at a time"),
        "--workers": (d.workers, "the scale-out goes from 1 to this many worker processes"),
        "--concurrency": (d.concurrency, "scale-out conversations in flight"),
        "--batch": (d.batch, "scale-out conversations measured per worker count"),
        "--wave": (d.wave, "waiting conversations on their way at once (keep it under the workflow cache)"),
    }
    for flag, (default, text) in knobs.items():
        parser.add_argument(flag, type=int, default=default, help=text)
    parser.add_argument("--skip-waiting", action="store_true")
    parser.add_argument("--skip-scale-out", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmark-waiting.json"))
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmark.md"))
    parser.add_argument("--no-markdown", action="store_true", help="only the JSON (and print the section)")
    parser.add_argument("--render", action="store_true", help="only rewrite the markdown section from --out")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    given = sys.argv[1:] if argv is None else argv
    args = parse(given)
    if args.render:
        results = json.loads(args.out.read_text())
    else:
        sizes = Sizes(args.waiting, args.approvals, args.workers, args.concurrency, args.batch, args.wave)
        configure_logging("WARNING")
        results = recorded_run(
            "bench.waiting", given, measure(sizes, not args.skip_waiting, not args.skip_scale_out)
        )
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    text = render(results)
    write_section(args.markdown, "bench.waiting", text, only_print=args.no_markdown)


if __name__ == "__main__":
    main()
