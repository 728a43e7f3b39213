"""An agent's MCP tools as its conversation's snapshot offers them (`load_conversation_context`).

A flat name two tools would share (`mcp__x___foo`: server `x`'s `_foo` and server `x_`'s `foo`, or
one server listing a name twice) is offered for neither, loudly: a tool's identity is its (server,
tool), and the snapshot's one spec per name is what every later step looks up. A server that
cannot be listed now contributes no tools (logged): the conversation still starts.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from countersign.core.calls import ToolSpec
from countersign.mcp.catalog import spec_of
from countersign.mcp.pool import McpPool
from countersign.mcp.servers import clashes, remember_listing, servers_for, tool_name

log = logging.getLogger(__name__)


async def mcp_specs(
    sessions: async_sessionmaker[AsyncSession],
    pool: McpPool,
    agent: str,
    tenant_id: str,
    tiers: dict[str, str | None],
) -> list[ToolSpec]:
    """The agent's MCP tools with their tiers (`tiers`: the agent's permission rows)."""
    async with sessions() as session:
        servers = await servers_for(session, agent, tenant_id)
    listings = await asyncio.gather(*(pool.list_tools(s) for s in servers), return_exceptions=True)
    listed_by = [
        (server.name, listed.name)
        for server, listing in zip(servers, listings, strict=True)
        if not isinstance(listing, BaseException)
        for listed in listing
    ]
    shared = clashes(listed_by)
    for name, owners in shared.items():
        log.error(
            "MCP tool name %s is shared by %s: none of them is offered (rename a server)",
            name,
            ", ".join(f"{server}/{tool}" for server, tool in owners),
        )
    specs: list[ToolSpec] = []
    for server, listing in zip(servers, listings, strict=True):
        if isinstance(listing, BaseException):
            log.warning("MCP server %s left out of the catalog: %s", server.name, listing)
            continue
        for listed in listing:
            if tool_name(server.name, listed.name) in shared:
                continue
            spec = spec_of(server.name, listed, None)
            if spec is None:
                log.warning("MCP tool %s/%s cannot be offered", server.name, listed.name)
                continue
            specs.append(spec.model_copy(update={"tier": tiers.get(spec.name) or spec.tier}))
        async with sessions() as session, session.begin():
            await remember_listing(session, server.name, listing)
    return specs
