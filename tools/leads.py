"""Lead tools: search, read, score and qualify the tenant's leads, and record their replies. Every query
is scoped to the caller's tenant; the score's rules are countersign/core/leadscore.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.effects import Creation, Effect, one_line
from countersign.core.leadscore import LeadScore
from countersign.db.leads import current_score, forget_status_change, record_lead_event, rescore
from countersign.db.schema import Lead, LeadEvent
from tools.effects import record_change
from tools.registry import Plan, ToolArgs, ToolContext, ToolFailure, UndoOutcome, compensates, record_id, tool
from tools.resolve import RowView, as_json, locked_row, restore_fields, same_text, saved

LeadStatus = Literal["new", "contacted", "qualified", "disqualified", "converted"]


class LeadView(RowView):
    id: int
    email: str
    name: str
    company: str | None
    status: str
    source: str | None
    owner: str | None = Field(validation_alias="owner_user_id")
    notes: str | None
    updated_at: datetime
    score: int | None = None  # 0-100, how promising the lead looks
    last_engaged_at: datetime | None = None  # the latest contact (an email delivered about it, say)


class LeadList(BaseModel):
    leads: list[LeadView]
    count: int


class SearchLeadsArgs(ToolArgs):
    query: str = Field(min_length=1, max_length=200, description="Part of a name, email or company")
    limit: int = Field(10, ge=1, le=50, description="Most rows to return")


class GetLeadArgs(ToolArgs):
    lead: str = Field(min_length=1, max_length=320, description="The lead's email address, or its numeric id")


class UpdateLeadStatusArgs(ToolArgs):
    lead: str = Field(min_length=1, max_length=320, description="The lead's email address, or its numeric id")
    new_status: LeadStatus = Field(description="The status to set")
    reason: str = Field(min_length=1, max_length=500, description="Why, in one sentence (kept in the audit)")


class LeadStatusChange(BaseModel):
    lead: LeadView
    previous_status: str
    new_status: str
    changed: bool  # False when the lead already had `new_status`


async def lead_by_ref(session: AsyncSession, tenant_id: str, ref: str, *, lock: bool = False) -> Lead:
    """Resolve an email or id to one of the tenant's leads, or fail with NOT_FOUND (the CLI's too).

    `lock` takes the row for the rest of the transaction (before reading a value the call will change).
    """
    query = select(Lead).where(Lead.tenant_id == tenant_id)
    number = record_id(ref)
    query = query.where(Lead.id == number) if number is not None else query.where(same_text(Lead.email, ref))
    if lock:
        query = query.with_for_update()
    lead = (await session.execute(query)).scalar_one_or_none()
    if lead is None:
        raise ToolFailure("NOT_FOUND", f"no lead {ref!r} in this workspace")
    return lead


async def find_lead(ctx: ToolContext, ref: str, *, lock: bool = False) -> Lead:
    """The caller's tenant's lead by email or id (`lead_by_ref`)."""
    return await lead_by_ref(ctx.session, ctx.tenant_id, ref, lock=lock)


@tool(risk="low", category="read")
async def search_leads(ctx: ToolContext, args: SearchLeadsArgs) -> LeadList:
    """Search the workspace's leads by name, email or company (case-insensitive substring)."""
    pattern = f"%{args.query}%"
    rows = await ctx.session.execute(
        select(Lead)
        .where(Lead.tenant_id == ctx.tenant_id)
        .where(or_(Lead.name.ilike(pattern), Lead.email.ilike(pattern), Lead.company.ilike(pattern)))
        .order_by(Lead.updated_at.desc(), Lead.id)
        .limit(args.limit)
    )
    leads = [LeadView.model_validate(lead) for lead in rows.scalars()]
    return LeadList(leads=leads, count=len(leads))


@tool(risk="low", category="read")
async def get_lead(ctx: ToolContext, args: GetLeadArgs) -> LeadView:
    """Get one lead by email address or id, with its status, owner, notes, score (0-100) and last
    engagement."""
    return LeadView.model_validate(await find_lead(ctx, args.lead))


def lead_label(lead: Lead) -> str:
    """ "Jane Doe, Doe Consulting (jane.doe@example.com)": whose lead it is, for a reviewer."""
    who = f"{lead.name}, {lead.company}" if lead.company else lead.name
    return f"{who} ({lead.email})"


def lead_named(lead: Lead) -> str:
    """A lead's canonical spelling in a plan's arguments: its email, lowercased (shared/CONTRACT.md)."""
    return lead.email.lower()


@dataclass(kw_only=True)
class LeadPlan(Plan):
    """A call about one lead, resolved (and locked, when it runs) by its plan."""

    lead: Lead


@dataclass(kw_only=True)
class LeadStatusPlan(LeadPlan):
    args: UpdateLeadStatusArgs
    previous: str  # the status the plan read: what the change starts from

    def effect(self) -> Effect:
        before, after = {"status": self.previous}, {"status": self.args.new_status}
        return record_change("lead", self.lead.id, lead_label(self.lead), before, after)


async def plan_lead_status(ctx: ToolContext, args: UpdateLeadStatusArgs) -> LeadStatusPlan:
    lead = await find_lead(ctx, args.lead, lock=ctx.lock_reads)
    return LeadStatusPlan(args=args, lead=lead, previous=lead.status, named={"lead": lead_named(lead)})


