"""A soak under faults: conversations of every kind while a chaos loop breaks the stack, then proof
that nothing was lost or done twice (issue 38).

    .venv/bin/python -m bench.soak            # bounded: 21 conversations, 8 faults (~4 min)
    .venv/bin/python -m bench.soak --full     # 100 conversations, 50 faults

The parts are the fault tests' own (tests/fixtures/faults.py: embedded PostgreSQL, the Temporal dev
server on a SQLite file, the scripted model, an SMTP catcher) with two `python worker.py` processes
on one task queue. The conversations are the fault tests' scripts (tests/fixtures/fault_scripts.py),
every kind of `SOAK_KINDS`: a write turn, three writes and an email, a read, a call a reviewer
approves and one a reviewer rejects, a question the user answers, and a turn rolled back (undo).
The workers run APPROVER_AUTH=signed beside the inbox server (`countersign.server`): the user
(alice) starts each conversation through its front door (keyed by the conversation's name),
answers, rolls back and ends, and the reviewer (bob) decides, through its HTTP API with a session
of their own; the inbox mints the proofs the workers verify. The conversations start spread over
the chaos window while the chaos loop, on a seeded random schedule, SIGKILLs one of the workers
(and starts it again), restarts the dev server (same port and file) or restarts PostgreSQL (same
data directory). The driver of each conversation retries what a fault interrupts, sending a start,
decision, answer, rollback or end again only while the conversation still waits for it.

At the end: every conversation's state and effects are read from what the tools changed (tasks,
lead statuses, the outbox and the SMTP catcher), the audit, decisions and compensations, and
`judge` sorts every difference from what the script leads to: **lost** (an effect that should have
happened once and did not), **doubled** (one that happened more than once), **unwanted** (a
rejected, unapproved or undone effect that is there) and **unexpected** (any other difference:
a conversation not completed, another reply, another audit row). Every conversation's history is
replayed with the current workflow code (temporalio's Replayer).

The design's success figures, each beside its target (`figures`): availability, the share of the
requests sent to the server that it answered (any status below 500), and answered within 3 s, while
the faults strike (every action of the drivers, a probe of bob's inbox every second, and the
ratings); the error rate, the conversations that did not end as their script leads (any finding of
the judge); the clarification rate, the turns that asked a person a question (`ask_human`) or
answered `needs`; and satisfaction, from the ratings the simulated user gives each conversation's
first reply through the server (helpful unless the reply is missing or the model found no rule).

Writes the `bench.soak` section of docs/benchmark.md and prints it; exits 1 when anything was lost,
doubled, unwanted or unexpected, or the audit chain does not verify.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
from sqlalchemy import select
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from bench.sections import put_section, recorded_run
from countersign.core.evidence import Broken
from countersign.db.chain import verify_live
from countersign.db.engine import session_factory
from countersign.db.schema import ConversationMessage
from countersign.devstack.worker import WorkerProcess
from countersign.identity.proofs import pem_pair
from countersign.runtime.payloads import data_converter
from countersign.scripted_model.server import Fault
from countersign.server.app import running_server
from tests.fixtures.fault_scripts import (
    APPROVER,
    GATED,
    REQUESTER,
    SOAK_KINDS,
    Conversation,
    Effects,
    expected,
    plan,
    prepare,
    rules_for,
)
from tests.fixtures.faults import FaultStack, own_stack, scenario, signed_env
from workflows.agent import AgentWorkflow

FaultKind = Literal["worker_killed", "temporal_restarted", "postgres_restarted"]
FAULT_KINDS: tuple[FaultKind, ...] = ("worker_killed", "temporal_restarted", "postgres_restarted")
TEMPORAL_DOWN_S = 2.0  # on top of the dev server's own stop and start
POSTGRES_DOWN_S = 3.0  # on top of PostgreSQL's own stop and start
# the model's time per answer, drawn from this range: calls are in flight when faults strike
THINK_S = (0.5, 3.0)
REVIEW_S = 8.0  # the reviewer and the user take up to this long to act: waits span faults
SETTLE_S = 420.0  # after the window: a lost activity without heartbeats waits up to 120 s, per fault
EVERY_S = 0.5  # how often a driver looks again
PROBE_EVERY_S = 1.0  # how often the probe asks for bob's inbox while the faults strike
ANSWERED_WITHIN_S = 3.0
# The design's targets (docs/benchmark.md): availability at least, errors and clarification below.
TARGETS = {"availability": 0.999, "error_rate": 0.01, "clarification_rate": 0.10}


@dataclass(frozen=True)
class Sizes:
    conversations: int
    faults: dict[FaultKind, int]
    window_s: float  # conversations start and faults strike within it
    gap_s: float  # at least this between two faults' starts


DEFAULT = Sizes(
    conversations=21,
    faults={"worker_killed": 4, "temporal_restarted": 2, "postgres_restarted": 2},
    window_s=120.0,
    gap_s=8.0,
)
FULL = Sizes(
    conversations=100,
    faults={"worker_killed": 20, "temporal_restarted": 15, "postgres_restarted": 15},
    window_s=900.0,
    gap_s=12.0,
)


def progress(message: str) -> None:
    print(f"[bench.soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the pure parts: the chaos schedule and the judge ------------------------------------------------


@dataclass(frozen=True, order=True)
class Strike:
    at_s: float  # seconds into the window
    kind: FaultKind


def chaos_schedule(
    rng: random.Random, counts: dict[FaultKind, int], window_s: float, gap_s: float
) -> list[Strike]:
    """`counts` faults of each kind in random order at random moments of the window, at least
    `gap_s` apart (uniform over all such schedules' spacings: random offsets into the window's
    slack, each fault then pushed back by the gaps before it)."""
    kinds = [kind for kind in FAULT_KINDS for _ in range(counts.get(kind, 0))]
    if any(n < 0 for n in counts.values()):
        raise ValueError(f"negative fault count in {counts}")
    slack = window_s - gap_s * max(len(kinds) - 1, 0)
    if slack < 0:
        raise ValueError(f"{len(kinds)} faults {gap_s} s apart do not fit in {window_s} s")
    rng.shuffle(kinds)
    offsets = sorted(rng.uniform(0, slack) for _ in kinds)
    spaced = (offset + n * gap_s for n, offset in enumerate(offsets))
    return [Strike(round(at_s, 3), kind) for at_s, kind in zip(spaced, kinds, strict=True)]


COUNTED = ("tasks", "outbox", "delivered", "audit_rows", "compensation_rows")  # effects that happen n times


@dataclass
class Verdict:
    """What differs from the scripts, one line per finding, by class."""

    lost: list[str] = field(default_factory=list)  # should have happened once, did not
    doubled: list[str] = field(default_factory=list)  # happened more than once
    unwanted: list[str] = field(default_factory=list)  # rejected, unapproved or undone, yet there
    unexpected: list[str] = field(default_factory=list)  # any other difference (state, reply, audit)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.doubled or self.unwanted or self.unexpected)


def count(effects: Effects, name: str) -> int:
    value = getattr(effects, name)
    return value if isinstance(value, int) else len(value)


def judge(conversations: Sequence[Conversation], found: dict[str, Effects]) -> Verdict:
    """Compare what each conversation left (`found`, by workflow id) with what its script leads to
    (`fault_scripts.expected`): counted effects fewer or more than expected are lost or doubled; a
    lead whose status should have changed and did not is lost, one that changed when it should
    not have (rejected, never approved, or rolled back) is unwanted; every other difference is
    unexpected."""
    verdict = Verdict()
    for c in conversations:
        want, got = expected(c), found[c.workflow_id]
        for name in COUNTED:
            wanted, made = count(want, name), count(got, name)
            if made > wanted:
                verdict.doubled.append(f"{c.workflow_id}: {name} {made}, expected {wanted}")
            elif made < wanted:
                verdict.lost.append(f"{c.workflow_id}: {name} {made}, expected {wanted}")
        if got.lead != want.lead:
            into = verdict.unwanted if want.lead == "new" else verdict.lost
            into.append(f"{c.workflow_id}: lead {got.lead}, expected {want.lead}")
        others = {
            name: (value, getattr(got, name))
            for name, value in vars(want).items()
            if name not in (*COUNTED, "lead") and getattr(got, name) != value
        }
        # a list of statuses of the expected length can still differ (a task open, not cancelled)
        others |= {
            name: (getattr(want, name), getattr(got, name))
            for name in ("tasks", "outbox")
            if count(got, name) == count(want, name) and getattr(got, name) != getattr(want, name)
        }
        if others:
            verdict.unexpected.append(f"{c.workflow_id}: (expected, found) {others}")
    return verdict


# --- the design's success figures ------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request sent to the server: what for, how long its answer took, and its status (None:
    no answer at all, the connection refused, reset or timed out)."""

    what: str
    seconds: float
    status: int | None


def ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def clarifying_turns(messages: Sequence[tuple[str, int, str, str | None, bool]]) -> tuple[int, int]:
    """(turns, turns that asked a person) of stored messages `(workflow_id, seq, role, name, needs)`:
    a turn is a user message and what follows it; it asked when a tool result in it is `ask_human`'s
    or answered `needs`."""
    turns: set[tuple[str, int]] = set()
    asked: set[tuple[str, int]] = set()
    turn: dict[str, int] = Counter()
    for workflow_id, _seq, role, name, needs in sorted(messages, key=lambda m: (m[0], m[1])):
        if role == "user":
            turn[workflow_id] += 1
            turns.add((workflow_id, turn[workflow_id]))
        elif role == "tool" and (name == "ask_human" or needs) and turn[workflow_id]:
            asked.add((workflow_id, turn[workflow_id]))
    return len(turns), len(asked)


def figures(
    requests: Sequence[Request],
    conversations: int,
    verdict: dict[str, list[str]],
    turns: int,
    clarifying: int,
    ratings: dict[str, int],
) -> dict[str, Any]:
    """The design's success figures of a run: availability (answered, and within 3 s, of the
    requests sent), the error rate (conversations with a finding of the judge, each counted once),
    the clarification rate (turns that asked a person) and satisfaction (replies rated helpful)."""
    answered = [r for r in requests if r.status is not None and r.status < 500]
    quick = [r for r in answered if r.seconds <= ANSWERED_WITHIN_S]
    erred = {line.split(":", 1)[0] for lines in verdict.values() for line in lines}
    rated = sum(ratings.values())
    return {
        "requests": len(requests),
        "answered": len(answered),
        "answered_within_3s": len(quick),
        "availability": ratio(len(answered), len(requests)),
        "availability_within_3s": ratio(len(quick), len(requests)),
        "conversations": conversations,
        "conversations_with_errors": len(erred),
        "error_rate": ratio(len(erred), conversations),
        "turns": turns,
        "clarifying_turns": clarifying,
        "clarification_rate": ratio(clarifying, turns),
        "rated": rated,
        "rated_helpful": ratings.get("helpful", 0),
        "satisfaction": ratio(ratings.get("helpful", 0), rated),
        # what went unanswered (or slow), by request and status: where availability was lost
        "unanswered": dict(
            Counter(f"{r.what}: {r.status or 'no answer'}" for r in requests if r not in answered)
        ),
        "slow": dict(Counter(r.what for r in answered if r.seconds > ANSWERED_WITHIN_S)),
    }


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def figures_table(f: dict[str, Any]) -> str:
    """The figures beside the design's targets, as a markdown table; a target met or not, said."""

    def met(value: float | None, target: float, at_least: bool) -> str:
        if value is None:
            return "-"
        return "met" if (value >= target if at_least else value < target) else "**not met**"

    def against(label: str, figure: str, count: str, of: str, target: str, at_least: bool) -> tuple[str, ...]:
        """A figure's row: measured (`count` of `of`), its target and whether it is met."""
        return (
            label,
            f"{percent(f[figure])} ({f[count]} of {f[of]})",
            f"{'≥' if at_least else '<'} {percent(TARGETS[target])}",
            met(f[figure], TARGETS[target], at_least),
        )

    rows = [
        against(
            "availability: requests answered", "availability", "answered", "requests", "availability", True
        ),
        against(
            "availability: answered within 3 s",
            "availability_within_3s",
            "answered_within_3s",
            "requests",
            "availability",
            True,
        ),
        against(
            "error rate: conversations not ending as scripted",
            "error_rate",
            "conversations_with_errors",
            "conversations",
            "error_rate",
            False,
        ),
        against(
            "clarification rate: turns that asked a person",
            "clarification_rate",
            "clarifying_turns",
            "turns",
            "clarification_rate",
            False,
        ),
        (
            "satisfaction: replies rated helpful",
            f"{percent(f['satisfaction'])} ({f['rated_helpful']} of {f['rated']})",
            "none in the design",
            "-",
        ),
    ]
    lines = ["| Figure | Measured | Target | |", "|---|---|---|---|"]
    table = "\n".join([*lines, *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)])
    missed = [
        f"- {label}: " + ", ".join(f"{what} ({n})" for what, n in sorted(counts.items()))
        for label, counts in (("unanswered", f["unanswered"]), ("answered after 3 s", f["slow"]))
        if counts
    ]
    return "\n\n".join([table, "\n".join(missed)]) if missed else table


