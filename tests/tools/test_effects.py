"""Every write is a plan and its application (tools/registry.py `Plan`), and the plan's effect is
what a reviewer decides.

The catalog is checked as a whole: no write without a plan, a sample call for every tool that is
not a read, and for each sample the plan changes nothing, resolves the arguments against the
seeded data, and its effect names what then runs (the records' fields after the call, the emails
queued).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import delete, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from activities.approvals import ApprovalActivities
from activities.notifications import wording
from countersign.cli.approvals import shown_pending
from countersign.core.approvals import ApprovalNotice, RecordedApproval
from countersign.core.calls import CallerContext
from countersign.core.effects import (
    Effect,
    FieldChange,
    OutgoingMessage,
    RecordChange,
    arguments_effect,
    effect_lines,
    effect_warnings,
)
from countersign.db import schema
from countersign.db.engine import session_factory
from tools import REGISTRY
from tools.arguments import parse_arguments
from tools.registry import Needs, Plan, ToolArgs, ToolContext, tool
from tools.resolve import as_json

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)  # a Monday, before business hours


def context(session: AsyncSession, user: str = "alice", roles: tuple[str, ...] = ("sales",)) -> ToolContext:
    caller = CallerContext(tenant_id="acme", user_id=user, roles=list(roles), agent="test")
    return ToolContext(caller=caller, session=session, workflow_id="wf-effects", call_id="c1", now=NOW)


async def planned_effect(ctx: ToolContext, name: str, raw: dict[str, Any]) -> Effect:
    """The effect of the call's plan: what a reviewer is shown."""
    return (await REGISTRY[name].plan(ctx, parse_arguments(REGISTRY[name], raw))).effect()


# --- the pure model --------------------------------------------------------------------------------


def test_the_digest_is_canonical_and_covers_every_part() -> None:
    change = RecordChange(
        kind="lead", id="1", label="Jane", fields={"status": FieldChange(before="new", after="qualified")}
    )
    effect = Effect(summary="Jane: status new → qualified", changes=[change])
    reordered = Effect.model_validate_json(effect.model_dump_json())
    assert reordered.digest == effect.digest and len(effect.digest) == 64
    other = change.model_copy(update={"fields": {"status": FieldChange(before="new", after="converted")}})
    assert Effect(summary=effect.summary, changes=[other]).digest != effect.digest
    assert Effect(summary=effect.summary, changes=[change], resolved=False).digest != effect.digest
    assert effect.canonical().startswith('{"arguments":null,"changes":[{"deleted":false,')


def test_an_mcp_tools_effect_is_its_arguments_not_resolved() -> None:
    effect = arguments_effect("files.write", {"path": "/tmp/x", "text": "hi"})
    assert not effect.resolved and effect.arguments == {"path": "/tmp/x", "text": "hi"}
    assert "not resolved" in effect.summary and not effect.changes_nothing


LOOKALIKE = "partner@ex\u0430mple.org"  # with U+0430 CYRILLIC SMALL LETTER A
MAIL = Effect(
    summary="Sends draft 1: Email to partner@example.org: “Our proposal”",
    messages=[
        OutgoingMessage(
            channel="email",
            to=[LOOKALIKE],
            subject="Our proposal",
            body="Dear partner,\nhere\u202e it is.",
        )
    ],
)
ARGS = '{"draft": 1}'


def test_an_effect_is_shown_line_by_line_with_hidden_characters_visible() -> None:
    lines = effect_lines(MAIL)
    assert lines == [
        MAIL.summary,
        f"  sends email to {LOOKALIKE}",
        "    subject: Our proposal",
        "    body:",
        "      Dear partner,",
        "      here⟨U+202E⟩ it is.",
    ]
    warnings = effect_warnings(MAIL)
    assert any("email to" in w and "CYRILLIC" in w for w in warnings), warnings
    assert any("body" in w and "U+202E" in w for w in warnings), warnings


