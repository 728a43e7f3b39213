"""What resolving a call's effect costs a call that waits for a decision (issue 34).

    .venv/bin/python -m bench.effects [--calls 200]

Against a migrated, seeded PostgreSQL (embedded, as the tests use it), one call at a time: for
representative gated tools, `record_approval_request` (the activity that records what reviewers
see) is run as the worker runs it, with the effect resolved by the tool's preview, and the preview
alone (`ApprovalActivities.resolve_effect`: roles, validation, the preview, the digest) is
timed in its own transaction. Calls that need no decision never reach that activity: nothing is
added to them. Writes the `bench.effects` section of docs/benchmark.md (bench/sections.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, event, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from activities.approvals import ApprovalActivities
from bench import stack
from bench.sections import put_section, recorded_run
from countersign.core.approvals import RecordedApproval
from countersign.core.authority import ADMIN
from countersign.core.calls import CallerContext
from countersign.db import schema
from countersign.db.engine import create_engine, session_factory
from tools import REGISTRY
from tools.arguments import parse_arguments
from tools.registry import Needs, ToolContext

SECTION = "bench.effects"
TARGET_P50_MS = 5.0
BENCH = "bench-effects"  # the workflow id and idempotency keys of what this module writes


async def setup(sessions: async_sessionmaker[AsyncSession]) -> dict[str, dict[str, Any]]:
    """A draft to send and carol's meeting proposal to bob: the arguments of the calls below."""
    async with sessions() as session, session.begin():
        draft = schema.EmailDraft(
            tenant_id="acme",
            idempotency_key=BENCH,
            created_by="alice",
            to_address="partner@example.org",
            subject="Our proposal",
            body="Dear partner,\nhere is our proposal.",
        )
        session.add(draft)
        await session.flush()
        carol = CallerContext(tenant_id="acme", user_id="carol", roles=[ADMIN], agent="scheduler")
        ctx = ToolContext(carol, session, BENCH, "setup", datetime.now(UTC))
        schedule = REGISTRY["schedule_meeting"]
        later = ctx.now + timedelta(days=14)  # every proposed time stays in the future while this runs
        window = {"window_start": later.isoformat(), "window_end": (later + timedelta(days=5)).isoformat()}
        asked = {"with": "bob", "duration_minutes": 30} | window
        proposal = await schedule.run(ctx, parse_arguments(schedule, asked))
        assert not isinstance(proposal, Needs)
        return {"draft": {"draft": draft.id}, "proposal": {"session": proposal.model_dump()["session"]}}