# --- driving conversations through faults ------------------------------------------------------------


@dataclass
class Inbox:
    """The inbox server, signed mode: each person acts with a session of their own, and the inbox
    mints the proof of each start, decision, answer, rollback and end that the workers verify."""

    url: str
    tokens: dict[str, str] = field(default_factory=dict)
    sent: list[Request] = field(default_factory=list)  # every request, answered or not

    async def post(self, user: str, path: str, body: Any, method: str = "POST") -> Any:
        """POST (or `method`) as `user` (logged in with the seed's password on first use); raises
        unless 2xx."""
        if user not in self.tokens:
            login = {"tenant_id": "acme", "user_id": user, "password": f"{user}-dev"}
            self.tokens[user] = (await self._call("POST", None, "/api/login", login))["token"]
        return await self._call(method, self.tokens[user], path, body)

    async def _call(self, method: str, token: str | None, path: str, body: Any) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        what = path.split("/")[-1] if path.startswith("/api/conversations/") else path
        started, status = time.monotonic(), None
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
                http.request(method, self.url + path, json=body, headers=headers) as response,
            ):
                status, text = response.status, await response.text()
        finally:
            self.sent.append(Request(f"{method} {what}", time.monotonic() - started, status))
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {text[:300]}")
        return json.loads(text)

    async def start(self, c: Conversation) -> None:
        """Start `c` through the front door, keyed by its name: a key is one conversation."""
        body = {"agent": c.agent, "message": c.message, "key": c.name, "single_turn": c.single_turn}
        await self.post(REQUESTER, "/api/conversations", body)

    async def decide(self, c: Conversation) -> None:
        """The reviewer's decision on `c`'s pending call: rejected for the `rejected` kind, with a
        reason that names the conversation (its model's script looks for it), else approved."""
        (waiting,) = (await c.h.query(AgentWorkflow.status)).pending_approvals
        reject = c.kind == "rejected"
        body = {"decision": "reject", "reason": f"{c.marker} not now"} if reject else {"decision": "approve"}
        await self.post(APPROVER, f"/api/approvals/{c.workflow_id}/{waiting.call_id}", body)

    async def answer(self, c: Conversation) -> None:
        (waiting,) = (await c.h.query(AgentWorkflow.status)).pending_questions
        path = f"/api/conversations/{c.workflow_id}/answers/{waiting.call_id}"
        await self.post(REQUESTER, path, {"text": f"{c.marker} Tuesday"})

    async def roll_back(self, c: Conversation) -> None:
        await self.post(REQUESTER, f"/api/conversations/{c.workflow_id}/rollback", {"scope": "turn"})

    async def end(self, c: Conversation) -> None:
        await self.post(REQUESTER, f"/api/conversations/{c.workflow_id}/end", {})

    async def rate(self, c: Conversation) -> str:
        """The user rates the conversation's first reply: helpful unless it is missing or the model
        found no rule for it (the script went astray)."""
        messages = await self.post(REQUESTER, f"/api/conversations/{c.workflow_id}/transcript", None, "GET")
        replies = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
        reply = next((r for r in reversed(replies) if r), "")
        rating = "helpful" if reply and "no rule matched" not in reply else "not_helpful"
        body = {"rating": rating}
        await self.post(REQUESTER, f"/api/conversations/{c.workflow_id}/ratings/1", body, "PUT")
        return rating

    async def probe(self, until_s: float) -> None:
        """Ask for bob's inbox every PROBE_EVERY_S until `until_s` (monotonic): requests a reviewer
        makes, answered or not, while the faults strike."""
        while time.monotonic() < until_s:
            with contextlib.suppress(Exception):  # recorded in `sent` either way
                await self.post(APPROVER, "/api/approvals", None, "GET")
            await asyncio.sleep(PROBE_EVERY_S)


