"""A load shaped like people (issue 52): `bench.load --users N --think S`.

Each of N users has a conversation of their own; they send a message, read the reply, think for an
exponentially distributed time of mean S seconds, and write again, for a fixed time. A user's first
message comes after a think time too, so turns arrive at about N / (S + reply time) a second from
the start. When the time is up nobody sends again and every turn already sent is waited for (up to
bench.load's turn timeout): each sent turn is counted as completed, refused (the workflow ended it
with a reason: a limit reached, an error) or lost (no answer in time).

Reported: reply latency (signal sent → `wait_reply` answered) and tool-call latency (model reply
stored → audit row finished) p50/p95/p99, the turns by outcome, and the cores each process used
(CPU seconds ÷ wall seconds). `--find` searches the largest N that holds reply p95 under 3 s and
tool-call p95 under 500 ms with nothing lost: doubling from `start` until a run misses, then halving
the gap a few times; for each worker count asked.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import load, stack
from bench.report import num, table

Json = dict[str, Any]
MS = 1000.0
REFUSED = ("limit_reached", "error")  # a TurnResult's stops other than completed: each says why
FIND_START, FIND_CAP, FIND_HALVINGS = 100, 3200, 2


@dataclass(frozen=True)
class People:
    users: int
    think_s: float  # mean think time between a reply and the next message
    duration_s: float  # how long users keep writing
    workers: int  # `python worker.py` processes


def progress(message: str) -> None:
    load.progress(message)


async def person(
    parts: stack.Parts, workflow_id: str, think_s: float, until: float, rng: random.Random
) -> list[load.Turn]:
    """One user's turns until `until` (perf_counter): think, write, read the reply, again."""
    turns: list[load.Turn] = []
    while True:
        think = rng.expovariate(1 / think_s)
        if time.perf_counter() + think >= until:  # the time is up before this user would write again
            return turns
        await asyncio.sleep(think)
        began = time.perf_counter()
        try:
            turns.append(await load.one_turn(parts.client, workflow_id))
        except Exception as failed:  # the client's call itself failed: the turn is lost, not the run
            turns.append(load.Turn(time.perf_counter() - began, f"failed: {type(failed).__name__}"))


def outcomes(turns: Iterable[load.Turn]) -> dict[str, int]:
    """Sent turns as completed, refused (with the stop as its reason) or lost."""
    found = {"completed": 0, "refused": 0, "lost": 0}
    for turn in turns:
        key = "completed" if turn.stop == "completed" else "refused" if turn.stop in REFUSED else "lost"
        found[key] += 1
    return found


def holds(result: Json) -> bool:
    """Reply p95 under 3 s, tool-call p95 under 500 ms, and no turn lost."""
    reply, tool = result["reply_ms"]["p95"], result["tool_ms"]["p95"]
    return (
        reply is not None
        and reply < load.TARGET_REPLY_S * MS
        and (tool is None or tool < load.TARGET_TOOL_S * MS)
        and result["turns"]["lost"] == 0
    )


async def run(parts: stack.Parts, root: Path, people: People, server_pid: int, seed: int = 52) -> Json:
    """One load of `people` on fresh worker processes and fresh conversations."""
    async with load.workers(parts, root, people.workers) as (sub, pids):
        progress(f"{people.users} users, {people.workers} worker processes: starting their conversations")
        ids = await load.start_idle(sub, people.users)
        since = datetime.now(UTC)
        rng = random.Random(seed)
        until = time.perf_counter() + people.duration_s
        progress(f"users writing for {people.duration_s:g} s, thinking {people.think_s:g} s on average")
        users = asyncio.gather(*(person(sub, w, people.think_s, until, rng) for w in ids))
        each, wall, busy = await load.cores_during(root, pids, server_pid, users)
    turns = [turn for user in each for turn in user]
    tools, tool_outcomes = await load.tool_latencies(parts, "bench-load-", since)
    completed = [t.latency_s for t in turns if t.stop == "completed"]
    result: Json = {
        "people": asdict(people),
        "wall_s": round(wall, 1),
        "turns_sent": len(turns),
        "turns_per_s": round(len(turns) / wall, 2),
        "turns": outcomes(turns),
        "turn_stops": {s: sum(t.stop == s for t in turns) for s in sorted({t.stop for t in turns})},
        "reply_ms": load.spread(completed),
        "tool_ms": load.spread(tools),
        "tool_outcomes": tool_outcomes,
        "cores_busy": busy,
    }
    result["holds"] = holds(result)
    progress(
        f"{people.users} users on {people.workers} workers: {result['turns']}, reply p95"
        f" {result['reply_ms']['p95']} ms, tool p95 {result['tool_ms']['p95']} ms: "
        + ("holds" if result["holds"] else "does not hold")
    )
    return result


