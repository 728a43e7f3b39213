"""The markdown of docs/benchmark.md, from the results JSON: every number next to its definition."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

Json = dict[str, Any]

TARGET_OVERHEAD_MS = 10.0
TARGET_APPROVAL_MS = 50.0
TARGET_TOOL_CALLS_PER_S = 100.0
TARGET_RSS_MB = 300.0
PER_1000 = 1000
PRODUCT = "product"
BENCH_CPU = "bench process (client, scripted model, in-process worker)"
SERVER_CPU = "Temporal dev server"
IN_MEMORY = "in memory (reference: nothing persisted)"
PARTS = {
    "model_dispatch": "`call_model` scheduled → started (task queue; 0 when dispatched eagerly)",
    "model_report": "`call_model` started → completed, minus its own time (delivery to the worker, result"
    " reported and persisted)",
    "task_dispatch": "workflow tasks scheduled → started (history → matching → the worker's poll)",
    "task_processing": "workflow tasks started → completed, minus the local activities' own time (the"
    " worker's Python, then the completion persisted)",
}


def num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def p50_p95(summary: Json) -> list[str]:
    return [num(summary["p50"]), num(summary["p95"])]


def run_label(run: Json) -> str:
    where = "in-process worker" if run["workers"] == 0 else f"{run['workers']} x `python worker.py`"
    return f"{run['workload']}, {where}, c={run['concurrency']}"


def rss_at(rss: Json, conversations: int = PER_1000) -> float:
    """The worker's RSS (MB) with `conversations` waiting, from a run with another count: only the
    cached ones cost memory (at most max_cached_workflows; the others are history in the server until
    their decision), so a run at or past the cache's size measured the plateau itself."""
    cache = rss["max_cached_workflows"]
    loaded = rss["rss_mb"] - rss["idle_rss_mb"]
    return float(rss["idle_rss_mb"] + loaded * min(conversations, cache) / min(rss["conversations"], cache))


def _intro(r: Json) -> list[str]:
    host, sizes = r["machine"], r["sizes"]
    return [
        "# Benchmark",
        "",
        f"Produced by `{r['command']}` (run from the repository root; {r['duration_s']} s).",
        "",
        f"Machine: {host['cores']} cores, {host['memory_gb']} GB RAM, {host['platform']},"
        f" Python {host['python']}. Load average at start {host['load_average_at_start']}, at end"
        f" {host.get('load_average_at_end')}. Everything below shares these two cores: the dev server,"
        " PostgreSQL, the worker, the scripted model and the client.",
        "",
        "Parts, all started by the script on free ports in a temporary directory: embedded PostgreSQL"
        " (migrated, seeded), the Temporal dev server (`temporal server start-dev`, SQLite file) set up as"
        " `dev up` runs it (`history.transferProcessorMaxPollRPS=1000`, `system.enableActivityEagerExecution"
        "=true`, `--sqlite-pragma journal_mode=wal`), the scripted model in-process (answers at once), and"
        " `worker.build_worker` in-process on its own task queue, or `python worker.py` subprocesses where"
        " a table says so. The tools' per-tenant rate limit is lifted (10/s by default) so the numbers"
        " measure orchestration, not the limiter.",
        "",
        f"Workloads: single-turn `lead-qualifier` conversations. **Sequential**: K = {sizes['steps']}"
        " `search_leads` calls, one per model reply, then a text reply (K steps, then one final model"
        " call). **Parallel**: two model replies that each ask for 5 `search_leads` calls at once"
        " (OpenAI-style parallel tool calls; 10 calls), then a text reply. `search_leads` is a read, so it"
        " runs as a local activity; approved writes run as regular activities.",
        "",
        "An activity's **own time** is measured in the worker, around the activity function (an"
        " interceptor, `bench/clock.py`): whatever is not the model call's or the tool's own work counts as"
        " orchestration.",
        "",
    ]