def test_the_notice_and_approvals_list_show_the_effect_before_the_arguments() -> None:
    notice = ApprovalNotice(
        tenant_id="acme",
        workflow_id="wf",
        call_id="c1",
        tool="send_draft",
        args=ARGS,
        risk="high",
        requested_by="alice",
        expires_at=NOW,
        kind="request",
    )
    _, text = wording(notice, "http://inbox", MAIL)
    assert (
        text.index("Sends draft 1") < text.index("      Dear partner,") < text.index("Arguments:\n  draft: 1")
    )
    assert "Check: effect: email to" in text
    row = {
        "workflow_id": "wf",
        "call_id": "c1",
        "tool": "send_draft",
        "args": ARGS,
        "risk": "high",
        "requested_by": "alice",
        "requested_at": NOW.isoformat(),
        "expires_at": NOW.isoformat(),
    }
    shown = shown_pending(row, MAIL)
    assert shown.index("    Sends draft 1") < shown.index("    arguments:\n      draft: 1")
    assert "⚠ effect: email to" in shown
    assert "arguments:" not in shown_pending(row, None)  # a request from before effects: as before


# --- the registry protocol --------------------------------------------------------------------------


class ProbeArgs(ToolArgs):
    note: str


class OtherArgs(ToolArgs):
    other: str


class Probe(BaseModel):
    ok: bool


async def probe(ctx: ToolContext, args: ProbeArgs) -> Probe:
    return Probe(ok=True)


@dataclass(kw_only=True)
class ProbePlan(Plan):
    def effect(self) -> Effect:
        return Effect(summary="probe")


async def plan_other(ctx: ToolContext, args: OtherArgs) -> ProbePlan:
    return ProbePlan(args=args)


def sync_plan(ctx: ToolContext, args: ProbeArgs) -> ProbePlan:
    return ProbePlan(args=args)


async def untyped_plan(ctx: ToolContext, args: ProbeArgs) -> Effect:
    return Effect(summary="an Effect, not a plan")


async def plan_probe(ctx: ToolContext, args: ProbeArgs) -> ProbePlan:
    return ProbePlan(args=args)


async def apply_probe(ctx: ToolContext, plan: ProbePlan) -> Probe:
    return Probe(ok=True)


def test_a_write_cannot_be_registered_without_a_plan_for_its_arguments() -> None:
    register: Callable[..., Any] = tool
    with pytest.raises(TypeError, match="plan"):
        register(risk="low", category="write")(probe)
    for wrong in (sync_plan, untyped_plan):
        with pytest.raises(TypeError, match="plan"):
            register(risk="low", category="write", plan=wrong)(apply_probe)
    with pytest.raises(TypeError, match="ProbeArgs"):  # the plan's arguments are OtherArgs
        register(risk="low", category="write", plan=plan_other)(probe)
    with pytest.raises(TypeError, match="applies"):  # the body takes arguments, not the plan
        register(risk="low", category="write", plan=plan_probe)(probe)
    with pytest.raises(TypeError, match="plan"):  # a read has none: its plan is its arguments
        register(risk="low", category="read", plan=plan_probe)(apply_probe)
    assert "probe" not in REGISTRY and "apply_probe" not in REGISTRY


def test_every_write_declares_a_plan_and_no_preview_remains() -> None:
    """The registry test of the construction: a write is a plan and its application, a read its
    body; no tool carries a separate preview, and every write is sampled below."""
    readers = {name for name, t in REGISTRY.items() if t.category == "read"}
    assert all(REGISTRY[name].planner is None for name in readers)
    changers = set(REGISTRY) - readers
    assert not [name for name in changers if REGISTRY[name].planner is None]
    assert not [name for name, t in REGISTRY.items() if hasattr(t, "preview")]
    assert {sample.tool for sample in SAMPLES} == changers


# --- a sample call of every tool that changes something ---------------------------------------------


@dataclass(frozen=True)
class Sample:
    tool: str
    raw: dict[str, Any]
    summary: str  # a part of the summary line
    user: str = "alice"
    roles: tuple[str, ...] = ("sales",)
    setup: Callable[[AsyncSession], Awaitable[dict[str, Any]]] | None = None  # extra raw arguments

    @property
    def id(self) -> str:
        return self.tool


