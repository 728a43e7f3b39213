"""Who may do what to a conversation: the pure rules behind every human-authority signal and update.

Identity comes from the database (is the actor a user of the conversation's tenant, with which
roles), never from the payload alone; the workflow's own state says who the conversation's user
is (loaded from the database when the run started). The I/O and the audit row of every check are
in activities/authority.py, the one place where proof verification (APPROVER_AUTH=signed) joins in.

| action           | who may                                              |
|------------------|------------------------------------------------------|
| `submit_message` | the conversation's user                              |
| `answer`         | the conversation's user (the model asked *them*)     |
| `end`            | the conversation's user, or an admin of its tenant   |
| `rollback`       | the conversation's user, or an admin of its tenant   |
| decisions        | countersign.core.approvals.approver_refusal (roles by risk, four-eyes) |

Every refusal is recorded (`input_audit`, or `approval_decisions` / `rollback_requests`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from countersign.core.conversation_ref import ConversationRef

Action = Literal[
    "submit_message", "answer", "end", "rollback", "approve", "reject", "decide", "start", "serve_call"
]
ADMIN = "admin"
# Actions the conversation's user may take, and those a tenant admin may take on anyone's.
OWNER_ONLY: frozenset[Action] = frozenset({"submit_message", "answer", "serve_call"})
OWNER_OR_ADMIN: frozenset[Action] = frozenset({"end", "rollback"})
VERB: dict[str, str] = {
    "submit_message": "send messages to",
    "answer": "answer questions in",
    "rollback": "roll back",
    "serve_call": "call tools in",
}


def _refused(action: Action, actor: str, conversation_user: str) -> str:
    verb = VERB.get(action, action)
    who = "only its user may" if action in OWNER_ONLY else "its user or a tenant admin may"
    return f"{actor} may not {verb} {conversation_user}'s conversation ({who})"


def action_refusal(
    action: Action, actor: str, conversation_user: str, actor_roles: list[str] | None
) -> str | None:
    """Why `actor` may not take `action` on `conversation_user`'s conversation, or None.

    `actor_roles` is None when the actor is not a user of the conversation's tenant.
    """
    if actor_roles is None:
        return f"{actor!r} is not a user of this tenant"
    if actor == conversation_user:
        return None
    if action in OWNER_OR_ADMIN and ADMIN in actor_roles:
        return None
    return _refused(action, actor, conversation_user)


def action_state_refusal(action: Action, actor: str, conversation_user: str) -> str | None:
    """The refusal the workflow can decide from its own state, without the database: actions only
    the conversation's user may take, sent by someone else."""
    if action in OWNER_ONLY and actor != conversation_user:
        return _refused(action, actor, conversation_user)
    return None


class ActionCheck(BaseModel):
    """What `authorize_action` checks and records. `refusal` is set when the workflow already
    refused (an unreadable payload, the wrong user); the activity then only records it."""

    tenant_id: str
    workflow_id: str
    action: Action
    actor: str | None  # None when the payload could not be read
    conversation_user: str
    refusal: str | None = None
    excerpt: str = ""  # of an unreadable payload


class ProofRequest(ConversationRef):
    """What `check_action_proof` checks; the conversation instance is what an answer's or an end's
    proof must name."""

    action: Literal["answer", "end", "start", "message", "call"]
    actor: str
    proof: str | None = None
    call_id: str | None = None  # answer: the question's call; call: the client's call
    text: str | None = None  # answer, message: the exact text the proof binds; call: the arguments
    tool: str | None = None  # call: the tool
    message_id: str | None = None  # message: its id
    agent: str | None = None  # start: the agent
    content: dict[str, Any] | None = None  # start: what it asks (StartConversation.proof_content)
