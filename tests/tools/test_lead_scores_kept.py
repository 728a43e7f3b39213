"""A lead's stored score is the score its facts give, after any tool that changes a lead or a meeting
booked with one, and after that tool's undo (countersign/db/leads.py `rescore`), on the real PostgreSQL.

The property test lets hypothesis write a sequence of calls of every tool that writes leads or their
meetings (write_record on leads and calendar_events, update_lead_status, record_lead_reply,
create_event, update_event), each maybe undone, in one transaction rolled back afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from countersign.core.calls import CallerContext
from countersign.db.leads import current_score
from countersign.db.schema import EVENT_STATUSES, EVENT_TYPES, LEAD_STATUSES, CalendarEvent, Lead, LeadEvent
from tools import REGISTRY
from tools.arguments import validate
from tools.registry import ToolContext, ToolFailure

LEADS = ("jane.doe@example.com", "john.smith@initech.example", "li.wei@hooli.example")
NEW_LEAD = "new.lead@example.com"
SOURCES = st.sampled_from(["referral", "website", "cold outreach", None])
ATTENDEES = st.lists(st.sampled_from([*LEADS, NEW_LEAD, "alice"]), max_size=3, unique=True)
SLOT = {"starts_at": "2026-12-08T16:00:00Z", "ends_at": "2026-12-08T17:00:00Z"}

# A call: (tool, arguments), where "$lead:<email>" and "$event" name rows found when the call runs.
LEAD_CALLS = st.one_of(
    st.tuples(st.just("write_record"), st.fixed_dictionaries({
        "collection": st.just("leads"),
        "id": st.sampled_from([f"$lead:{e}" for e in (*LEADS, NEW_LEAD)]),
        "values": st.one_of(
            st.fixed_dictionaries({"status": st.sampled_from(LEAD_STATUSES)}),
            st.fixed_dictionaries({"source": SOURCES}),
            st.fixed_dictionaries({"company": st.sampled_from(["Initech", None])}),
            st.fixed_dictionaries({"email": st.sampled_from([NEW_LEAD, "renamed@example.com"])}),
        ),
    })),
    st.tuples(st.just("write_record"), st.fixed_dictionaries({
        "collection": st.just("leads"),
        "values": st.fixed_dictionaries({
            "email": st.just(NEW_LEAD), "name": st.just("New Lead"),
            "status": st.sampled_from(LEAD_STATUSES), "source": SOURCES,
        }),
    })),
    st.tuples(st.just("update_lead_status"), st.fixed_dictionaries({
        "lead": st.sampled_from(LEADS), "new_status": st.sampled_from(LEAD_STATUSES),
        "reason": st.just("test"),
    })),
    st.tuples(st.just("record_lead_reply"), st.fixed_dictionaries({
        "lead": st.sampled_from(LEADS), "summary": st.just("answered"),
    })),
    st.tuples(st.just("write_record"), st.fixed_dictionaries({
        "collection": st.just("calendar_events"),
        "values": st.fixed_dictionaries({
            "title": st.just("Intro"), **{k: st.just(v) for k, v in SLOT.items()},
            "attendees": ATTENDEES, "type": st.sampled_from(EVENT_TYPES),
        }),
    })),
    st.tuples(st.just("write_record"), st.fixed_dictionaries({
        "collection": st.just("calendar_events"),
        "id": st.just("$event"),
        "values": st.one_of(
            st.fixed_dictionaries({"attendees": ATTENDEES}),
            st.fixed_dictionaries({"type": st.sampled_from(EVENT_TYPES)}),
            st.fixed_dictionaries({"status": st.sampled_from(EVENT_STATUSES)}),
        ),
    })),
    st.tuples(st.just("create_event"), st.fixed_dictionaries({
        "title": st.just("Demo"), **{k: st.just(v) for k, v in SLOT.items()},
        "attendees": ATTENDEES, "type": st.sampled_from(EVENT_TYPES),
    })),
    st.tuples(st.just("update_event"), st.fixed_dictionaries({
        "event": st.just("$event"),
        "attendees": st.one_of(st.none(), ATTENDEES),
        "type": st.one_of(st.none(), st.sampled_from(EVENT_TYPES)),
        "status": st.one_of(st.none(), st.sampled_from(EVENT_STATUSES)),
    })),
)  # fmt: skip


@asynccontextmanager
async def admin_context(engine: AsyncEngine) -> AsyncIterator[ToolContext]:
    """An acme admin's tool context on a transaction that is rolled back afterwards."""
    async with engine.connect() as connection:
        transaction = await connection.begin()
        session = AsyncSession(
            bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
        )
        caller = CallerContext(tenant_id="acme", user_id="carol", roles=["admin"], agent="admin-assistant")
        try:
            yield ToolContext(
                caller=caller,
                session=session,
                workflow_id=f"wf-{uuid.uuid4()}",
                call_id="call-1",
                now=datetime.now(UTC),
            )
        finally:
            await session.close()
            await transaction.rollback()