async def a_draft(session: AsyncSession) -> dict[str, Any]:
    draft = schema.EmailDraft(
        tenant_id="acme",
        idempotency_key="effects-draft",
        created_by="alice",
        to_address="partner@example.org",
        subject="Our proposal",
        body="Dear partner, here it is.",
    )
    session.add(draft)
    await session.flush()
    return {"draft": draft.id}


async def a_chat_channel(session: AsyncSession) -> dict[str, Any]:
    session.add(
        schema.ChatChannel(tenant_id="acme", kind="slack", endpoint="https://hooks.invalid/x", name="#sales")
    )
    await session.flush()
    return {}


async def a_proposal_to_bob(session: AsyncSession) -> dict[str, Any]:
    proposal = await REGISTRY["schedule_meeting"].run(
        context(session),
        parse_arguments(REGISTRY["schedule_meeting"], {"with": "bob", "duration_minutes": 30}),
    )
    assert not isinstance(proposal, Needs)
    return {"session": proposal.model_dump()["session"]}


async def a_task_id(session: AsyncSession) -> dict[str, Any]:
    task = await session.scalar(select(schema.Task.id).where(schema.Task.title == "Review pricing page"))
    return {"id": task}


SAMPLES = [
    Sample(
        "update_lead_status",
        {"lead": "jane.doe@example.com", "new_status": "qualified", "reason": "Budget confirmed"},
        "Jane Doe, Doe Consulting (jane.doe@example.com): status new → qualified",
    ),
    Sample(
        "record_lead_reply", {"lead": "jane.doe@example.com", "summary": "Wants a call"}, "reply from Jane"
    ),
    Sample("update_case", {"case": "Umbrella Health renewal", "status": "on_hold"}, "status open → on_hold"),
    Sample(
        "send_chat_message",
        {"text": "Deal closed"},
        "slack channel #sales: Deal closed",
        setup=a_chat_channel,
    ),
    Sample(
        "update_draft", {"to": "other@example.org"}, "to_address partner@example.org → other@", setup=a_draft
    ),
    Sample("send_draft", {}, "Email to partner@example.org: “Our proposal”", setup=a_draft),
    Sample(
        "send_email",
        {"to": "jane.doe@example.com", "subject": "Hello", "body": "Hi Jane", "lead": "jane.doe@example.com"},
        "Email to jane.doe@example.com about Jane Doe, Doe Consulting",
    ),
    Sample("draft_email", {"to": "x@example.org", "subject": "Hi", "body": "Hello"}, "Saves a draft"),
    Sample(
        "send_email_to_contact",
        {"contact": "Priya Nair", "subject": "Hi", "body": "Hello"},
        "Email to priya.nair@acmepartners.example about Priya Nair",
    ),
    Sample("resolve_notification", {"notification": "Maria Garcia"}, "status open → resolved"),
    Sample("create_task", {"title": "Call Jane", "assignee": "bob"}, "Creates task “Call Jane”"),
    Sample("update_task", {"task": "Review pricing page", "status": "done"}, "status open → done"),
    Sample("create_project", {"name": "Holiday push"}, "Creates project “Holiday push”"),
    Sample("update_project", {"project": "CRM data cleanup", "status": "active"}, "status on_hold → active"),
    Sample(
        "create_event",
        {"title": "Demo", "starts_at": "2026-12-09T10:00:00Z", "ends_at": "2026-12-09T11:00:00Z"},
        "Creates meeting “Demo”",
    ),
    Sample("update_event", {"event": "Website relaunch standup", "location": "Room 3"}, "Room 2 → Room 3"),
    Sample(
        "write_record",
        {"collection": "tasks", "values": {"status": "in_progress"}},
        "tasks",
        user="carol",
        roles=("admin",),
        setup=a_task_id,
    ),
    Sample("schedule_meeting", {"with": "bob", "duration_minutes": 30}, "Proposes 5 times to Bob Brennan"),
    Sample(
        "confirm_meeting",
        {"with": "samuel.lee@umbrella.example", "starts_at": "2026-12-08T10:00:00Z", "duration_minutes": 45},
        "Books “Meeting: Alice Anders / Sam Lee”",
    ),
    Sample("accept_meeting", {"selection": 1}, "Books", user="bob", setup=a_proposal_to_bob),
]


