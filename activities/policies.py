"""The policy gate: a tenant's Cedar policies on one tool call, evaluated where I/O is allowed.

The workflow asks only when its snapshot says the tenant has policies (`ConversationContext.
has_policies`): a tenant without any adds nothing to a step. What the gate reads and how it decides
is `judge` (activities/policy_gate.py), which a reviewer's edit meets too.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.policy_gate import judge
from countersign.core.activity_refs import EVALUATE_POLICY
from countersign.core.calls import NO_MATCH, PolicyDecision
from countersign.core.policy import PolicyCheck
from tools.arguments import load_arguments
from tools.registry import ToolFailure


class PolicyActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @activity.defn(name=EVALUATE_POLICY.name)
    async def evaluate_policy(self, check: PolicyCheck) -> PolicyDecision:
        """The enforced set's decision on the call (no set, or arguments that are no JSON object:
        no match, and the call's own checks refuse what is wrong with it)."""
        try:
            arguments = load_arguments(check.invocation.arguments)
        except ToolFailure:
            return NO_MATCH
        async with self._sessions() as session, session.begin():
            return await judge(session, check, arguments)
