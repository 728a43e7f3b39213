"""A lead's score kept current: the facts behind it gathered from the tables that hold them.

Every place that records an engagement (an email delivered, a reply, a meeting booked or moved, a
status changed) calls `rescore` in its own transaction, so `leads.score` never disagrees with the
rows it was computed from. The rules themselves are `countersign/core/leadscore.py`.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.leadscore import LeadFacts, LeadScore, score_lead
from countersign.db.schema import CalendarEvent, EmailOutbox, Lead, LeadEvent

# Calendar entries that count as a meeting booked with a lead (a deadline or reminder does not).
MEETING_TYPES = ("meeting", "call", "demo")


async def lead_facts(session: AsyncSession, lead: Lead) -> LeadFacts:
    # attendees are written as people typed them: the lead's address is matched case-insensitively
    attendee = func.jsonb_array_elements_text(CalendarEvent.attendees).table_valued("value")
    delivered = await session.scalar(
        select(func.count()).where(
            EmailOutbox.tenant_id == lead.tenant_id,
            EmailOutbox.lead_id == lead.id,
            EmailOutbox.status == "sent",
        )
    )
    meetings = await session.scalar(
        select(func.count()).where(
            CalendarEvent.tenant_id == lead.tenant_id,
            CalendarEvent.status != "cancelled",
            CalendarEvent.type.in_(MEETING_TYPES),
            exists().where(func.lower(attendee.c.value) == lead.email.lower()),
        )
    )
    events = (
        await session.execute(
            select(LeadEvent.kind, LeadEvent.previous_status, LeadEvent.status)
            .where(LeadEvent.tenant_id == lead.tenant_id, LeadEvent.lead_id == lead.id)
            .order_by(LeadEvent.id)
        )
    ).all()
    return LeadFacts(
        status=lead.status,
        source=lead.source,
        company=lead.company,
        emails_delivered=delivered or 0,
        emails_answered=sum(1 for e in events if e.kind == "email_answered"),
        meetings_booked=meetings or 0,
        status_changes=tuple(
            (e.previous_status or "", e.status or "") for e in events if e.kind == "status_changed"
        ),
    )


async def current_score(session: AsyncSession, lead: Lead) -> LeadScore:
    """The score the lead's facts give now (what `rescore` stores)."""
    return score_lead(await lead_facts(session, lead))


async def rescore(session: AsyncSession, lead: Lead) -> LeadScore:
    """Compute the lead's score from its facts and store it, in the caller's transaction."""
    scored = await current_score(session, lead)
    if lead.score != scored.score:
        lead.score = scored.score
        await session.flush()
        await session.refresh(lead)  # the server stamped updated_at: read it back, not lazily later
    return scored


async def rescore_ids(session: AsyncSession, tenant_id: str, lead_ids: Iterable[int]) -> None:
    # populate_existing: a lead this session loaded before a Core UPDATE (write_record's) is read again
    query = select(Lead).where(Lead.tenant_id == tenant_id, Lead.id.in_(list(lead_ids)))
    for lead in await session.scalars(query.execution_options(populate_existing=True)):
        await rescore(session, lead)


async def rescore_attendees(session: AsyncSession, tenant_id: str, attendees: Iterable[str]) -> None:
    """Rescore the tenant's leads among an event's attendees (a meeting booked, moved or cancelled)."""
    emails = {a.lower() for a in attendees if "@" in a}
    if emails:
        ids = await session.scalars(
            select(Lead.id).where(Lead.tenant_id == tenant_id, func.lower(Lead.email).in_(emails))
        )
        await rescore_ids(session, tenant_id, ids.all())


async def record_lead_event(
    session: AsyncSession,
    lead: Lead,
    kind: str,
    created_by: str,
    *,
    note: str | None = None,
    previous_status: str | None = None,
) -> tuple[LeadEvent, LeadScore]:
    """Record a status change (the lead already has its new status) or a reply, and rescore."""
    status = lead.status if kind == "status_changed" else None
    event = LeadEvent(
        tenant_id=lead.tenant_id,
        lead_id=lead.id,
        kind=kind,
        previous_status=previous_status,
        status=status,
        note=note,
        created_by=created_by,
    )
    session.add(event)
    await session.flush()
    if kind == "email_answered":
        await session.execute(update(Lead).where(Lead.id == lead.id).values(last_engaged_at=func.now()))
        await session.refresh(lead)
    return event, await rescore(session, lead)


async def forget_status_change(session: AsyncSession, lead: Lead, previous: str, new: str) -> None:
    """An undone status change never happened: its history row goes (the latest one from `previous`
    to `new`), and the score follows."""
    latest = await session.scalar(
        select(func.max(LeadEvent.id)).where(
            LeadEvent.tenant_id == lead.tenant_id,
            LeadEvent.lead_id == lead.id,
            LeadEvent.kind == "status_changed",
            LeadEvent.previous_status == previous,
            LeadEvent.status == new,
        )
    )
    if latest is not None:
        await session.execute(delete(LeadEvent).where(LeadEvent.id == latest))
    await rescore(session, lead)


async def rescore_all(session: AsyncSession) -> None:
    """Every lead's score from its facts (the seed, after it wrote leads, emails and events)."""
    for lead in (await session.scalars(select(Lead).order_by(Lead.id))).all():
        await rescore(session, lead)
