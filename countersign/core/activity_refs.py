"""Everything the conversation asks of the world: one reference per activity, with its registered
name, what it takes and what the workflow reads back.

Workflow code may not import `activities/` (the sandbox and the layers forbid it), so it calls an
activity through its reference here (`workflows/options.py`: `execute`, `execute_local`,
`bookkeeping`), and mypy checks the argument and the result against the reference. Each definition in
`activities/` takes its name from the same entry (`@activity.defn(name=CALL_MODEL.name)`);
tests/activities/test_activity_refs.py holds the list against what worker.py registers, and each
entry's types against its definition's annotations.

A registered name is written into every workflow history that calls it: renaming one breaks the
replay of running conversations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from countersign.core.approvals import (
    ApprovalNotice,
    ApprovalReminder,
    DecisionRecord,
    RecordedApproval,
    Verdict,
)
from countersign.core.authority import ActionCheck, ProofRequest
from countersign.core.calls import (
    CheckedCall,
    McpCall,
    PolicyDecision,
    StoredResult,
    ToolInvocation,
    UnexecutedCall,
)
from countersign.core.contract import ConversationContext, StartConversation, TurnResult
from countersign.core.envelopes import AppendMessages, RepliedTurn, Summarized, SummaryRequest
from countersign.core.grants import Granted
from countersign.core.messages import ModelReply, ModelRequest
from countersign.core.policy import PolicyCheck
from countersign.core.saga import (
    CompensationOutcome,
    CompensationRequest,
    RollbackAuthorization,
)
from countersign.core.seal import ConversationInstance, SealCheck, SealRequest

In = TypeVar("In")
Out = TypeVar("Out")
NONE = type(None)


@dataclass(frozen=True)
class ActivityRef(Generic[In, Out]):
    """An activity as the workflow names it: `name` as registered, its input type, and the type the
    workflow decodes its result into. That is the definition's return type, or one member of it
    where the definition answers other callers more (`execute_tool` without `store_seq`)."""

    name: str
    input: type[In]
    result: type[Out]


# --- the conversation's start and its model ------------------------------------------------
LOAD_CONVERSATION_CONTEXT: ActivityRef[StartConversation, ConversationContext] = ActivityRef(
    "load_conversation_context", StartConversation, ConversationContext
)  # the user's roles, the agent and its tools, from PostgreSQL (every run)
REGISTER_CONVERSATION: ActivityRef[ConversationInstance, str] = ActivityRef(
    "register_conversation", ConversationInstance, str
)  # the workflow id's row names this instance: "" or why not
SEAL_CARRIED: ActivityRef[SealRequest, str] = ActivityRef("seal_carried", SealRequest, str)
VERIFY_CARRIED: ActivityRef[SealCheck, str] = ActivityRef("verify_carried", SealCheck, str)
CALL_MODEL: ActivityRef[ModelRequest, ModelReply] = ActivityRef("call_model", ModelRequest, ModelReply)
SUMMARIZE_CONVERSATION: ActivityRef[SummaryRequest, Summarized] = ActivityRef(
    "summarize_conversation", SummaryRequest, Summarized
)  # fold messages leaving the window into the running summary

# --- the conversation store --------------------------------------------------------------
APPEND_MESSAGES: ActivityRef[AppendMessages, list[int]] = ActivityRef(
    "append_messages", AppendMessages, list[int]
)  # the sequence numbers the store refused (a redelivered message)
LOAD_TURN_REPLY: ActivityRef[RepliedTurn, TurnResult] = ActivityRef(
    "load_turn_reply", RepliedTurn, TurnResult
)

# --- tool calls ---------------------------------------------------------------------------
CHECK_ARGUMENTS: ActivityRef[ToolInvocation, CheckedCall] = ActivityRef(
    "check_arguments", ToolInvocation, CheckedCall
)
CHECK_MCP_ARGUMENTS: ActivityRef[McpCall, CheckedCall] = ActivityRef(
    "check_mcp_arguments", McpCall, CheckedCall
)
EVALUATE_POLICY: ActivityRef[PolicyCheck, PolicyDecision] = ActivityRef(
    "evaluate_policy", PolicyCheck, PolicyDecision
)  # the tenant's Cedar policies on the call (only when its snapshot says it has some)
EXECUTE_TOOL: ActivityRef[ToolInvocation, StoredResult] = ActivityRef(
    "execute_tool", ToolInvocation, StoredResult
)  # the workflow always sets `store_seq`: the result is stored, history holds its `StoredResult`
EXECUTE_MCP_TOOL: ActivityRef[McpCall, StoredResult] = ActivityRef("execute_mcp_tool", McpCall, StoredResult)
RECORD_UNEXECUTED_CALL: ActivityRef[UnexecutedCall, None] = ActivityRef(
    "record_unexecuted_call", UnexecutedCall, NONE
)  # the audit row (and stored envelope) of a call refused, rejected or failed before it ran

# --- approvals and the people around them -------------------------------------------------
RECORD_APPROVAL_REQUEST: ActivityRef[RecordedApproval, Granted] = ActivityRef(
    "record_approval_request", RecordedApproval, Granted
)  # what reviewers are shown and a decision's proof binds; the grant that approved it unasked, or
# None (then nobody's grant covered it; and in histories recorded before grants)
RECORD_DECISION: ActivityRef[DecisionRecord, Verdict] = ActivityRef(
    "record_decision", DecisionRecord, Verdict
)
SEND_APPROVAL_REMINDER: ActivityRef[ApprovalReminder, None] = ActivityRef(
    "send_approval_reminder", ApprovalReminder, NONE
)
NOTIFY_APPROVAL: ActivityRef[ApprovalNotice, None] = ActivityRef("notify_approval", ApprovalNotice, NONE)
DELIVER_EMAIL: ActivityRef[int, str] = ActivityRef("deliver_email", int, str)  # outbox id → final status

# --- authority ----------------------------------------------------------------------------
AUTHORIZE_ACTION: ActivityRef[ActionCheck, str] = ActivityRef("authorize_action", ActionCheck, str)
CHECK_ACTION_PROOF: ActivityRef[ProofRequest, str] = ActivityRef("check_action_proof", ProofRequest, str)
AUTHORIZE_ROLLBACK: ActivityRef[RollbackAuthorization, str] = ActivityRef(
    "authorize_rollback", RollbackAuthorization, str
)

# --- undo ----------------------------------------------------------------------------------
COMPENSATE_CALL: ActivityRef[CompensationRequest, CompensationOutcome] = ActivityRef(
    "compensate_call", CompensationRequest, CompensationOutcome
)
RECORD_COMPENSATION_FAILURE: ActivityRef[CompensationRequest, None] = ActivityRef(
    "record_compensation_failure", CompensationRequest, NONE
)
LOAD_SAGA_ENTRIES: ActivityRef[RollbackAuthorization, list[CompensationRequest]] = ActivityRef(
    "load_saga_entries", RollbackAuthorization, list[CompensationRequest]
)  # an ended conversation's writes a rollback undoes, newest first

ACTIVITIES: tuple[ActivityRef[Any, Any], ...] = (
    LOAD_CONVERSATION_CONTEXT,
    REGISTER_CONVERSATION,
    SEAL_CARRIED,
    VERIFY_CARRIED,
    CALL_MODEL,
    SUMMARIZE_CONVERSATION,
    APPEND_MESSAGES,
    LOAD_TURN_REPLY,
    CHECK_ARGUMENTS,
    CHECK_MCP_ARGUMENTS,
    EVALUATE_POLICY,
    EXECUTE_TOOL,
    EXECUTE_MCP_TOOL,
    RECORD_UNEXECUTED_CALL,
    RECORD_APPROVAL_REQUEST,
    RECORD_DECISION,
    SEND_APPROVAL_REMINDER,
    NOTIFY_APPROVAL,
    DELIVER_EMAIL,
    AUTHORIZE_ACTION,
    CHECK_ACTION_PROOF,
    AUTHORIZE_ROLLBACK,
    COMPENSATE_CALL,
    RECORD_COMPENSATION_FAILURE,
    LOAD_SAGA_ENTRIES,
)
