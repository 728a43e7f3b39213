"""Authority: whether a client's signal may act, asked of the database and recorded either way;
and whether a run's start is this conversation's (its carried state's seal, its instance).

Client input is untrusted (docs/explanation/security.md). A payload that does not decode arrives as
`Unreadable` (countersign.runtime.payloads); who may take an action is answered by
`authorize_action` from the database, never from the payload; in signed mode a proof minted by the
server for that person and action is checked by `check_action_proof`: a start, a message, an
answer, an end. Every refusal is recorded (`input_audit`, `proof_checks`) and changes nothing
else. A check that cannot reach the database refuses: fail closed, never a failed workflow.
"""

from __future__ import annotations

from typing import Any, Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import (
        AUTHORIZE_ACTION,
        CHECK_ACTION_PROOF,
        REGISTER_CONVERSATION,
        VERIFY_CARRIED,
    )
    from countersign.core.authority import Action, ActionCheck, ProofRequest
    from countersign.core.bounds import Unreadable
    from countersign.core.contract import StartConversation, SubmitMessage
    from countersign.core.seal import SealCheck, digest

from workflows.conversation import Conversation
from workflows.options import bookkeeping


class Authority:
    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self._message_tickets = 0  # messages whose proof is being checked, in arrival order
        self._messages_admitted = 0
        # Refusals being recorded now, by arrival: what a continue-as-new carries if its grace for
        # handlers runs out before they are on the record.
        self.recording: dict[int, ActionCheck] = {}
        self._refusals = 0

    @property
    def checking(self) -> int:
        """Messages whose proof is being checked: not yet in the inbox, already asked for."""
        return self._message_tickets - self._messages_admitted

    async def verify_carried(self, start: StartConversation) -> None:
        """Fail the run once, on the record, when it was started with state it cannot prove the
        conversation carried itself (a client's invention, or another workflow's)."""
        if start.carried is None:
            return
        check = SealCheck(
            **self.conversation.instance().model_dump(),
            digest=digest(start.carried),
            seal=start.seal,
            run_instance=workflow.info().first_execution_run_id,
            continued_from=workflow.info().continued_run_id or "",
        )
        refuse_start(await bookkeeping(VERIFY_CARRIED, check, "verify the carried state"))

    async def register(self) -> None:
        """Make the workflow id's row name this instance (first run), or check that it does and is
        this tenant's, user's and agent's (every later run), before anything is stored or read."""
        instance = self.conversation.instance()
        refuse_start(await bookkeeping(REGISTER_CONVERSATION, instance, "register the conversation instance"))

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
        if refusal is None:
            return await self._checked(check)
        key, self._refusals = self._refusals, self._refusals + 1
        self.recording[key] = check
        try:
            return await self._checked(check)
        finally:
            del self.recording[key]

    async def record_carried(self, refusals: list[ActionCheck]) -> None:
        """Record the refusals the previous run was still recording when it continued as new
        (carried in its sealed state, verified before this is called)."""
        for check in refusals:
            await self._checked(check)

    async def _checked(self, check: ActionCheck) -> str:
        action, actor = check.action, check.actor
        try:
            answer = await bookkeeping(AUTHORIZE_ACTION, check, f"authorize {action} by {actor}")
        except ActivityError as err:
            workflow.logger.error("%s by %s could not be checked: %s", action, actor, err.cause or err)
            return "the authority check could not reach the database"
        return answer

    async def proven(
        self, action: Literal["answer", "end"], actor: str, proof: str | None, **bound: str
    ) -> bool:
        """Whether a proof shows `actor` may take `action` (in names mode, always)."""
        return not await self.proof_refusal(action, actor, proof, **bound)

    async def proof_refusal(
        self,
        action: Literal["answer", "end", "start", "message", "call"],
        actor: str,
        proof: str | None,
        **bound: Any,
    ) -> str:
        """ "" when a proof the server minted shows `actor` may take `action` (names mode: always),
        else why not; recorded by the activity (`proof_checks`), logged here."""
        request = ProofRequest.at(
            self.conversation.ref(),
            action=action,
            actor=actor,
            proof=proof,
            **bound,
        )
        try:
            refusal = await bookkeeping(CHECK_ACTION_PROOF, request, f"check {actor}'s proof for {action}")
        except ActivityError as err:
            workflow.logger.error("%s by %s could not be checked: %s", action, actor, err.cause or err)
            refusal = "the proof check could not reach the database"
        if refusal:
            workflow.logger.warning("%s by %s refused: %s", action, actor, refusal)
        return refusal

    async def message_refusal(self, message: SubmitMessage) -> str | None:
        """The message's proof check; messages are admitted in the order they arrived, whichever
        check finishes first."""
        ticket = self._message_tickets
        self._message_tickets += 1
        try:
            refusal = await self.proof_refusal(
                "message",
                message.user_id,
                message.proof,
                message_id=message.message_id or "",
                text=message.text,
            )
        finally:
            await workflow.wait_condition(lambda: self._messages_admitted == ticket)
            self._messages_admitted += 1
        return refusal or None

    async def start_refusal(self, start: StartConversation) -> str:
        """In signed mode only the server starts a conversation, for the person it authenticated:
        the start's proof binds the agent and what the start asks. A refusal is also recorded in
        `input_audit`."""
        refusal = await self.proof_refusal(
            "start", start.user_id, start.proof, agent=start.agent, content=start.proof_content()
        )
        if refusal:
            await self.refuse("start", start.user_id, refusal)
        return refusal


def refuse_start(refusal: str) -> None:
    """A start whose carried state or instance the database refused fails the run, once."""
    if refusal:
        raise ApplicationError(
            f"the start input was refused: {refusal}", type="ForgedCarriedState", non_retryable=True
        )