async def holds(check: Callable[[], Awaitable[bool]]) -> bool:
    """`check`, counting any error (a server or database down) as not yet."""
    try:
        return await check()
    except Exception:
        return False


async def until(check: Callable[[], Awaitable[bool]], what: str, deadline: float) -> None:
    while not await holds(check):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        await asyncio.sleep(EVERY_S)


async def once(
    act: Callable[[], Awaitable[Any]],
    pending: Callable[[], Awaitable[bool]],
    what: str,
    deadline: float,
) -> None:
    """Do `act` while `pending` holds (the conversation still waits for it): a fault may fail the
    call after it arrived, so it is sent again only when the conversation still waits, a few
    seconds later."""
    await until(pending, f"{what} to be awaited", deadline)
    while True:
        try:
            await act()
            return
        except Exception as failed:
            progress(f"{what}: {type(failed).__name__}: {failed}; looking again")
        await asyncio.sleep(5 * EVERY_S)
        try:
            if not await pending():
                return
        except Exception:
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up on {what}")


async def converse(
    stack: FaultStack, inbox: Inbox, c: Conversation, delay_s: float, act_after_s: float, deadline: float
) -> None:
    """Start `c` after `delay_s`, play the reviewer or the user it needs (each acting `act_after_s`
    after the conversation started), and see it completed."""
    await asyncio.sleep(delay_s)
    c.handle = stack.client.get_workflow_handle_for(AgentWorkflow.run, c.workflow_id)

    async def not_started() -> bool:
        try:
            await c.h.describe()
        except RPCError as missing:
            if missing.status == RPCStatusCode.NOT_FOUND:
                return True
            raise
        return False

    # a start resent after its answer was lost would deliver the message twice: once only
    await once(lambda: inbox.start(c), not_started, f"{c.workflow_id} start", deadline)

    async def status() -> Any:
        return await c.h.query(AgentWorkflow.status)

    async def awaiting_approval() -> bool:
        return bool((await status()).pending_approvals)

    async def awaiting_answer() -> bool:
        return bool((await status()).pending_questions)

    async def not_rolled_back() -> bool:
        saga = await c.h.query(AgentWorkflow.saga)
        return bool(saga.entries) and all(e.state == "registered" for e in saga.entries)

    async def turn_done() -> bool:
        turn = await c.h.execute_update(AgentWorkflow.wait_turn, 1)
        return turn is not None

    async def running() -> bool:
        return (await c.h.describe()).status == WorkflowExecutionStatus.RUNNING

    async def closed() -> bool:
        return not await running()

    await asyncio.sleep(act_after_s)
    if c.kind in GATED:
        await once(lambda: inbox.decide(c), awaiting_approval, f"{c.workflow_id} decision", deadline)
    elif c.kind == "question":
        await once(lambda: inbox.answer(c), awaiting_answer, f"{c.workflow_id} answer", deadline)
    elif c.kind == "compensation":
        await until(turn_done, f"{c.workflow_id} turn 1", deadline)
        await once(lambda: inbox.roll_back(c), not_rolled_back, f"{c.workflow_id} rollback", deadline)
        await until(c.rolled_back, f"{c.workflow_id} rolled back", deadline)
        await once(lambda: inbox.end(c), running, f"{c.workflow_id} end", deadline)
    await until(closed, f"{c.workflow_id} to complete", deadline)
    for _ in range(5):  # the user says whether the reply helped: a fault may interrupt it too
        try:
            c.rating = await inbox.rate(c)
            return
        except Exception as failed:
            progress(f"{c.workflow_id} rating: {type(failed).__name__}: {failed}; again")
            await asyncio.sleep(5 * EVERY_S)


