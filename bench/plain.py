"""What every peer of bench.cost shares, with nothing of Countersign in it (issue 52): the lookup as
a plain application would write it, the one tool definition they offer, and the minimal loop.

- `search_leads(query, limit)`: the same SELECT as the product's tool, through SQLAlchemy Core on an
  engine of SQLAlchemy's defaults, its rows as JSON. No caller context, no audit row, no arguments
  model, no registry: what a developer writes for "a tool that reads the database".
- `SEARCH_TOOL`: the OpenAI tool definition of `search_leads` that Countersign offers the model,
  copied (name, description, JSON Schema), so every peer sends the model the same schema.
- The minimal loop: bench.bare's workflow (the transcript in its state, the model call a regular
  activity, each tool call a local activity) with `search_leads` above as its tool.

    python -m bench.plain        # the minimal loop's worker process, configured as worker.py is
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

from bench import bare
from bench.history import TOOL_ACTIVITY
from countersign.runtime.config import Settings

TENANT = "acme"  # the seeded workspace every workload runs in
SEARCH = text(
    """
    SELECT id, email, name, company, status, source, owner_user_id AS owner, notes, updated_at, score,
           last_engaged_at
    FROM leads
    WHERE tenant_id = :tenant AND (name ILIKE :pattern OR email ILIKE :pattern OR company ILIKE :pattern)
    ORDER BY updated_at DESC, id
    LIMIT :limit
    """
)
SEARCH_DESCRIPTION = "Search the workspace's leads by name, email or company (case-insensitive substring)."
SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "Part of a name, email or company", "minLength": 1,
                  "maxLength": 200},
        "limit": {"description": "Most rows to return (default: 10)",
                  "anyOf": [{"type": "integer", "minimum": 1, "maximum": 50}, {"type": "null"}]},
    },
    "required": ["query", "limit"],
    "additionalProperties": False,
}  # fmt: skip
SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search_leads",
        "description": SEARCH_DESCRIPTION,
        "parameters": SEARCH_PARAMETERS,
        "strict": True,
    },
}


@dataclass
class PeerStart:
    """A peer's conversation: the agent's system prompt, the user's message, the model's name."""

    system_prompt: str
    message: str
    model: str


async def search_leads(
    sessions: async_sessionmaker[AsyncSession], query: str, limit: int | None = None
) -> str:
    """The leads matching `query`, newest first, as JSON."""
    bound = {"tenant": TENANT, "pattern": f"%{query}%", "limit": limit or 10}
    async with sessions() as session:
        rows = await session.execute(SEARCH, bound)
        leads = [dict(row._mapping) for row in rows]
    return json.dumps({"leads": leads, "count": len(leads)}, default=str)


class MinimalActivities(bare.BareActivities):
    """bench.bare's model call; the tool is `search_leads` above."""

    @activity.defn(name=TOOL_ACTIVITY)
    async def execute_tool(self, call: bare.BareToolCall) -> str:
        return await search_leads(self._sessions, **json.loads(call.arguments))


def build_worker(
    client: Client,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    interceptors: Sequence[Interceptor] = (),
) -> Worker:
    minimal = MinimalActivities(settings, sessions)
    return bare.loop_worker(
        client,
        settings,
        interceptors,
        workflows=[bare.BareLoop],
        activities=[minimal.call_model, minimal.execute_tool],
    )


if __name__ == "__main__":
    # by its name, not as __main__: the workflow sandbox imports the workflow's module by name
    from bench.plain import build_worker as build

    asyncio.run(bare.serve(build))