async def resolved(ctx: ToolContext, raw: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments with "$lead:<email>" and "$event" replaced by ids; None when there is no such row."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, str) and value.startswith("$lead:"):
            query = select(Lead.id).where(Lead.tenant_id == ctx.tenant_id, Lead.email == value[6:])
            value = await ctx.session.scalar(query)
        elif value == "$event":
            value = await ctx.session.scalar(
                select(func.max(CalendarEvent.id)).where(CalendarEvent.tenant_id == ctx.tenant_id)
            )
            value = None if value is None else str(value) if key == "event" else value
        if value is None and key in ("id", "event"):
            return None
        out[key] = value
    return out


async def run(ctx: ToolContext, tool: str, raw: dict[str, Any], undo: bool) -> None:
    """Run a tool as the tool activity does (and its compensation when `undo`); a refusal changes nothing."""
    arguments = await resolved(ctx, raw)
    if arguments is None:
        return
    spec = REGISTRY[tool]
    try:
        given_args = {k: v for k, v in arguments.items() if v is not None}  # update_event: unset fields
        args = validate(spec, json.dumps(given_args))
        async with ctx.session.begin_nested():
            result = (await spec.run(ctx, args)).model_dump(mode="json")
        if undo and spec.compensation is not None:
            async with ctx.session.begin_nested():
                await spec.compensation(ctx, args, result)
    except ToolFailure:
        pass


async def stale_scores(session: AsyncSession) -> list[tuple[str, int | None, int]]:
    """The acme leads whose stored score is not the one their facts give: (email, stored, right)."""
    query = select(Lead).where(Lead.tenant_id == "acme").execution_options(populate_existing=True)
    leads = (await session.scalars(query)).all()
    scored = [(lead.email, lead.score, (await current_score(session, lead)).score) for lead in leads]
    return [row for row in scored if row[1] != row[2]]


async def test_write_record_disqualifying_a_lead_scores_it_zero(db_engine: AsyncEngine) -> None:
    """The issue's case: John (referral, contacted) scored above 0; write_record disqualifies him."""
    async with admin_context(db_engine) as ctx:
        await run(ctx, "write_record", {"collection": "leads", "id": f"$lead:{LEADS[1]}",
                                        "values": {"status": "disqualified"}}, undo=False)  # fmt: skip
        john = await ctx.session.scalar(select(Lead).where(Lead.tenant_id == "acme", Lead.email == LEADS[1]))
        assert john is not None and john.status == "disqualified" and john.score == 0


async def test_a_lead_write_record_creates_has_its_score(db_engine: AsyncEngine) -> None:
    async with admin_context(db_engine) as ctx:
        values = {"email": NEW_LEAD, "name": "New Lead", "source": "referral", "company": "Initech"}
        await run(ctx, "write_record", {"collection": "leads", "values": values}, undo=False)
        lead = await ctx.session.scalar(select(Lead).where(Lead.tenant_id == "acme", Lead.email == NEW_LEAD))
        assert lead is not None and lead.score == 35  # referral 25 + company 10


async def history(ctx: ToolContext, lead: Lead) -> list[tuple[str | None, str | None]]:
    query = select(LeadEvent.previous_status, LeadEvent.status).where(LeadEvent.lead_id == lead.id)
    return [(before, after) for before, after in (await ctx.session.execute(query.order_by(LeadEvent.id)))]


async def test_a_step_back_by_write_record_is_in_the_history_and_its_undo_forgets_it(
    db_engine: AsyncEngine,
) -> None:
    """John is contacted; write_record qualifies him, then puts him back: one step back, -10, as
    update_lead_status would have it. Undoing the step back forgets it."""
    spec = REGISTRY["write_record"]
    assert spec.compensation is not None
    async with admin_context(db_engine) as ctx:
        lead = await ctx.session.scalar(select(Lead).where(Lead.tenant_id == "acme", Lead.email == LEADS[1]))
        assert lead is not None
        start = (await current_score(ctx.session, lead)).score
        forward = validate(
            spec, json.dumps({"collection": "leads", "id": lead.id, "values": {"status": "qualified"}})
        )
        await spec.run(ctx, forward)
        back = validate(
            spec, json.dumps({"collection": "leads", "id": lead.id, "values": {"status": "contacted"}})
        )
        result = (await spec.run(ctx, back)).model_dump(mode="json")
        assert await history(ctx, lead) == [("contacted", "qualified"), ("qualified", "contacted")]
        await ctx.session.refresh(lead)
        assert lead.score == start - 10

        assert await spec.compensation(ctx, back, result) == "undone"
        await ctx.session.refresh(lead)
        assert await history(ctx, lead) == [("contacted", "qualified")]
        assert lead.status == "qualified" and lead.score == (await current_score(ctx.session, lead)).score


@settings(
    max_examples=40,
    deadline=None,
    database=None,  # no .hypothesis/ in the shared tree; a failure prints its reproduce blob
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(calls=st.lists(st.tuples(LEAD_CALLS, st.booleans()), min_size=1, max_size=6))
async def test_every_tool_that_writes_a_lead_keeps_its_score_current(
    db_engine: AsyncEngine, calls: list[tuple[tuple[str, dict[str, Any]], bool]]
) -> None:
    async with admin_context(db_engine) as ctx:
        for (tool, raw), undo in calls:
            await run(ctx, tool, raw, undo)
            assert await stale_scores(ctx.session) == [], (tool, raw, undo)