def _targets(r: Json) -> list[str]:
    main = r["main"]
    overhead = main["steps"]["overhead_ms"]["p50"]
    approval = main["approvals"][0]["to_execution_ms"]["p50"]
    best = max(main["throughput"], key=lambda row: row["tool_calls_per_s"])
    best_sequential = max(
        (row for row in main["throughput"] if row["workload"] == "sequential"),
        key=lambda row: row["tool_calls_per_s"],
    )
    rss = main["rss"][0]
    rss_1000 = rss_at(rss)
    rows = [
        ["orchestration overhead per step, p50", f"≤ {TARGET_OVERHEAD_MS:g} ms", f"{num(overhead)} ms",
         met(overhead <= TARGET_OVERHEAD_MS)],
        ["approval → execution, p50 (`decide` update)", f"≤ {TARGET_APPROVAL_MS:g} ms", f"{num(approval)} ms",
         met(approval <= TARGET_APPROVAL_MS)],
        [f"tool calls per second ({run_label(best)})", f"≥ {TARGET_TOOL_CALLS_PER_S:g}",
         num(best["tool_calls_per_s"]), met(best["tool_calls_per_s"] >= TARGET_TOOL_CALLS_PER_S)],
        [f"tool calls per second, one call per model reply ({run_label(best_sequential)})",
         f"≥ {TARGET_TOOL_CALLS_PER_S:g}", num(best_sequential["tool_calls_per_s"]),
         met(best_sequential["tool_calls_per_s"] >= TARGET_TOOL_CALLS_PER_S)],
        [f"worker RSS, 1000 conversations awaiting approval (max_cached_workflows"
         f" {rss['max_cached_workflows']}, the default)", f"≤ {TARGET_RSS_MB:g} MB", f"{num(rss_1000)} MB",
         met(rss_1000 <= TARGET_RSS_MB)],
    ]  # fmt: skip
    return ["## Targets", "", *table(["metric", "target", "measured", ""], rows), ""]


def _steps(r: Json) -> list[str]:
    s = r["main"]["steps"]
    loop = s["loop"]
    rows = [
        ["1. orchestration overhead per step", *p50_p95(s["overhead_ms"])],
        ["step wall time, workflow", *p50_p95(s["step_wall_ms"])],
        ["  of which the two activities' own time", *p50_p95(s["step_own_ms"])],
        ["step wall time, in-process loop", *p50_p95(loop["step_wall_ms"])],
        ["conversation wall time, workflow", *p50_p95(s["conversation_wall_ms"])],
        ["conversation wall time, in-process loop", *p50_p95(loop["conversation_wall_ms"])],
    ]
    parts = [[text, *p50_p95(s["parts_ms"][name])] for name, text in PARTS.items()]
    tax_step = s["step_wall_ms"]["p50"] / loop["step_wall_ms"]["p50"]
    tax_conv = s["conversation_wall_ms"]["p50"] / loop["conversation_wall_ms"]["p50"]
    return [
        f"## 1 and 6. Per step: overhead and durability tax ({s['steps']} steps of {s['conversations']}"
        " sequential conversations, run one at a time)",
        "",
        "- **Orchestration overhead per step** (one model call + one tool call): ActivityTaskScheduled of"
        " `call_model` → ActivityTaskScheduled of the next `call_model` (server timestamps), minus the own"
        " time of that `call_model` and of its `execute_tool`. What is left is dispatch, workflow tasks and"
        " persistence.",
        "- **Step wall time**: the same interval without subtracting anything; for the in-process loop, model"
        " call started → next model call started, with the same activity code awaited directly"
        " (`ModelActivities.call_model` over HTTP with the `openai` client, `ToolActivities.execute_tool` on"
        " PostgreSQL).",
        "- **Conversation wall time**: `start_workflow` → result received (loop: context load → final reply);"
        " K steps plus the context load and the final model call.",
        "",
        *table(["ms", "p50", "p95"], rows),
        "",
        "Where the overhead goes, per step (summed over the step's workflow tasks; p50s do not add up"
        " exactly):",
        "",
        *table(["ms", "p50", "p95"], parts),
        "",
        "**Durability tax** (workflow ÷ in-process loop, p50, same run, interleaved):"
        f" {tax_step:.1f} times per step, {tax_conv:.1f} times per conversation.",
        "",
    ]


def _approvals(r: Json) -> list[str]:
    rows = [
        [f"`{a['via']}`", str(a["approvals"]), *p50_p95(a["to_execution_ms"]), *p50_p95(a["acknowledged_ms"])]
        for a in r["main"]["approvals"]
    ]
    return [
        "## 2. Approval latency",
        "",
        "The script asks `update_lead_status` of Jane Doe (high risk: needs approval); `alice` requests,"
        " `bob` (reviewer) approves once the status query says `awaiting_approval`; statuses alternate"
        " new/contacted so every approved call changes the lead. **Approval → execution**: the client's clock"
        " when the decision is sent → the ActivityTaskStarted of `execute_tool` for that call (server"
        " clock, same machine). It includes `record_decision` (a local activity) verifying the approver in"
        " PostgreSQL. **Acknowledged**: until `execute_update` returned (the signal: until the server"
        " accepted it).",
        "",
        *table(["decided with", "n", "→ execution p50", "p95", "acknowledged p50", "p95"], rows),
        "",
    ]


