"""Authority: whether a client's signal may act, asked of the database and recorded either way.

Client input is untrusted (docs/security.md). A payload that does not decode arrives as
`Unreadable` (countersign.runtime.payloads); who may take an action is answered by `authorize_action` from
the database, never from the payload; in APPROVER_AUTH=signed a proof minted by the server for that
person and action is checked by `check_action_proof`. Every refusal is recorded (`input_audit`) and
changes nothing else. A check that cannot reach the database refuses: fail closed, never a failed
workflow.
"""

from __future__ import annotations

from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from countersign.core.authority import Action, ActionCheck, ProofRequest
    from countersign.core.bounds import Unreadable

from workflows.conversation import Conversation
from workflows.options import bookkeeping


class Authority:
    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation

    async def refuse(self, action: Action, actor: str | None, refusal: str, excerpt: str = "") -> None:
        """Record a refused client input; it changes nothing else."""
        workflow.logger.warning("%s by %s refused: %s", action, actor, refusal)
        await self.authorize(action, actor, refusal, excerpt)

    async def refuse_unreadable(self, action: Action, payload: Unreadable) -> None:
        await self.refuse(action, None, f"unreadable payload: {payload.unreadable}", payload.excerpt)

    async def authorize(
        self, action: Action, actor: str | None, refusal: str | None = None, excerpt: str = ""
    ) -> str:
        """ "" when the database says `actor` may take `action`, else why not (recorded either way)."""
        check = ActionCheck(
            tenant_id=self.conversation.start.tenant_id,
            workflow_id=self.conversation.workflow_id,
            action=action,
            actor=actor,
            conversation_user=self.conversation.start.user_id,
            refusal=refusal,
            excerpt=excerpt,
        )
        try:
            answer: str = await bookkeeping("authorize_action", check, f"authorize {action} by {actor}", str)
        except ActivityError as err:
            workflow.logger.error("%s by %s could not be checked: %s", action, actor, err.cause or err)
            return "the authority check could not reach the database"
        return answer

    async def proven(
        self, action: Literal["answer", "end"], actor: str, proof: str | None, **bound: str
    ) -> bool:
        """Whether a proof shows `actor` may take `action` (in APPROVER_AUTH=names mode, always);
        a refusal is recorded by the activity and logged."""
        refusal: str = await bookkeeping(
            "check_action_proof",
            ProofRequest(
                tenant_id=self.conversation.start.tenant_id,
                workflow_id=self.conversation.workflow_id,
                action=action,
                actor=actor,
                proof=proof,
                **bound,
            ),
            f"check {actor}'s proof for {action}",
            str,
        )
        if refusal:
            workflow.logger.warning("%s by %s refused: %s", action, actor, refusal)
        return not refusal
