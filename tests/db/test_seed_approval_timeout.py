"""Every seeded agent states how long its calls wait for a reviewer (`agent_profiles.limits`), so the
source design's hour is one `permissions limits` setting away, not a code default to find."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.contract import AgentLimits, Limits
from countersign.core.limits import within_agent_bounds
from countersign.db.schema import AgentProfile
from countersign.db.seed import AGENTS, APPROVAL_TIMEOUT_S


async def test_every_seeded_agent_states_its_approval_timeout(db_engine: AsyncEngine) -> None:
    async with db_engine.connect() as conn:
        rows = (await conn.execute(select(AgentProfile.name, AgentProfile.limits))).all()
    stated = {name: limits.get("approval_timeout_s") for name, limits in rows if name in AGENTS}
    assert stated == dict.fromkeys(AGENTS, APPROVAL_TIMEOUT_S)


def test_the_design_hour_is_the_conversation_default_once_set() -> None:
    seeded = within_agent_bounds(Limits(), AgentLimits(approval_timeout_s=APPROVAL_TIMEOUT_S))
    design = within_agent_bounds(Limits(), AgentLimits(approval_timeout_s=3_600))
    assert (seeded.approval_timeout_s, design.approval_timeout_s) == (86_400, 3_600)
