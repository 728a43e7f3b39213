"""Proof checks for the actions that have no activity of their own: a start, a message, an
`answer` and an `end`.

Decisions and rollbacks check their proof inside `record_decision` / `authorize_rollback`, in the
transaction that records them; these only change workflow state, so the workflow asks this
activity first. Like those, a check is recorded once per invocation (`proof_checks`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from countersign.core.activity_refs import CHECK_ACTION_PROOF
from countersign.core.authority import ProofRequest
from countersign.db.attempts import attempt_key
from countersign.db.schema import ProofCheck
from countersign.identity.proofs import Binding, ProofVerifier, check_proof


def binding_of(request: ProofRequest) -> Binding:
    """What a requester's proof must bind: the agent and what the start asks; the message's id and
    exact text; the question's call and the exact answer, in this instance; this instance's end; or a
    client's call, its tool and exact arguments."""
    tenant, workflow_id = request.tenant_id, request.workflow_id
    match request.action:
        case "start":
            return Binding.start(tenant, workflow_id, request.agent or "", request.content or {})
        case "message":
            return Binding.message(tenant, workflow_id, request.message_id or "", request.text or "")
        case "answer":
            return Binding.answer(
                tenant, workflow_id, request.conversation_id, request.call_id or "", request.text or ""
            )
        case "end":
            return Binding.end(tenant, workflow_id, request.conversation_id)
        case "call":
            return Binding.call(
                tenant, workflow_id, request.call_id or "", request.tool or "", request.text or ""
            )


class ProofActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], proofs: ProofVerifier) -> None:
        self._sessions = sessions
        self._proofs = proofs

    @activity.defn(name=CHECK_ACTION_PROOF.name)
    async def check_action_proof(self, request: ProofRequest) -> str:
        """ "" when the action counts (names mode: always), else why not, recorded. A re-run of the
        same invocation answers from the row its first run wrote."""
        if self._proofs.mode == "names":
            return ""
        key = attempt_key()
        async with self._sessions() as session, session.begin():
            earlier = await session.scalar(select(ProofCheck).where(ProofCheck.attempt_key == key))
            if earlier is not None:
                return "" if earlier.accepted else earlier.reason or "refused"
            refusal = await check_proof(
                session,
                self._proofs,
                request.proof,
                binding_of(request),
                request.actor,
                datetime.now(UTC),
                key,
            )
            return refusal or ""
