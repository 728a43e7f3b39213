"""Authority I/O: check a client action against the database and record every check.

`authorize_action` answers "" when the actor may take the action, else why not, and records the
check once (attempt key, as activities/attempts.py explains) in `input_audit`. It is the one place
where a client action's authority is decided; proof verification (issue 13) belongs here too.

`seal_carried` / `verify_carried` MAC the state a conversation carries across continue-as-new, so
that a client cannot start a conversation with state it invented (countersign/core/seal.py).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from countersign.core.activity_refs import (
    AUTHORIZE_ACTION,
    REGISTER_CONVERSATION,
    SEAL_CARRIED,
    VERIFY_CARRIED,
)
from countersign.core.authority import ActionCheck, action_refusal
from countersign.core.bounds import storable
from countersign.core.seal import ConversationInstance, SealCheck, SealRequest, mac, verify
from countersign.db.attempts import attempt_key, record_once
from countersign.db.chain import chain
from countersign.db.people import roles_of
from countersign.db.schema import Conversation, InputAudit, SpentSeal
from countersign.identity.carried_key import load_key
from countersign.identity.mode import recorded_mode


class AuthorityActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], key: bytes | None = None) -> None:
        self._sessions = sessions
        self._key = key or load_key()

    @activity.defn(name=AUTHORIZE_ACTION.name)
    async def authorize_action(self, check: ActionCheck) -> str:
        """ "" when `check.actor` may take the action, else why not; recorded once either way."""
        async with self._sessions() as session, session.begin():

            async def attempt() -> dict[str, Any]:
                refusal = check.refusal
                if refusal is None and check.actor is not None:
                    roles = await roles_of(session, check.tenant_id, check.actor)
                    refusal = action_refusal(check.action, check.actor, check.conversation_user, roles)
                return {
                    "tenant_id": storable(check.tenant_id),
                    "workflow_id": storable(check.workflow_id),
                    "action": check.action,
                    "actor": storable(check.actor) if check.actor is not None else None,
                    "accepted": refusal is None,
                    "reason": storable(refusal) if refusal is not None else None,
                    "excerpt": storable(check.excerpt) or None,
                }

            row = await record_once(session, InputAudit, InputAudit.attempt_key, attempt_key(), attempt)
            await chain(session, row)  # a retry finds its row: chained once
            return "" if row.accepted else row.reason or "refused"

    @activity.defn(name=SEAL_CARRIED.name)
    async def seal_carried(self, request: SealRequest) -> str:
        """The seal, bound to the run that asks for it: no two runs' seals are alike."""
        return mac(self._key, request, activity.info().workflow_run_id or "")

    @activity.defn(name=VERIFY_CARRIED.name)
    async def verify_carried(self, check: SealCheck) -> str:
        """ "" when the seal is the one this deployment made for this conversation and state and no
        other run used it, else why not (recorded: a forged start is refused on the record). The
        seal is spent by this run: a retry of this run's check finds its own row and passes."""
        refusal = verify(self._key, check) or await self._spend(check)
        if refusal:
            await self.authorize_action(
                ActionCheck(
                    tenant_id=check.tenant_id,
                    workflow_id=check.workflow_id,
                    action="start",
                    actor=check.user_id,
                    conversation_user=check.user_id,
                    refusal=refusal,
                )
            )
        return refusal

    async def _spend(self, check: SealCheck) -> str:
        run_id = activity.info().workflow_run_id
        async with self._sessions() as session, session.begin():
            await session.execute(
                insert(SpentSeal)
                .values(
                    seal=check.seal,
                    tenant_id=storable(check.tenant_id),
                    workflow_id=storable(check.workflow_id),
                    conversation_id=check.conversation_id,
                    run_id=run_id,
                )
                .on_conflict_do_nothing(index_elements=[SpentSeal.seal])
            )
            spent_by = await session.scalar(select(SpentSeal.run_id).where(SpentSeal.seal == check.seal))
        if spent_by != run_id:
            return f"carried state whose seal run {spent_by} already used (a replay)"
        return ""

    @activity.defn(name=REGISTER_CONVERSATION.name)
    async def register_conversation(self, instance: ConversationInstance) -> str:
        """Make the workflow id's row name this instance (its first run), or check that it does
        (every later run): "" when it is this tenant's, user's and agent's conversation, else why not.

        A first run whose start the server wrote the row for finds its owner there and only names
        itself; a start that bypassed the server (plain mode, Temporal access) gets a row of its
        own, or takes over the row of an ended conversation under the same id, which it inherits
        nothing of (every stored row and read names the instance)."""
        first = activity.info().workflow_run_id == instance.conversation_id
        owner = {"tenant_id": instance.tenant_id, "user_id": instance.user_id, "agent": instance.agent}
        async with self._sessions() as session, session.begin():
            row = await session.get(Conversation, instance.workflow_id, with_for_update=True)
            if not first:
                if row is None or (row.conversation_id, row.tenant_id, row.user_id, row.agent) != (
                    instance.conversation_id, *owner.values(),
                ):  # fmt: skip
                    return (
                        f"conversation instance {instance.conversation_id} is not the one workflow id "
                        f"{instance.workflow_id} names for {'/'.join(owner.values())}"
                    )
                return ""
            if row is None:
                mode = await recorded_mode(session) or "names"
                session.add(
                    Conversation(
                        workflow_id=instance.workflow_id,
                        started_via="worker",
                        auth_mode=mode,
                        conversation_id=instance.conversation_id,
                        **owner,
                    )
                )
            elif row.conversation_id != instance.conversation_id:
                if (row.tenant_id, row.user_id) != (instance.tenant_id, instance.user_id):
                    row.started_via, row.token_name, row.key = "worker", None, None
                row.conversation_id, row.tenant_id, row.user_id, row.agent = (
                    instance.conversation_id, *owner.values(),
                )  # fmt: skip
        return ""
