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
SERVER_LABELS = {"rps1000": "transferProcessorMaxPollRPS=1000 (product)", "rps20": "default poll RPS (20)"}


def num(value: float, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def p50_p95(summary: Json) -> list[str]:
    return [num(summary["p50"]), num(summary["p95"])]


def _intro(r: Json) -> list[str]:
    host, sizes = r["machine"], r["sizes"]
    return [
        "# Benchmark",
        "",
        f"Produced by `{r['command']}` (run from the repository root; {r['duration_s']} s).",
        "",
        f"Machine: {host['cores']} cores, {host['memory_gb']} GB RAM, {host['platform']},"
        f" Python {host['python']}. Load average at start {host['load_average_at_start']}, at end"
        f" {host.get('load_average_at_end')}: the machine was shared with other work (test suites), so"
        " absolute numbers are pessimistic and the comparisons within one run are the reliable part.",
        "",
        "Parts, all started by the script on free ports in a temporary directory: embedded PostgreSQL"
        " (migrated, seeded), the Temporal dev server (`temporal server start-dev`, SQLite file) with"
        " `history.transferProcessorMaxPollRPS=1000` as `dev up` runs it, the scripted model in-process"
        " (answers at once), and `worker.build_worker` in-process on its own task queue (metric 4: `python"
        " worker.py` as a subprocess). The tools' per-tenant rate limit is lifted (10/s by default) so the"
        " numbers measure orchestration, not the limiter.",
        "",
        f"Workload: single-turn `lead-qualifier` conversations whose script makes K = {sizes['steps']}"
        " sequential `search_leads` calls, one per model reply, then replies in text (K steps, then one"
        " final model call).",
        "",
    ]


def _targets(r: Json) -> list[str]:
    main = r["main"]
    overhead = main["steps"]["overhead_ms"]["p50"]
    approval = main["approvals"][0]["to_execution_ms"]["p50"]
    best = max(row["tool_calls_per_s"] for row in main["throughput"])
    rss = main["rss"]
    rss_1000 = rss["idle_rss_mb"] + rss["per_conversation_kb"] * PER_1000 / 1024
    rows = [
        ["orchestration overhead per step, p50", f"≤ {TARGET_OVERHEAD_MS:g} ms", f"{num(overhead)} ms",
         met(overhead <= TARGET_OVERHEAD_MS)],
        ["approval → execution, p50 (`decide` update)", f"≤ {TARGET_APPROVAL_MS:g} ms", f"{num(approval)} ms",
         met(approval <= TARGET_APPROVAL_MS)],
        ["tool calls per second (best concurrency)", f"≥ {TARGET_TOOL_CALLS_PER_S:g}", num(best),
         met(best >= TARGET_TOOL_CALLS_PER_S)],
        [f"worker RSS, {rss['conversations']} conversations awaiting approval", f"≤ {TARGET_RSS_MB:g} MB",
         f"{num(rss['rss_mb'])} MB", met(rss_1000 <= TARGET_RSS_MB)],
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
    tax_step = s["step_wall_ms"]["p50"] / loop["step_wall_ms"]["p50"]
    tax_conv = s["conversation_wall_ms"]["p50"] / loop["conversation_wall_ms"]["p50"]
    return [
        f"## 1 and 6. Per step: overhead and durability tax ({s['steps']} steps of {s['conversations']}"
        " conversations, run one at a time)",
        "",
        "- **Orchestration overhead per step** (one model call + one tool call): from the history's event"
        " timestamps, (ActivityTaskScheduled of `call_model` → ActivityTaskScheduled of the next"
        " `call_model`) minus the two activities' own execution time (ActivityTaskCompleted -"
        " ActivityTaskStarted of that"
        " `call_model` and of its `execute_tool`). What is left is dispatch, workflow tasks and persistence.",
        "- **Step wall time**: the same interval without subtracting anything; for the in-process loop, model"
        " call started → next model call started, with the same activity code awaited directly"
        " (`ModelActivities.call_model` over HTTP with the `openai` client, `ToolActivities.execute_tool` on"
        " PostgreSQL).",
        "- **Conversation wall time**: `start_workflow` → result received (loop: context load → final reply);"
        " K steps plus the context load and the final model call.",
        "",
        *table(["ms", "p50", "p95"], rows),
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
        " clock, same machine). It includes the `record_decision` activity that verifies the approver."
        " **Acknowledged**:"
        " until `execute_update` returned (the signal: until the server accepted it).",
        "",
        *table(["decided with", "n", "→ execution p50", "p95", "acknowledged p50", "p95"], rows),
        "",
    ]


def _throughput(r: Json) -> list[str]:
    rows = [
        [str(t["concurrency"]), str(t["conversations"]), str(t["tool_calls"]), num(t["wall_s"], 2),
         num(t["tool_calls_per_s"])]
        for t in r["main"]["throughput"]
    ]  # fmt: skip
    return [
        "## 3. Tool calls per second",
        "",
        "Step conversations (K tool calls each) with at most *concurrency* in flight; tool calls completed ÷"
        " wall time from the first start to the last result. One in-process worker with the SDK's default"
        " options (as `build_worker` builds it).",
        "",
        *table(["concurrency", "conversations", "tool calls", "wall s", "tool calls/s"], rows),
        "",
    ]


def _rss(r: Json) -> list[str]:
    rss = r["main"]["rss"]
    return [
        "## 4. Worker memory with conversations waiting on approval",
        "",
        f"`python worker.py` as a subprocess (env `TEMPORAL_ADDRESS`, `DATABASE_URL`, `LLM_BASE_URL`,"
        f" `TASK_QUEUE`, `COUNTERSIGN_DATA_DIR` = the temp dir); {rss['conversations']} conversations"
        " started, each stopped on an `update_lead_status` approval; psutil RSS once visibility counts all"
        " of them `awaiting_approval` (plus 2 s). The SDK's workflow cache (`max_cached_workflows`, default"
        " 1000)"
        " keeps"
        " every one of them in memory, so this is the worst case for a worker that owns them all; above 1000"
        " the cache evicts and the RSS stops growing (an evicted workflow is replayed on its next task).",
        "",
        *table(
            ["idle RSS MB", "loaded RSS MB", "per conversation KB", "all awaiting after s"], [_rss_row(rss)]
        ),
        "",
    ]


def _rss_row(rss: Json) -> list[str]:
    keys = ("idle_rss_mb", "rss_mb", "per_conversation_kb", "all_awaiting_after_s")
    return [num(rss[key]) for key in keys]


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


def _lever_rows(levers: Json) -> list[list[str]]:
    rows = []
    for name, run in levers.items():
        rate = run["throughput"][0]
        rows.append(
            [name, *p50_p95(run["steps"]["overhead_ms"]), *p50_p95(run["approvals"]["to_execution_ms"]),
             f"{num(rate['tool_calls_per_s'])} (c={rate['concurrency']})"]
        )  # fmt: skip
    return rows


def _labelled(servers: Json, workers: Json) -> Json:
    return {
        **{f"dev server, {SERVER_LABELS.get(k, k)}": v for k, v in servers.items()},
        **{f"worker: {k}": v for k, v in workers.items()},
    }


def _levers(r: Json) -> list[str]:
    header = ["setting", "overhead p50 ms", "p95", "approval→exec p50 ms", "p95", "tool calls/s"]
    sizes = r["sizes"]
    levers = _labelled(r["server"], r["worker"])
    return [
        "## Levers",
        "",
        f"Same definitions, smaller samples ({sizes['lever_conversations']} step conversations,"
        f" {sizes['lever_approvals']} approvals, then the throughput run), each on a fresh task queue. The"
        " first row is the product's setup on the product's server, measured the same way, for comparison."
        " Worker options are passed to `Worker(...)` on top of what `build_worker` sets (no product change).",
        "",
        *table(header, _lever_rows(levers)),
        "",
    ]


def _delta(value: float, base: float) -> str:
    return f"{value - base:+.1f} ({(value / base - 1) * 100:+.0f} %)" if base else "n/a"


def _lever_findings(r: Json) -> list[str]:
    """Each lever against the product's setup measured with the same sample size."""
    base = r["server"]["rps1000"]
    lines = []
    servers = {k: v for k, v in r["server"].items() if k != "rps1000"}
    levers = {**_labelled(servers, r["worker"])}
    for name, run in levers.items():
        overhead = _delta(run["steps"]["overhead_ms"]["p50"], base["steps"]["overhead_ms"]["p50"])
        approval = _delta(
            run["approvals"]["to_execution_ms"]["p50"], base["approvals"]["to_execution_ms"]["p50"]
        )
        rate = _delta(run["throughput"][0]["tool_calls_per_s"], base["throughput"][0]["tool_calls_per_s"])
        lines.append(
            f"- {name}: overhead p50 {overhead} ms, approval p50 {approval} ms, tool calls/s {rate}."
        )
    return [
        "Against the first row (negative ms and positive tool calls/s are better; with samples this small"
        " and a shared machine, differences under about 20 % are noise):",
        "",
        *lines,
        "",
    ]


def render(results: Json) -> str:
    parts = [_intro, _targets, _steps, _approvals, _throughput, _rss, _events, _levers, _lever_findings]
    return "\n".join(line for part in parts for line in part(results))