async def converse_logged(
    stack: FaultStack, inbox: Inbox, c: Conversation, delay_s: float, act_after_s: float, deadline: float
) -> None:
    """`converse`, its failure logged: the judge reports a conversation that did not complete."""
    try:
        await converse(stack, inbox, c, delay_s, act_after_s, deadline)
    except Exception as failed:
        progress(f"{c.workflow_id}: {type(failed).__name__}: {failed}")


async def strike(
    stack: FaultStack, workers: list[WorkerProcess], kind: FaultKind, rng: random.Random
) -> None:
    if kind == "worker_killed":
        worker = rng.choice(workers)
        worker.kill()  # SIGKILL: its activities are lost until their timeouts
        await worker.start()
    elif kind == "temporal_restarted":
        await stack.temporal.restart(down_s=TEMPORAL_DOWN_S)
    else:
        await stack.stop_postgres()
        await asyncio.sleep(POSTGRES_DOWN_S)
        await stack.start_postgres()


async def chaos(
    stack: FaultStack, workers: list[WorkerProcess], schedule: list[Strike], rng: random.Random, began: float
) -> Counter[FaultKind]:
    """Strike on schedule, one fault at a time; returns how many of each kind struck."""
    struck: Counter[FaultKind] = Counter()
    for planned in schedule:
        await asyncio.sleep(max(0.0, began + planned.at_s - time.monotonic()))
        progress(f"chaos: {planned.kind} at {time.monotonic() - began:.0f} s")
        await strike(stack, workers, planned.kind, rng)
        struck[planned.kind] += 1
    return struck