async def fingerprint(session: AsyncSession) -> dict[str, str]:
    """Every table's rows, hashed: a plan must leave all of them as they were."""
    sums = {}
    for table in schema.Base.metadata.sorted_tables:
        query = f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM \"{table.name}\" t"
        sums[table.name] = str(await session.scalar(text(query)))
    return sums


async def sample_context(session: AsyncSession, sample: Sample) -> tuple[ToolContext, dict[str, Any]]:
    raw = sample.raw | (await sample.setup(session) if sample.setup else {})
    return context(session, sample.user, sample.roles), raw


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
async def test_a_plan_resolves_the_call_and_changes_nothing(db_session: AsyncSession, sample: Sample) -> None:
    ctx, raw = await sample_context(db_session, sample)
    before = await fingerprint(db_session)
    effect = await planned_effect(ctx, sample.tool, raw)
    assert await fingerprint(db_session) == before
    assert effect.problem is None and effect.resolved and not effect.changes_nothing, effect
    assert sample.summary in effect.summary, effect.summary
    assert (
        await planned_effect(ctx, sample.tool, raw)
    ).digest == effect.digest  # nothing changed: same effect


MODELS: dict[str, type[schema.Base]] = {
    "lead": schema.Lead,
    "case": schema.Case,
    "draft": schema.EmailDraft,
    "notification": schema.Notification,
    "task": schema.Task,
    "project": schema.Project,
    "event": schema.CalendarEvent,
    "meeting proposal": schema.MeetingSession,
}


# send_chat_message posts over HTTP in its own transactions: tests/tools/test_chat_channel.py runs it
RUNNABLE = [sample for sample in SAMPLES if sample.tool != "send_chat_message"]


@pytest.mark.parametrize("sample", RUNNABLE, ids=lambda s: s.id)
async def test_what_runs_is_what_the_plan_said(db_session: AsyncSession, sample: Sample) -> None:
    """Each changed record holds the planned `after` values once the call ran, and each email the
    effect showed is queued with the same recipient, subject and body."""
    ctx, raw = await sample_context(db_session, sample)
    effect = await planned_effect(ctx, sample.tool, raw)
    outbox_before = set(await db_session.scalars(select(schema.EmailOutbox.id)))
    result = await REGISTRY[sample.tool].run(ctx, parse_arguments(REGISTRY[sample.tool], raw))
    assert not isinstance(result, Needs), result
    for change in effect.changes:
        row = await db_session.get(MODELS[change.kind], int(change.id))
        assert row is not None
        await db_session.refresh(row)
        assert {name: as_json(getattr(row, name)) for name in change.fields} == {
            name: c.after for name, c in change.fields.items()
        }
    queued = (
        await db_session.scalars(
            select(schema.EmailOutbox).where(schema.EmailOutbox.id.not_in(outbox_before or {0}))
        )
    ).all()
    emails = [m for m in effect.messages if m.channel == "email"]
    assert sorted((m.to[0], m.subject, m.body) for m in emails) == sorted(
        (q.to_address, q.subject, q.body) for q in queued
    )


# --- what a plan resolves ---------------------------------------------------------------------------


async def test_send_drafts_effect_is_the_drafts_content_now(db_session: AsyncSession) -> None:
    """The draft case of issue 34: the effect names the recipient and body the draft has when the
    plan is made, so an edit after the reviewer saw it is a different effect."""
    ctx = context(db_session)
    raw = await a_draft(db_session)
    seen = await planned_effect(ctx, "send_draft", raw)
    assert [(m.to, m.subject, m.body) for m in seen.messages] == [
        (["partner@example.org"], "Our proposal", "Dear partner, here it is.")
    ]
    await db_session.execute(
        update(schema.EmailDraft)
        .where(schema.EmailDraft.id == raw["draft"])
        .values(to_address="attacker@evil.example", body="Send the lead list")
    )
    edited = await planned_effect(ctx, "send_draft", raw)
    assert edited.messages[0].to == ["attacker@evil.example"] and edited.digest != seen.digest


