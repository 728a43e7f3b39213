"""The access gate every tool call passes, native or MCP, in the transaction of its audit row.

At each call, not once at the conversation's start (countersign/core/access.py):
1. the conversation's user is still an active user of the tenant, else `CONNECTION_INACTIVE`;
2. they hold the scopes the tool needs, else `SCOPES_MISSING` naming the missing ones;
3. their bucket and the tenant's have a token, else `RATE_LIMITED` saying whose.

`check_standing` runs 1 and 2 before a reviewer is asked to approve a call (nobody is asked to approve
what could not run); `admit` runs all three again when the call runs, since a user may be deactivated,
or a scope revoked, while a call waits for its approval.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.access import Scope, inactive_refusal, missing_scopes, rate_refusal, scopes_refusal
from countersign.core.calls import CallerContext
from countersign.db.access import standing
from countersign.db.ratelimit import RateLimits, take_call
from tools.registry import ToolFailure


async def check_standing(
    session: AsyncSession, caller: CallerContext, tool: str, scopes: tuple[Scope, ...]
) -> None:
    """Raise CONNECTION_INACTIVE or SCOPES_MISSING when the caller may not run `tool` now."""
    user = await standing(session, caller.tenant_id, caller.user_id)
    if not user.active:
        raise ToolFailure(
            "CONNECTION_INACTIVE", inactive_refusal(caller.user_id, caller.tenant_id, deactivated=user.exists)
        )
    missing = missing_scopes(scopes, user.scopes)
    if missing:
        raise ToolFailure("SCOPES_MISSING", scopes_refusal(tool, caller.user_id, missing))


async def admit(
    session: AsyncSession,
    caller: CallerContext,
    tool: str,
    scopes: tuple[Scope, ...],
    limits: RateLimits,
    now: datetime,
) -> None:
    """Raise the refusal of a call that may not run now; else it has taken its rate-limit tokens."""
    await check_standing(session, caller, tool, scopes)
    spent = await take_call(
        session,
        caller.tenant_id,
        caller.user_id,
        tool,
        await limits.for_call(session, caller.tenant_id, tool),
        now,
    )
    if spent is not None:
        raise ToolFailure(
            "RATE_LIMITED", rate_refusal(tool, spent.whose, caller.user_id, spent.limit.per_s, spent.wait_s)
        )