# --- after: histories and the audit chain ------------------------------------------------------------


@dataclass
class Replayed:
    replayed: int = 0
    failures: list[str] = field(default_factory=list)
    retried: int = 0  # activity attempts after a failed or lost one: faults that caught a call in flight
    tasks_lost: int = 0  # workflow tasks that timed out or failed: faults that caught a worker at work


async def replay(conversations: Sequence[Conversation]) -> Replayed:
    """Replay every conversation's history with the current workflow code, and count the activity
    attempts the faults caused (an attempt past the first)."""
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter)
    found = Replayed()
    for c in conversations:
        if c.handle is None:
            continue
        history = await c.h.fetch_history()
        found.retried += sum(
            1
            for e in history.events
            if e.HasField("activity_task_started_event_attributes")
            and e.activity_task_started_event_attributes.attempt > 1
        )
        found.tasks_lost += sum(
            1
            for e in history.events
            if e.HasField("workflow_task_timed_out_event_attributes")
            or e.HasField("workflow_task_failed_event_attributes")
        )
        try:
            await replayer.replay_workflow(history)
            found.replayed += 1
        except Exception as failed:
            found.failures.append(f"{history.workflow_id}: {type(failed).__name__}: {failed}")
    return found


async def stored_turns(stack: FaultStack, conversations: Sequence[Conversation]) -> tuple[int, int]:
    """(turns, turns that asked a person) of the soak's conversations, from the conversation store."""
    ids = [c.workflow_id for c in conversations]
    m = ConversationMessage
    async with session_factory(stack.engine)() as session:
        rows = await session.execute(
            select(m.workflow_id, m.seq, m.role, m.name, m.content.like('%"needs"%')).where(
                m.workflow_id.in_(ids)
            )
        )
        return clarifying_turns([(w, seq, role, name, bool(needs)) for w, seq, role, name, needs in rows])


