"""The tools a tenant's Cedar policies may name: the registry's and the MCP tools of the servers the
tenant can use. What a set is checked against when it is applied or tested (countersign/db/policies.py
keeps the sets, applies them and reads what the gate needs): it lives here, with the registry, because
storage may not import the tool catalog.
"""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.calls import ToolSpec
from countersign.db.schema import McpServer
from countersign.mcp.catalog import ListedTool, spec_of
from tools.registry import REGISTRY


async def tenant_tools(session: AsyncSession, tenant_id: str) -> list[ToolSpec]:
    """Every tool a policy of the tenant may name: the registry's, and the MCP tools of the servers
    the tenant can use as they last listed them."""
    specs = [tool.spec() for tool in REGISTRY.values()]
    servers = await session.scalars(
        select(McpServer).where(or_(McpServer.tenant_id.is_(None), McpServer.tenant_id == tenant_id))
    )
    for server in servers:
        for listed in server.tools or []:
            try:
                tool = ListedTool.model_validate(listed)
            except ValidationError:  # kept before listings kept schemas: nameable once listed again
                continue
            spec = spec_of(server.name, tool, None)
            if spec is not None:
                specs.append(spec)
    return specs