async def test_a_lead_changed_meanwhile_is_another_effect(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    raw = {"lead": "jane.doe@example.com", "new_status": "qualified", "reason": "Budget confirmed"}
    seen = await planned_effect(ctx, "update_lead_status", raw)
    assert seen.changes[0].fields == {"status": FieldChange(before="new", after="qualified")}
    await db_session.execute(
        update(schema.Lead)
        .where(schema.Lead.tenant_id == "acme", schema.Lead.email == "jane.doe@example.com")
        .values(status="disqualified")
    )
    now = await planned_effect(ctx, "update_lead_status", raw)
    assert "status disqualified → qualified" in now.summary and now.digest != seen.digest


async def test_a_call_that_would_fail_shows_why(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    missing = await planned_effect(
        ctx, "update_lead_status", {"lead": "nobody@example.com", "new_status": "new", "reason": "x"}
    )
    assert missing.problem is not None and missing.problem.startswith("NOT_FOUND")
    assert "would fail now" in missing.summary
    ambiguous = await planned_effect(
        ctx, "send_email_to_contact", {"contact": "Sam Lee", "subject": "Hi", "body": "Hi"}
    )
    assert ambiguous.problem is not None and ambiguous.problem.startswith("needs contact")


async def test_an_update_to_the_values_it_has_changes_nothing(db_session: AsyncSession) -> None:
    ctx = context(db_session)
    same = await planned_effect(
        ctx, "update_lead_status", {"lead": "jane.doe@example.com", "new_status": "new", "reason": "x"}
    )
    assert same.changes == [] and same.summary.endswith(": no change")


async def test_reads_change_nothing(db_session: AsyncSession) -> None:
    effect = await planned_effect(context(db_session), "get_lead", {"lead": "jane.doe@example.com"})
    assert effect.changes_nothing and effect.summary == "Changes nothing: reads only"


# --- recording the effect with the approval request ---------------------------------------------------


def approval_request(call_id: str, tool: str, args: dict[str, Any]) -> RecordedApproval:
    return RecordedApproval(
        tenant_id="acme",
        workflow_id="wf-effects",
        conversation_id="run-effects",
        call_id=call_id,
        tool=tool,
        risk=REGISTRY[tool].risk,
        nonce="n",
        agent="lead-qualifier",
        args=json.dumps(args),
        requested_by="alice",
        requested_at=NOW,
        expires_at=NOW,
    )


async def recorded(engine: AsyncEngine, call_id: str) -> tuple[Effect, str]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(schema.ApprovalRequest.effect, schema.ApprovalRequest.effect_sha256).where(
                    schema.ApprovalRequest.conversation_id == "run-effects",
                    schema.ApprovalRequest.call_id == call_id,
                )
            )
        ).one()
    return Effect.model_validate(row.effect), row.effect_sha256


async def broken_plan(ctx: ToolContext, args: ToolArgs) -> Plan:
    await ctx.session.execute(text("SELECT 1/0"))  # PostgreSQL refuses it: the transaction is lost
    raise AssertionError("unreachable")


async def test_the_request_is_recorded_with_its_effect_even_when_the_plan_breaks(
    db_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    activities = ApprovalActivities(session_factory(db_engine))
    raw = {"lead": "jane.doe@example.com", "new_status": "qualified", "reason": "x"}
    try:
        await activities.record_approval_request(approval_request("c1", "update_lead_status", raw))
        effect, digest = await recorded(db_engine, "c1")
        assert effect.changes[0].fields["status"].after == "qualified" and digest == effect.digest

        broken = replace(REGISTRY["update_lead_status"], planner=broken_plan)
        monkeypatch.setitem(REGISTRY, "update_lead_status", broken)
        await activities.record_approval_request(approval_request("c2", "update_lead_status", raw))
        effect, digest = await recorded(db_engine, "c2")
        assert not effect.resolved and effect.arguments == raw and digest == effect.digest
        assert effect.problem is not None and effect.problem.startswith("INTERNAL_ERROR")
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(
                delete(schema.ApprovalRequest).where(schema.ApprovalRequest.conversation_id == "run-effects")
            )