async def verify_audit_chain(stack: FaultStack) -> str:
    """The tenant's audit chain checked as `audit verify --tenant acme` checks it, after the faults:
    every fact chained once, in order, and every chained row still what was chained. "" when whole,
    else the first record that does not verify (a finding: the soak exits 1)."""
    async with session_factory(stack.engine)() as session:
        try:
            await verify_live(session, "acme")
        except Broken as broken:
            return str(broken)
    return ""


# --- the run -----------------------------------------------------------------------------------------


async def measure(sizes: Sizes, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    conversations = plan(sizes.conversations, rng, run=f"soak{seed}", kinds=SOAK_KINDS)
    for c in conversations:
        c.keyed = True  # started through the inbox's front door
    schedule = chaos_schedule(rng, sizes.faults, sizes.window_s, sizes.gap_s)
    private, public = pem_pair()
    with tempfile.TemporaryDirectory(prefix="countersign-soak-") as tmp:
        root = Path(tmp)
        async with AsyncExitStack() as scope:
            stack = await scope.enter_async_context(own_stack(root, public))
            second = WorkerProcess(stack.settings, root / "worker-2", signed_env(public))
            scope.callback(second.stop)
            await second.start()
            workers = [stack.worker, second]
            signing = stack.settings.model_copy(
                update={"approver_auth": "signed", "proof_private_key": private}
            )
            inbox = Inbox(
                await scope.enter_async_context(running_server(signing, "127.0.0.1", 0, stack.client))
            )
            await prepare(stack.engine, conversations)
            stack.model.set_scenario(scenario(rules_for(conversations)))
            # two answers a conversation, and some for the calls the faults make again
            stack.model.inject(*(Fault(delay_s=rng.uniform(*THINK_S)) for _ in range(3 * len(conversations))))
            progress(f"{len(conversations)} conversations, {len(schedule)} faults, {sizes.window_s:.0f} s")
            began = time.monotonic()
            deadline = began + sizes.window_s + SETTLE_S
            spacing = sizes.window_s / max(len(conversations), 1)
            drivers = [
                converse_logged(stack, inbox, c, n * spacing, rng.uniform(0, REVIEW_S), deadline)
                for n, c in enumerate(conversations)
            ]
            striking = asyncio.create_task(chaos(stack, workers, schedule, rng, began))
            probing = asyncio.create_task(inbox.probe(began + sizes.window_s))
            await asyncio.gather(*drivers)
            struck = await striking
            await probing
            wall_s = time.monotonic() - began
            progress(f"all settled after {wall_s:.0f} s; reading the effects")
            found = await Effects.of(stack.engine, stack.smtp, conversations)
            verdict = judge(conversations, found)
            replayed = await replay(conversations)
            chain_broken = await verify_audit_chain(stack)
            turns, clarifying = await stored_turns(stack, conversations)
            rated = Counter(c.rating for c in conversations if c.rating is not None)
            success = figures(inbox.sent, len(conversations), vars(verdict), turns, clarifying, dict(rated))
    return {
        "sizes": {"conversations": sizes.conversations, "window_s": sizes.window_s, "seed": seed},
        "kinds": dict(Counter(c.kind for c in conversations)),
        "faults": {kind: struck[kind] for kind in FAULT_KINDS},
        "completed": sum(1 for e in found.values() if e.status == "COMPLETED"),
        "wall_s": round(wall_s),
        "verdict": vars(verdict),
        "replayed": replayed.replayed,
        "replay_failures": replayed.failures,
        "retried_activities": replayed.retried,
        "workflow_tasks_lost": replayed.tasks_lost,
        "audit_chain_broken": chain_broken,
        "figures": success,
    }


def section(results: dict[str, Any]) -> str:
    verdict, faults, load = results["verdict"], results["faults"], results["machine"]
    rows: list[tuple[str, str]] = [
        ("conversations", f"{results['sizes']['conversations']} ({results['completed']} completed)"),
        ("kinds", ", ".join(f"{kind} {n}" for kind, n in sorted(results["kinds"].items()))),
        *((f"faults: {kind.replace('_', ' ')}", str(faults[kind])) for kind in FAULT_KINDS),
        ("lost", str(len(verdict["lost"]))),
        ("doubled", str(len(verdict["doubled"]))),
        ("unwanted (rejected, unapproved or undone, yet there)", str(len(verdict["unwanted"]))),
        ("unexpected (any other difference)", str(len(verdict["unexpected"]))),
        (
            "histories replayed with the current code",
            f"{results['replayed']} of {results['sizes']['conversations']}",
        ),
        ("caught: activity attempts past the first", str(results["retried_activities"])),
        ("caught: workflow tasks timed out or failed", str(results["workflow_tasks_lost"])),
        (
            "audit chain (`audit verify --tenant acme`)",
            "broken" if results["audit_chain_broken"] else "verifies",
        ),
        ("wall time (first start to last conversation closed)", f"{results['wall_s']} s"),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    findings = [
        f"- {label}: {line}"
        for label in ("lost", "doubled", "unwanted", "unexpected")
        for line in verdict[label]
    ] + [f"- replay: {line}" for line in results["replay_failures"]]
    findings += [f"- audit chain: {results['audit_chain_broken']}"] if results["audit_chain_broken"] else []
    found = "\n".join(findings) if findings else "Nothing lost, doubled, unwanted or unexpected."
    success = figures_table(results["figures"]) if "figures" in results else ""
    return f"""## Soak under faults (issue 38)

`{results["command"]}` (seed {results["sizes"]["seed"]}): conversations of every kind of the fault
tests' scripts plus a read, a rejected call and a question (tests/fixtures/fault_scripts.py),
started spread over {results["sizes"]["window_s"]:.0f} s on two `python worker.py` processes, while a
chaos loop SIGKILLs one of them (and starts it again), restarts the Temporal dev server and restarts
PostgreSQL at seeded random moments. APPROVER_AUTH=signed: the conversations start, and the
reviewer (bob) decides, the user (alice) answers, rolls back and ends, through the inbox server's
HTTP API, which mints the proofs the workers verify; an action a fault interrupted is sent again
only while the conversation still waits for it. The model takes {THINK_S[0]:g} to {THINK_S[1]:g} s an
answer and the reviewer and the user up to {REVIEW_S:g} s to act, so that faults catch calls in
flight and waits span faults (the two "caught" rows count what they caught). Effects are read from
what the tools changed (tasks, lead statuses, the outbox, the SMTP catcher), the audit, the
decisions and compensations.
Machine: 2 shared cores, load average {load["load_average_at_start"]}
at the start, {load["load_average_at_end"]} at the end.

| Soak | |
|---|---|
{table}

{found}

The design's success figures in this run, beside its targets. Availability counts every request
sent to the server while the faults struck and after (each driver's action, a probe of bob's inbox
every {PROBE_EVERY_S:g} s through the window, the ratings); an answer is any status below 500. The
error rate counts the conversations with a finding above; the clarification rate, the turns that
asked a person a question (`ask_human`) or answered `needs` (the soak's mix asks by design: one kind
of {len(SOAK_KINDS)} is a question); satisfaction, the first replies the simulated user rated helpful.

{success}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="100 conversations, 50 faults")
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmark.md"))
    args = parser.parse_args()
    given = [*(["--full"] if args.full else []), *([f"--seed {args.seed}"] if args.seed != 38 else [])]
    results = recorded_run("bench.soak", given, measure(FULL if args.full else DEFAULT, args.seed))
    text = section(results)
    put_section(args.markdown, "bench.soak", text)
    print(text)
    verdict = results["verdict"]
    if any(verdict.values()) or results["replay_failures"] or results["audit_chain_broken"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