def _throughput(r: Json) -> list[str]:
    runs = r["main"]["throughput"]
    parts = list(runs[0]["cpu_ms_per_tool_call"])
    rows = [
        [run_label(t), str(t["tool_calls"]), num(t["wall_s"], 2), num(t["tool_calls_per_s"]),
         *(num(t["cpu_ms_per_tool_call"][p]) for p in parts), num(t["cpu_utilisation"], 2)]
        for t in runs
    ]  # fmt: skip
    return [
        "## 3. Tool calls per second",
        "",
        "Conversations with at most *c* in flight; tool calls completed ÷ wall time from the first start to"
        " the last result. Then the CPU time (user + system, psutil) each process used during the run,"
        " per tool call, and the cores busy on average (2 is the machine's all).",
        "",
        *table(
            [
                "run",
                "tool calls",
                "wall s",
                "tool calls/s",
                *(f"CPU ms/call: {p}" for p in parts),
                "cores busy",
            ],
            rows,
        ),
        "",
    ]


def _rss(r: Json) -> list[str]:
    rows = []
    for rss in r["main"]["rss"]:
        approvals = rss["approvals"]["to_execution_ms"]
        rows.append(
            [str(rss["max_cached_workflows"]), num(rss["idle_rss_mb"]), num(rss["rss_mb"]),
             num(rss["per_conversation_kb"]), num(rss_at(rss)), num(rss["all_awaiting_after_s"]),
             f"{num(approvals['p50'])} / {num(approvals['p95'])} (n={approvals['n']})"]
        )  # fmt: skip
    first = r["main"]["rss"][0]
    return [
        "## 4. Worker memory with conversations waiting on approval",
        "",
        f"`python worker.py` as a subprocess; {first['conversations']} conversations started, each stopped on"
        " an `update_lead_status` approval; psutil RSS once visibility counts all of them"
        " `awaiting_approval` (plus 2 s). The SDK's workflow cache (`max_cached_workflows`, env"
        " `WORKER_MAX_CACHED_WORKFLOWS`; the product's default first, then the SDK's) keeps up to that many"
        " in memory; one pushed out is replayed from its history when its decision arrives. Then the first"
        " conversations started (the first a small cache pushed out) are approved one by one: approval →"
        " execution includes that replay where there was one.",
        "",
        *table(
            [
                "max_cached_workflows",
                "idle RSS MB",
                "loaded RSS MB",
                "per conversation KB",
                "RSS MB at 1000 waiting",
                "all awaiting after s",
                "approval → execution p50 / p95 ms",
            ],
            rows,
        ),
        "",
    ]


def _events(r: Json) -> list[str]:
    s, a = r["main"]["steps"], r["main"]["approvals"][0]
    rows = [
        ["per read step (`call_model` scheduled → next `call_model` scheduled)",
         num(s["events_per_step"]["mean"])],
        [f"per turn, K = {r['sizes']['steps']} read steps (whole single-turn history)",
         num(s["events_per_turn"]["mean"])],
        ["per approved call (requesting `call_model` completed → next `call_model` scheduled)",
         num(a["events_per_approved_call"]["mean"])],
        ["per turn with one approved call (whole history)", num(a["events_per_turn"]["mean"])],
    ]  # fmt: skip
    return ["## 5. History events", "", *table(["events", "mean"], rows), ""]


def _lever_row(name: str, run: Json, base: Json) -> list[str]:
    overhead = run["steps"]["overhead_ms"]["p50"]
    approval = run["approvals"]["to_execution_ms"]["p50"]
    rate = run["throughput"][0]["tool_calls_per_s"]
    return [
        name,
        f"{num(overhead)} ({_delta(overhead, base['steps']['overhead_ms']['p50'])})",
        f"{num(approval)} ({_delta(approval, base['approvals']['to_execution_ms']['p50'])})",
        f"{num(rate)} ({_delta(rate, base['throughput'][0]['tool_calls_per_s'])})",
        num(run["steps"]["events_per_step"]["mean"]),
    ]


def _delta(value: float, base: float) -> str:
    return f"{(value / base - 1) * 100:+.0f} %" if base else "n/a"


def _levers(r: Json) -> list[str]:
    sizes = r["sizes"]
    base = r["server"][PRODUCT]
    header = ["setting", "overhead p50 ms", "approval→exec p50 ms", "tool calls/s", "events/step"]
    servers = [_lever_row(name, run, base) for name, run in r["server"].items()]
    workers = [_lever_row(name, run, base) for name, run in r["worker"].items()]
    rate = sizes["lever_throughput"]
    return [
        "## Levers",
        "",
        f"The same definitions on smaller samples ({sizes['lever_conversations']} sequential conversations,"
        f" {sizes['lever_approvals']} approvals, {rate['conversations']} conversations at"
        f" c={rate['concurrency']}"
        " for tool calls/s), each on a fresh task queue; in brackets, the change against the product's"
        " row (lower ms and higher tool calls/s are better; with samples this small, differences under"
        " about 15 % are noise).",
        "",
        "Dev server settings (one server each, the product's worker):",
        "",
        *table(header, servers),
        "",
        "Worker settings (on the product's server):",
        "",
        *table(header, workers),
        "",
    ]


