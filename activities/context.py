"""Loads who is acting and what the agent may do, once, when a conversation starts.

The result is snapshotted in workflow state: the tools it offers the model and their tiers as they
were at the start. What decides a call is read again when it is checked and when it runs: the
operators' tier for its tool and the tenant's policy set now (activities/rules.py).
"""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from countersign.core.activity_refs import LOAD_CONVERSATION_CONTEXT
from countersign.core.calls import ToolSpec
from countersign.core.contract import AgentLimits, AgentSnapshot, ConversationContext, StartConversation
from countersign.core.envelopes import WindowPolicy
from countersign.db import schema
from countersign.mcp.pool import McpPool
from countersign.mcp.servers import server_of
from countersign.mcp.snapshot import mcp_specs
from tools.records import RECORD_TOOLS, schema_map
from tools.registry import REGISTRY
from tools.tiers import tenant_tiers


class ContextActivities:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        email_delivery_delay_s: float = 60.0,
        mcp_pool: McpPool | None = None,
    ) -> None:
        self._sessions = sessions
        self._email_delay = email_delivery_delay_s
        self._mcp_pool = mcp_pool  # MCP servers' tools join the snapshot as mcp__SERVER__TOOL

    @activity.defn(name=LOAD_CONVERSATION_CONTEXT.name)
    async def load_conversation_context(self, start: StartConversation) -> ConversationContext:
        async with self._sessions() as session:
            user = await session.get(schema.User, (start.tenant_id, start.user_id))
            if user is None:
                raise unknown(f"no user {start.user_id!r} in tenant {start.tenant_id!r}")
            if user.deactivated_at is not None:
                raise unknown(f"user {start.user_id!r} is deactivated in tenant {start.tenant_id!r}")
            profile = await session.get(schema.AgentProfile, start.agent)
            if profile is None:
                raise unknown(f"no agent named {start.agent!r}")
            roles = list(
                await session.scalars(
                    select(schema.UserRole.role)
                    .where(
                        schema.UserRole.tenant_id == start.tenant_id, schema.UserRole.user_id == start.user_id
                    )
                    .order_by(schema.UserRole.role)
                )
            )
            policy = await session.get(schema.ContextPolicy, start.agent)
            permissions = list(
                await session.scalars(
                    select(schema.AgentToolPermission)
                    .where(schema.AgentToolPermission.agent == start.agent)
                    .order_by(schema.AgentToolPermission.tool)
                )
            )
            # the tenant's own tiers (tools.tiers) replace the agent's, for this tenant only
            overrides = await tenant_tiers(session, start.tenant_id, start.agent)
        tiers = {p.tool: overrides[p.tool].tier if p.tool in overrides else p.tier for p in permissions}
        unknown_tools = [p.tool for p in permissions if p.tool not in REGISTRY and not server_of(p.tool)]
        if unknown_tools:
            activity.logger.warning(
                "agent %s lists tools this worker does not have: %s", start.agent, unknown_tools
            )
        prompt = (
            f"{profile.system_prompt}\n\n"
            f"You act for {user.display_name} (user id {user.id}, roles: {', '.join(roles) or 'none'}) "
            f"in the workspace {start.tenant_id!r}. Only use the tools you are given; results come as JSON."
        )
        if RECORD_TOOLS & {p.tool for p in permissions}:  # the map, not an iteration per collection
            prompt += f"\n\n{schema_map()}"
        return ConversationContext(
            tenant_id=start.tenant_id,
            user_id=start.user_id,
            roles=roles,
            agent=AgentSnapshot(
                name=profile.name,
                description=profile.description or "",
                system_prompt=prompt,
                atomic_turns=profile.atomic_turns,
            ),
            tools=[REGISTRY[p.tool].spec(tiers[p.tool]) for p in permissions if p.tool in REGISTRY]  # type: ignore[arg-type]
            + await self._mcp_tools(start, {p.tool: tiers[p.tool] for p in permissions if server_of(p.tool)}),
            email_delivery_delay_s=self._email_delay,
            agent_limits=agent_limits(profile),
            policy=WindowPolicy.model_validate(policy, from_attributes=True) if policy else WindowPolicy(),
        )

    async def _mcp_tools(self, start: StartConversation, tiers: dict[str, str | None]) -> list[ToolSpec]:
        if self._mcp_pool is None:
            return []
        return await mcp_specs(self._sessions, self._mcp_pool, start.agent, start.tenant_id, tiers)


def agent_limits(profile: schema.AgentProfile) -> AgentLimits:
    """The agent's bounds from the database; a row an operator broke by hand stops the start clearly."""
    try:
        return AgentLimits.model_validate(profile.limits)
    except ValidationError as e:
        raise ApplicationError(
            f"agent {profile.name!r} has invalid limits in agent_profiles.limits: {e}",
            type="InvalidAgentLimits",
            non_retryable=True,
        ) from e


def unknown(message: str) -> ApplicationError:
    return ApplicationError(message, type="UnknownConversationParty", non_retryable=True)