@tool(risk="high", category="write", free_args=("reason",), plan=plan_lead_status)
async def update_lead_status(ctx: ToolContext, plan: LeadStatusPlan) -> LeadStatusChange:
    """Set a lead's qualification status (new, contacted, qualified, disqualified, converted).

    `lead` is the lead's email address or id; give a short `reason`. Setting the status it already has
    changes nothing (`changed` is false). Needs a reviewer's approval unless the agent is allowed more.
    """
    lead, args = plan.lead, plan.args
    changed = plan.previous != args.new_status
    if changed:
        lead.status = args.new_status
        lead = await saved(ctx, lead)
        await record_lead_event(
            ctx.session,
            lead,
            "status_changed",
            ctx.caller.user_id,
            note=args.reason,
            previous_status=plan.previous,
        )
    return LeadStatusChange(
        lead=LeadView.model_validate(lead),
        previous_status=plan.previous,
        new_status=args.new_status,
        changed=changed,
    )


@compensates(update_lead_status)
async def restore_lead_status(
    ctx: ToolContext, args: UpdateLeadStatusArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Put the previous status back, only while the lead still has the status this call set.

    A status someone changed since is never overwritten ("irreversible": the saga shows it to a
    human). The lead's notes are not touched; the reason lives in the audit.
    """
    if result is None or not result.get("changed"):
        return "never_happened"
    lead = await locked_row(ctx, Lead, result["lead"]["id"])
    if lead is None:
        return "irreversible"
    outcome = restore_fields(lead, {"status": result["previous_status"]}, {"status": result["new_status"]})
    if outcome == "undone":  # the change never happened: its history row goes too, and the score follows
        await forget_status_change(ctx.session, lead, result["previous_status"], result["new_status"])
    return outcome


class ScorePartView(BaseModel):
    name: str
    points: int
    why: str


class LeadScoreView(BaseModel):
    lead_id: int
    email: str
    status: str
    score: int  # 0-100: the parts' sum, held within 0-100
    parts: list[ScorePartView]


def score_view(lead: Lead, scored: LeadScore) -> LeadScoreView:
    return LeadScoreView(
        lead_id=lead.id,
        email=lead.email,
        status=lead.status,
        score=scored.score,
        parts=[ScorePartView(name=p.name, points=p.points, why=p.why) for p in scored.parts],
    )


@tool(risk="low", category="read")
async def get_lead_score(ctx: ToolContext, args: GetLeadArgs) -> LeadScoreView:
    """A lead's score (0-100) with the parts that make it up: source, company, emails delivered,
    replies, meetings booked, status and status history. Use it to rank and qualify leads, and quote
    the parts that decide."""
    lead = await find_lead(ctx, args.lead)
    return score_view(lead, await current_score(ctx.session, lead))


class RecordReplyArgs(ToolArgs):
    lead: str = Field(min_length=1, max_length=320, description="The lead's email address, or its numeric id")
    summary: str = Field(min_length=1, max_length=500, description="What the lead answered, in one sentence")


class RecordedReply(LeadScoreView):
    event_id: int
    # the lead's last engagement before and after (as JSON), so the undo can put it back
    previous: dict[str, Any]
    changed: dict[str, Any]


@dataclass(kw_only=True)
class ReplyPlan(LeadPlan):
    args: RecordReplyArgs

    def effect(self) -> Effect:
        """The reply recorded on the lead (its last engagement becomes the moment the call runs, and
        its score follows: derived, not part of the effect)."""
        label, summary = lead_label(self.lead), self.args.summary
        reply = Creation(kind="lead event", label=f"reply from {label}", fields={"summary": summary})
        return Effect(summary=one_line(f"Records a reply from {label}: {summary}"), creates=[reply])


async def plan_lead_reply(ctx: ToolContext, args: RecordReplyArgs) -> ReplyPlan:
    lead = await find_lead(ctx, args.lead, lock=ctx.lock_reads)
    return ReplyPlan(args=args, lead=lead, named={"lead": lead_named(lead)})


@tool(risk="low", category="write", plan=plan_lead_reply)
async def record_lead_reply(ctx: ToolContext, plan: ReplyPlan) -> RecordedReply:
    """Record that a lead answered (an email reply, say, as the user reports it); the lead's score
    and last engagement are updated and the new score returned with its parts."""
    lead, args = plan.lead, plan.args
    previous = {"last_engaged_at": as_json(lead.last_engaged_at)}
    event, scored = await record_lead_event(
        ctx.session, lead, "email_answered", ctx.caller.user_id, note=args.summary
    )
    changed = {"last_engaged_at": as_json(lead.last_engaged_at)}
    return RecordedReply(
        **score_view(lead, scored).model_dump(), event_id=event.id, previous=previous, changed=changed
    )


@compensates(record_lead_reply)
async def forget_lead_reply(
    ctx: ToolContext, args: RecordReplyArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Delete the recorded reply (nothing left the building), put the lead's previous
    `last_engaged_at` back unless a later contact stamped it since, and rescore the lead."""
    if result is None:
        return "never_happened"
    deleted = await ctx.session.scalar(
        delete(LeadEvent)
        .where(LeadEvent.id == int(result["event_id"]), LeadEvent.tenant_id == ctx.tenant_id)
        .returning(LeadEvent.lead_id)
    )
    lead = await locked_row(ctx, Lead, deleted) if deleted is not None else None
    if lead is None:
        return "already_undone"
    restore_fields(lead, result["previous"], result["changed"])  # a later contact's stamp stays
    await rescore(ctx.session, lead)
    return "undone"
