"""The saga: every write the conversation made, with how undoing it went. Pure workflow state.

An entry is registered *before* its forward step runs, so a step that committed and then timed
out is still undone (the compensation finds out whether the effect happened and says
"never happened" when it did not). Undo runs newest first.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from countersign.core.bounds import Identifier, Proof, Reason
from countersign.core.calls import CallerContext
from countersign.core.conversation_ref import ConversationRef

# registered: may be undone; done: undone (or already was); skipped: the forward step never took
# effect; irreversible: cannot be undone (an email already delivered); failed: the compensation
# failed after its retries (see `error`), and is reported, never silently dropped.
EntryState = Literal["registered", "done", "skipped", "irreversible", "failed"]
# A compensation in one of these states is over: never run again (a failed one may be retried).
FINAL_STATES: tuple[EntryState, ...] = ("done", "skipped", "irreversible")
Scope = Literal["turn", "conversation", "call"]


class SagaEntry(BaseModel):
    call_id: str
    tool: str
    turn: int
    arguments: str  # as executed (an approver's edit included)
    result: dict[str, Any] | None = None  # the forward step's recorded result data, once known
    state: EntryState = "registered"
    error: str | None = None


class Saga(BaseModel):
    entries: list[SagaEntry] = Field(default_factory=list)

    def register(self, call_id: str, tool: str, turn: int, arguments: str) -> SagaEntry:
        entry = SagaEntry(call_id=call_id, tool=tool, turn=turn, arguments=arguments)
        self.entries.append(entry)
        return entry

    def withdraw(self, entry: SagaEntry) -> None:
        """Forget an entry whose forward step certainly did not run (its approved effect had changed:
        EFFECT_CHANGED), so that the call, asked again, is registered once."""
        self.entries = [e for e in self.entries if e is not entry]

    def to_undo(self, scope: Scope, turn: int, call_id: str | None = None) -> list[SagaEntry]:
        """The entries a rollback of `scope` undoes, newest first. `turn` is the latest turn."""

        def wanted(e: SagaEntry) -> bool:
            if scope == "call":
                return e.call_id == call_id
            return scope == "conversation" or e.turn == turn

        return [e for e in reversed(self.entries) if e.state == "registered" and wanted(e)]

    def knows(self, call_id: str) -> bool:
        """Whether `call_id` is a write of this conversation (undone or not): what a rollback of
        scope "call" may name; any other id names nothing to undo."""
        return any(e.call_id == call_id for e in self.entries)

    def failures(self) -> list[str]:
        return [f"{e.call_id} {e.tool}: {e.error}" for e in self.entries if e.state == "failed"]


class RollbackRequest(BaseModel):
    """The `rollback` signal's payload."""

    requested_by: Identifier
    scope: Scope = "turn"
    call_id: Identifier | None = None
    reason: Reason | None = None
    proof: Proof | None = None  # APPROVER_AUTH=signed: the inbox's proof for exactly this rollback


class CompensationRequest(BaseModel):
    caller: CallerContext
    workflow_id: str
    conversation_id: str = ""  # the conversation instance (countersign.db.schema.Conversation)
    entry: SagaEntry


class CompensationOutcome(BaseModel):
    state: EntryState
    detail: str


class RollbackAuthorization(ConversationRef):
    """A rollback request with the conversation it is for: what `authorize_rollback` checks, and the
    input of the short rollback workflow of a conversation that has ended (`load_saga_entries`)."""

    conversation_user: str
    request: RollbackRequest


UNDO_STATE: dict[str, EntryState] = {"undone": "done", "already_undone": "done", "never_happened": "skipped"}
# Why an undo ended in each state, as people read it beside the state (`rollback`, `chat`, `audit`,
# the chat page's step): a skipped undo is never a bare "False".
STATE_WHY: dict[str, str] = {
    "done": "its change was reversed, or already was",
    "skipped": "it never took effect: there was nothing to undo",
    "irreversible": "its tool says it cannot be undone now (an email already delivered, say)",
}


def undo_why(state: str, error: str | None = None) -> str:
    """Why an undo ended in `state`: a failure's error, else what the state means."""
    return error or STATE_WHY.get(state, state)


def undo_state(outcome: str) -> EntryState:
    """A compensation's UndoOutcome as the saga records it."""
    return UNDO_STATE.get(outcome, "irreversible")


class RollbackOutcome(BaseModel):
    refused: str | None = None  # why the rollback was refused (audited in rollback_requests)
    entries: list[SagaEntry] = Field(default_factory=list)  # what it undid, with the outcome