def _gaps(r: Json) -> list[str]:
    """What the numbers say about the targets not met, computed from this run."""
    main = r["main"]
    steps = main["steps"]
    parts = {name: steps["parts_ms"][name]["p50"] for name in PARTS}
    lines = ["## Where the rest goes", ""]
    overhead = steps["overhead_ms"]["p50"]
    if overhead > TARGET_OVERHEAD_MS:
        lines.append(_overhead_gap(r, overhead, parts))
    sequential = [t for t in main["throughput"] if t["workload"] == "sequential"]
    best = max(sequential, key=lambda row: row["tool_calls_per_s"])
    if best["tool_calls_per_s"] < TARGET_TOOL_CALLS_PER_S:
        cpu = best["cpu_ms_per_tool_call"]
        total = sum(cpu.values())
        lines.append(
            f"- **Tool calls per second, one call per model reply ({num(best['tool_calls_per_s'])}).** Every"
            f" such tool call costs {num(total)} ms of CPU across the processes ("
            + ", ".join(f"{k} {num(v)}" for k, v in cpu.items())
            + f"), so two cores allow at most about {num(2000 / total, 0)} a second whatever the"
            " concurrency. The parallel workload spreads a model call and a workflow task over five tool"
            " calls. What would close it: more cores (the worker, the server and PostgreSQL each scale out)"
            " or fewer model round trips per tool call."
        )
    rss = main["rss"][0]
    if rss_at(rss) > TARGET_RSS_MB:
        lines.append(
            f"- **Memory ({num(rss_at(rss))} MB).** Each cached conversation holds its own copy of the"
            f" workflow module in the sandbox plus its state, about {num(rss['per_conversation_kb'])} KB; a"
            " smaller `WORKER_MAX_CACHED_WORKFLOWS` bounds it, at the price of a replay per decision on a"
            " conversation pushed out (section 4)."
        )
    if len(lines) == 2:
        lines.append("Every target is met.")
    return [*lines, ""]


def _overhead_gap(r: Json, overhead: float, parts: dict[str, float]) -> str:
    """Why a step costs what it costs: persistence (the in-memory reference) or CPU (the CPU table)."""
    servers, workers = r["server"], r["worker"]
    product = servers[PRODUCT]["steps"]["overhead_ms"]["p50"]
    memory = servers.get(IN_MEMORY, servers[PRODUCT])["steps"]["overhead_ms"]["p50"]
    one = next(t for t in r["main"]["throughput"] if t["workload"] == "sequential" and t["concurrency"] == 1)
    cpu = one["cpu_ms_per_tool_call"]
    unsandboxed = next((v for k, v in workers.items() if k.startswith("unsandboxed")), None)
    persistence = (
        f"Persistence is not what is left: the in-memory server measures {num(memory)} ms against"
        f" {num(product)} ms in the same sample."
        if memory > product * 0.85
        else f"Persistence is part of it: the in-memory server measures {num(memory)} ms against"
        f" {num(product)} ms in the same sample."
    )
    sandbox = (
        f" Without the workflow sandbox the worker measures"
        f" {num(unsandboxed['steps']['overhead_ms']['p50'])} ms (not adopted: the sandbox is what catches"
        " non-deterministic workflow code before it reaches a running conversation)."
        if unsandboxed
        else ""
    )
    return (
        f"- **Overhead per step ({num(overhead)} ms).** A step is one regular activity (the model call,"
        " dispatched eagerly) and one workflow task that runs the tool as a local activity and schedules"
        f" the next model call. Its parts (p50): workflow task dispatch {num(parts['task_dispatch'])} ms,"
        f" workflow task processing {num(parts['task_processing'])} ms, the model activity's delivery and"
        f" report {num(parts['model_report'])} ms. {persistence} It is CPU on the critical path: one"
        f" conversation at a time, a step costs {num(cpu[BENCH_CPU])} ms of CPU in the worker's process"
        f" (with the scripted model and the client) and {num(cpu[SERVER_CPU])} ms in the dev server, on"
        f" two shared cores.{sandbox} What would close the rest: cores of its own for the worker and for"
        " the server (in production they are separate machines), and less Python per workflow task"
        " (the SDK's sandbox converts every payload through sandboxed code; the transcript each model"
        " call carries grows with the turn)."
    )


def render(results: Json) -> str:
    parts = [_intro, _targets, _steps, _approvals, _throughput, _rss, _events, _levers, _gaps]
    return "\n".join(line for part in parts for line in part(results))
