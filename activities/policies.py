"""The policy gate of runs that snapshotted `ConversationContext.has_policies` (started before the
rules in force were read at each call, activities/rules.py): their histories take this step, and it
still decides as the tenant's sets are now, with the judgement every call meets
(activities/policy_gate.py `judge`: the requester's roles now, the enforced set now, the audit's
counts and sums the set names, and the call's plan).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities.rules import policy_decision
from countersign.core.activity_refs import EVALUATE_POLICY
from countersign.core.calls import PolicyDecision
from countersign.core.policy import PolicyCheck


class PolicyActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @activity.defn(name=EVALUATE_POLICY.name)
    async def evaluate_policy(self, check: PolicyCheck) -> PolicyDecision:
        """The enforced set's decision on the call (activities/rules.py `policy_decision`)."""
        async with self._sessions() as session, session.begin():
            return await policy_decision(session, check)