async def find(probe: Callable[[int], Awaitable[Json]], start: int = FIND_START) -> Json:
    """The largest N for which `probe(N)` holds: doubling from `start`, then FIND_HALVINGS halvings
    of the gap between the last N that held and the first that did not."""
    tried: dict[int, Json] = {}

    async def holds_at(n: int) -> bool:
        tried[n] = await probe(n)
        return bool(tried[n]["holds"])

    best, worst, n = 0, None, start
    while worst is None and n <= FIND_CAP:
        if await holds_at(n):
            best, n = n, n * 2
        else:
            worst = n
    for _ in range(FIND_HALVINGS if worst is not None else 0):
        middle = (best + worst) // 2 if best else worst // 2  # type: ignore[operator]
        if middle in tried or middle <= 0:
            break
        if await holds_at(middle):
            best = middle
        else:
            worst = middle
    return {"largest": best, "first_missed": worst, "runs": [tried[n] for n in sorted(tried)]}


async def measure(
    users: int | None, think_s: float, duration_s: float, workers: list[int], search: bool
) -> Json:
    """The stack once; a load of `users` (on the most worker processes given), then `--find` for
    each worker count."""
    began = time.perf_counter()
    found: Json = {}
    async with stack.started("people", load.scenario()) as (root, server, parts):
        if users:
            found["users"] = await run(
                parts, root, People(users, think_s, duration_s, max(workers)), server.pid
            )
        if search:
            found["find"] = {}
            for count in workers:

                async def probe(n: int, count: int = count) -> Json:
                    return await run(parts, root, People(n, think_s, duration_s, count), server.pid)

                found["find"][str(count)] = await find(probe)
                progress(f"{count} workers: largest N holding {found['find'][str(count)]['largest']}")
    return {**found, "duration_s": round(time.perf_counter() - began, 1)}


def _row(label: str, r: Json) -> list[str]:
    reply, tool, turns = r["reply_ms"], r["tool_ms"], r["turns"]
    return [
        label,
        str(r["turns_sent"]),
        f"{turns['completed']} / {turns['refused']} / {turns['lost']}",
        f"{r['turns_per_s']}",
        " / ".join(num(reply[f"p{q}"]) for q in (50, 95, 99)),
        " / ".join(num(tool[f"p{q}"]) for q in (50, 95, 99)),
        ", ".join(f"{k.split(' (')[0]} {v:.2f}" for k, v in r["cores_busy"].items()),
        "yes" if r["holds"] else "no",
    ]


HEADER = [
    "run",
    "turns sent",
    "completed / refused / lost",
    "turns/s",
    "reply p50 / p95 / p99 ms",
    "tool call p50 / p95 / p99 ms",
    "cores busy",
    "holds",
]


def render(r: Json) -> str:
    host = r["machine"]
    lines = [
        "## People: N users writing, reading and thinking (`python -m bench.load --users N --think S`)",
        "",
        f"Produced by `{r['command']}` ({r['duration_s']} s). Load average {host['load_average_at_start']}"
        f" at the start, {host['load_average_at_end']} at the end (2 cores shared with other engineers'"
        " test runs). Each user has a conversation (`lead-qualifier`, multi-turn) and writes, reads the"
        " reply, thinks (exponential, the given mean) and writes again; a turn is one `search_leads` call"
        " and a text reply. Holds: reply p95 under 3 s, tool-call p95 under 500 ms, nothing lost.",
        "",
    ]
    rows = []
    if "users" in r:
        p = r["users"]["people"]
        rows.append(_row(f"{p['users']} users, think {p['think_s']:g} s, {p['workers']} workers", r["users"]))
    for count, search in r.get("find", {}).items():
        for run_ in search["runs"]:
            p = run_["people"]
            rows.append(_row(f"find, {count} workers: {p['users']} users", run_))
    lines += [*table(HEADER, rows), ""]
    if "find" in r:
        found = [
            [count, str(s["largest"]), str(s["first_missed"] or "none up to the cap")]
            for count, s in r["find"].items()
        ]
        lines += [*table(["worker processes", "largest N that holds", "first N that did not"], found), ""]
    return "\n".join(lines)
