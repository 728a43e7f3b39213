"""Lead tools: search and read the tenant's leads. Every query is scoped to the caller's tenant."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import or_, select

from countersign.db.schema import Lead
from tools.registry import ToolArgs, ToolContext, ToolFailure, tool


class LeadView(BaseModel):
    id: int
    email: str
    name: str
    company: str | None
    status: str
    source: str | None
    owner: str | None
    notes: str | None
    updated_at: datetime

    @classmethod
    def of(cls, lead: Lead) -> LeadView:
        return cls(
            id=lead.id,
            email=lead.email,
            name=lead.name,
            company=lead.company,
            status=lead.status,
            source=lead.source,
            owner=lead.owner_user_id,
            notes=lead.notes,
            updated_at=lead.updated_at,
        )


class LeadList(BaseModel):
    leads: list[LeadView]
    count: int


class SearchLeadsArgs(ToolArgs):
    query: str = Field(min_length=1, max_length=200, description="Part of a name, email or company")
    limit: int = Field(10, ge=1, le=50, description="Most rows to return")


class GetLeadArgs(ToolArgs):
    lead: str = Field(min_length=1, max_length=320, description="The lead's email address, or its numeric id")


async def find_lead(ctx: ToolContext, ref: str) -> Lead:
    """Resolve an email or id to one of the caller's tenant's leads, or fail with NOT_FOUND."""
    query = select(Lead).where(Lead.tenant_id == ctx.tenant_id)
    query = query.where(Lead.id == int(ref)) if ref.isdigit() else query.where(Lead.email.ilike(ref))
    lead = (await ctx.session.execute(query)).scalar_one_or_none()
    if lead is None:
        raise ToolFailure("NOT_FOUND", f"no lead {ref!r} in this workspace")
    return lead


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
    leads = [LeadView.of(lead) for lead in rows.scalars()]
    return LeadList(leads=leads, count=len(leads))


@tool(risk="low", category="read")
async def get_lead(ctx: ToolContext, args: GetLeadArgs) -> LeadView:
    """Get one lead by email address or id, with its status, owner and notes."""
    return LeadView.of(await find_lead(ctx, args.lead))