def calls(made: dict[str, dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(tool, requester, arguments): one row, one draft, a contact by name, a task by title, people
    for an event, both calendars for a booking and for a week of proposals."""
    week = datetime.now(UTC).replace(hour=10, minute=0, second=0, microsecond=0) + timedelta(days=10)
    later = (week + timedelta(hours=1)).isoformat()
    status = {"lead": "jane.doe@example.com", "new_status": "qualified", "reason": "x"}
    event = {"title": "Demo", "starts_at": week.isoformat(), "ends_at": later, "attendees": ["bob", "carol"]}
    booking = {"with": "samuel.lee@umbrella.example", "starts_at": week.isoformat(), "duration_minutes": 45}
    return [
        ("update_lead_status", "alice", status),
        ("send_draft", "alice", made["draft"]),
        ("send_email_to_contact", "alice", {"contact": "Priya Nair", "subject": "Hi", "body": "Hello"}),
        ("update_task", "alice", {"task": "Review pricing page", "status": "done"}),
        ("create_event", "alice", event),
        ("confirm_meeting", "alice", booking),
        ("accept_meeting", "bob", {"selection": 1} | made["proposal"]),
        ("schedule_meeting", "alice", {"with": "bob", "duration_minutes": 30}),
    ]


def request(tool: str, user: str, args: dict[str, Any], call_id: str) -> RecordedApproval:
    now = datetime.now(UTC)
    return RecordedApproval(
        tenant_id="acme",
        workflow_id=BENCH,
        conversation_id=BENCH,
        call_id=call_id,
        tool=tool,
        risk=REGISTRY[tool].risk,
        nonce=uuid.uuid4().hex,
        agent="bench",
        args=json.dumps(args),
        requested_by=user,
        requested_at=now,
        expires_at=now + timedelta(hours=1),
    )


async def round_trip(session: AsyncSession) -> float:
    """Milliseconds of one `SELECT 1` in `session`'s open transaction: this moment's unit of a query
    (the machine is shared: measured beside every preview, not once)."""
    started = time.perf_counter()
    await session.scalar(select(1))
    return (time.perf_counter() - started) * 1000


class Statements:
    """Counts the statements an engine sends: the preview's round trips, which the load does not move."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.sent = 0
        event.listen(engine.sync_engine, "before_cursor_execute", self.count)

    def count(self, *_: Any) -> None:
        self.sent += 1


async def measure(
    sessions: async_sessionmaker[AsyncSession], statements: Statements, n: int
) -> dict[str, dict[str, list[float]]]:
    """The tools take turns, one call each per round: the machine's load falls on all of them alike."""
    activities = ApprovalActivities(sessions)
    todo = calls(await setup(sessions))
    results: dict[str, dict[str, list[float]]] = {
        tool: {"preview": [], "cpu": [], "recorded": [], "select_1": [], "statements": []}
        for tool, _, _ in todo
    }
    for i in range(n + 5):  # the first five rounds warm the caches and the pool, and are not counted
        for tool, user, args in todo:
            asked = request(tool, user, args, f"{tool}-{i}")
            async with sessions() as session, session.begin():
                sent, started, cpu = statements.sent, time.perf_counter(), time.process_time()
                effect = await activities.resolve_effect(session, asked)
                took, cpu = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
                sent = statements.sent - sent
                query = await round_trip(session)
            assert effect.resolved and effect.problem is None, (tool, effect)
            started = time.perf_counter()
            await activities.record_approval_request(asked)
            whole = (time.perf_counter() - started) * 1000
            if i >= 5:
                for name, value in (
                    ("preview", took),
                    ("cpu", cpu),
                    ("recorded", whole),
                    ("select_1", query),
                    ("statements", sent),
                ):
                    results[tool][name].append(value)
    async with sessions() as session, session.begin():  # what this run wrote
        await session.execute(
            delete(schema.ApprovalRequest).where(schema.ApprovalRequest.workflow_id == BENCH)
        )
        await session.execute(delete(schema.EmailDraft).where(schema.EmailDraft.idempotency_key == BENCH))
        bench_sessions = select(schema.MeetingSession.notification_id).where(
            schema.MeetingSession.idempotency_key.startswith(BENCH)
        )
        await session.execute(delete(schema.Notification).where(schema.Notification.id.in_(bench_sessions)))
        await session.execute(
            delete(schema.MeetingSession).where(schema.MeetingSession.idempotency_key.startswith(BENCH))
        )
        await session.execute(
            delete(schema.EmailOutbox).where(schema.EmailOutbox.idempotency_key.startswith(BENCH))
        )
    return results


async def collect(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-effects-") as root:
        async with stack.postgres(Path(root)) as url:
            engine = create_engine(url)
            try:
                samples = await measure(session_factory(engine), Statements(engine), n)
            finally:
                await engine.dispose()
    return {"calls": n, "samples": samples}


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


def section(results: dict[str, Any]) -> str:
    machine = results["machine"]
    load = ", ".join(f"{x:.2f}" for x in machine["load_average_at_end"])
    lines = [
        "## Effects: what resolving a gated call's effect costs (`python -m bench.effects`)",
        "",
        "Issue 34: a call that waits for a decision is recorded with its effect, resolved read-only by "
        "the tool's preview inside `record_approval_request` (the workflow's commands are unchanged). "
        "*Preview*: `ApprovalActivities.resolve_effect` alone (the requester's roles, validation, "
        "the preview's queries, the digest), in its own transaction; *recorded*: the whole "
        "activity as the worker runs it (a transaction, the preview, the insert). Embedded "
        f"PostgreSQL on this machine, one call at a time, the tools taking turns, {results['calls']} "
        f"calls per tool after 5 warm-up rounds. Target: preview p50 ≤ {TARGET_P50_MS:g} ms. The "
        "machine is shared (2 cores, other work running; load average at the start "
        f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}, at the end {load}): "
        "absolute numbers move from run to run, the share of the activity is what compares.",
        "",
        "| tool | what the preview reads | preview p50 ms | preview p95 ms | its CPU p50 ms "
        "| recorded p50 ms | preview / recorded | preview / `SELECT 1` | statements |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    reads = {
        "update_lead_status": "one lead",
        "send_draft": "one draft",
        "send_email_to_contact": "contacts by name",
        "update_task": "one task by title",
        "create_event": "two people",
        "confirm_meeting": "two people, both calendars, time zones",
        "accept_meeting": "the proposal, its requester, both calendars, its notification",
        "schedule_meeting": "two people, a week of both calendars, open proposals",
    }
    samples = results["samples"]
    over = []
    for tool, s in samples.items():
        p50, recorded = statistics.median(s["preview"]), statistics.median(s["recorded"])
        unit = statistics.median(s["select_1"])
        if p50 > TARGET_P50_MS:
            over.append(tool)
        lines.append(
            f"| {tool} | {reads.get(tool, '')} | {p50:.2f} | {percentile(s['preview'], 95):.2f} "
            f"| {statistics.median(s['cpu']):.2f} "
            f"| {recorded:.2f} | {p50 / recorded:.0%} | {p50 / unit:.1f} "
            f"| {statistics.median(s['statements']):g} |"
        )
    every = [x for s in samples.values() for x in s["preview"]]
    lines += [
        "",
        f"All tools together: preview p50 {statistics.median(every):.2f} ms, "
        f"p95 {percentile(every, 95):.2f} ms"
        + (f"; over the target: {', '.join(over)}." if over else "; every tool within the target."),
        "*Its CPU*: this process's CPU time during the preview (Python: validation, the ORM, the "
        "preview's own work, the digest; PostgreSQL's is not in it), which other processes on the "
        "machine move least. The last column divides the preview's p50 by the p50 of one `SELECT 1` "
        "round trip timed in the same transaction right after each preview: the preview in queries' "
        "worth. *Statements*: what the preview sends to PostgreSQL (the requester's roles included).",
        "A call that needs no decision never runs `record_approval_request`: no preview, nothing "
        "added. "
        "(Re-resolving the effect when an approved call runs is the execution side's, measured there.)",
        "",
        f"Command: `{results['command']}`.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    n = parser.parse_args().calls
    results = recorded_run("bench.effects", [f"--calls {n}"], collect(n))
    text = section(results)
    print(text)
    put_section(Path("docs/benchmark.md"), SECTION, text)


if __name__ == "__main__":
    main()
