"""The conversation's public shapes: workflow input, limits, signal/update payloads, query views.

Names and keys are fixed by CONTRACT.md ("The workflow").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from countersign.core.approvals import Approval
from countersign.core.authority import ActionCheck
from countersign.core.bounds import (
    Count,
    Identifier,
    PositiveCount,
    Proof,
    Text,
    Tokens,
    TurnSeconds,
    WaitSeconds,
)
from countersign.core.calls import Risk, StoredResult, ToolSpec
from countersign.core.envelopes import Cursor, WindowPolicy
from countersign.core.messages import MAX_ARGUMENTS_CHARS, MAX_TOOL_NAME_CHARS, ChatMessage, ToolCall, Usage
from countersign.core.saga import Saga

WORKFLOW_TYPE = "AgentWorkflow"
ROLLBACK_WORKFLOW_TYPE = "ConversationRollback"  # compensations asked for after a conversation ended
AgentState = Literal["running", "awaiting_approval", "awaiting_answer", "idle", "rolling_back", "ended"]


class Limits(BaseModel):
    """Guards on one turn (iterations, tool calls, tokens, wall clock) and waits (approval, answer, idle).

    Every value is finite and bounded (countersign.core.bounds): checked by the CLI, and again when the
    worker decodes the start input.
    """

    model_config = ConfigDict(extra="forbid")

    max_iterations: PositiveCount = 8  # model calls per turn
    max_tool_calls: Count = 20  # tool calls per turn
    max_tokens: Tokens = 50_000  # prompt + completion tokens per turn
    turn_timeout_s: TurnSeconds = 300.0
    approval_timeout_s: WaitSeconds | None = None  # None: per-risk defaults
    answer_timeout_s: WaitSeconds = 86_400.0
    idle_timeout_s: WaitSeconds = 86_400.0
    # A run continues-as-new when the SDK suggests it, or after this many turns, whichever is first.
    max_turns_per_run: PositiveCount = 100


class AgentLimits(BaseModel):
    """An agent's bounds (`agent_profiles.limits`): each key set caps the conversation's value.

    The agent's value is also the conversation's default when it is below the built-in default
    (admin-assistant: 7 iterations, 50 s a turn); a conversation may ask for less, never for more.
    """

    model_config = ConfigDict(extra="forbid")

    # The same bounds as `Limits`: `within_agent_bounds` caps with `model_copy`, which does not
    # validate, so a bound Limits would refuse (a 0.5 s turn) must be refused here, where it is read.
    max_iterations: PositiveCount | None = None
    max_tool_calls: Count | None = None
    max_tokens: Tokens | None = None
    turn_timeout_s: TurnSeconds | None = None
    approval_timeout_s: WaitSeconds | None = None
    answer_timeout_s: WaitSeconds | None = None
    idle_timeout_s: WaitSeconds | None = None


class AgentSnapshot(BaseModel):
    """The agent as a run loaded it (`agent_profiles`, countersign.db.schema.AgentProfile)."""

    name: str
    description: str = ""
    system_prompt: str
    atomic_turns: bool = False


DEFAULT_APPROVAL_TIMEOUTS: dict[Risk, float] = {"low": 86_400.0, "medium": 86_400.0, "high": 86_400.0}


class ApprovalPolicy(BaseModel):
    """How long a call may wait for a decision, by risk, and when to remind reviewers."""

    timeout_s: dict[Risk, float] = Field(default_factory=lambda: dict(DEFAULT_APPROVAL_TIMEOUTS))
    reminder_lead_s: float = 3_600.0  # remind this long before expiry

    def timeout_for(self, risk: Risk, override_s: float | None) -> float:
        return override_s or self.timeout_s.get(risk, 86_400.0)


class ConversationContext(BaseModel):
    """Loaded once at start by an activity, then snapshotted in workflow state (and history)."""

    tenant_id: str
    user_id: str
    roles: list[str]
    agent: AgentSnapshot
    tools: list[ToolSpec]  # every tool of the agent with its snapshotted tier, blocked ones included
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    email_delivery_delay_s: float = 60.0
    agent_limits: AgentLimits = Field(default_factory=AgentLimits)
    policy: WindowPolicy = Field(default_factory=WindowPolicy)  # what the model sees and may spend
    # Read only from runs that loaded it (before the rules in force were read at each call,
    # activities/rules.py): True made each call pass the policy gate (`evaluate_policy`) first.
    # Runs load it False: the activities each call runs anyway read the tenant's sets now.
    has_policies: bool = False


class SubmitMessage(BaseModel):
    user_id: Identifier
    text: Text
    message_id: Identifier | None = None  # set by clients that want to wait for this message's reply
    proof: Proof | None = None  # signed mode: the server's proof for exactly this message


class WaitingTurn(BaseModel):
    """A turn that continued as new while its tool calls waited for people (workflows/tools.py).

    Carried, sealed with the rest of CarriedState, when the run's history grew (a flood of signals)
    while every unfinished call of the batch waited for a reviewer or the user's answer: the next
    run waits for the same approvals and questions, their deadlines unchanged (`expires_at`, and the
    reminder before it, sent only when its moment is still ahead), then finishes the batch and the turn.
    """

    calls: list[ToolCall]  # the batch the model asked for
    seqs: list[int]  # where each call's result is stored
    budget: int  # how many of them may run
    results: list[StoredResult | None]  # the calls already finished, by position
    approvals: list[Approval] = Field(default_factory=list)  # pending, as reviewers see them
    questions: list[PendingQuestion] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)  # the turn's so far
    started: datetime | None = None  # when the turn started (its wall-clock budget)
    human_wait_s: float = 0.0  # time it spent waiting for people, off that budget
    message_id: str | None = None  # the message the turn answers
    emails: list[int] = Field(default_factory=list)  # queued by the turn: delivered after it


class CarriedState(BaseModel):
    """What a conversation carries into its next run when it continues-as-new.

    Sealed (`StartConversation.seal`, activities/carried.py) and verified by the next run: a client
    cannot start a conversation with invented state. Roles, tiers and limits are never carried:
    every run loads them from the database (`context` is only read from runs started before that).
    """

    context: ConversationContext | None = None
    messages: list[ChatMessage]
    usage: Usage
    turn: int
    call_seq: int
    inbox: list[SubmitMessage] = Field(default_factory=list)
    saga: Saga = Field(default_factory=Saga)
    outbox: list[int] = Field(default_factory=list)  # queued emails not delivered yet
    cursor: Cursor | None = None  # conversations since the message store: `messages` stays empty
    # The conversation instance (its first run's id): every stored row and read names it, and the
    # seal binds it. "" in state carried before instances, which no seal of today verifies.
    conversation_id: str = ""
    waiting: WaitingTurn | None = None  # a turn that continued as new while it waited for people
    # An `end` accepted while the turn waited for people: the next run finishes that turn, then ends.
    ended_by: str | None = None
    # Refusals still being recorded when the run continued as new (its grace for handlers ran out):
    # the next run records them first, so a flood cannot keep a refusal off the record.
    refusals: list[ActionCheck] = Field(default_factory=list)


class StartConversation(BaseModel):
    """Workflow input. Tenant and user come from the trusted caller that starts the workflow."""

    model_config = ConfigDict(extra="forbid")

    tenant_id: Identifier
    user_id: Identifier
    agent: Identifier
    message: Text | None = None
    single_turn: bool = False
    limits: Limits = Field(default_factory=Limits)
    carried: CarriedState | None = None  # set only by continue-as-new
    seal: str | None = None  # the worker's MAC over `carried`, bound to the workflow id
    proof: Proof | None = None  # signed mode: the server's proof that the user started exactly this

    def proof_content(self) -> dict[str, Any]:
        """What a start's proof binds besides tenant, user, agent and workflow id: what it asks."""
        return {
            "message": self.message,
            "single_turn": self.single_turn,
            "limits": self.limits.model_dump(mode="json"),
        }


TurnStop = Literal["completed", "limit_reached", "error"]


class TurnResult(BaseModel):
    turn: int
    reply: str | None
    stop: TurnStop
    usage: Usage  # this turn's


class ConversationResult(BaseModel):
    turns: int
    last_reply: str | None
    usage: Usage
    ended_by: str


# --- signals and updates ---------------------------------------------------------------------


class EndConversation(BaseModel):
    requested_by: Identifier
    proof: Proof | None = None  # APPROVER_AUTH=signed: the inbox's proof for ending this conversation


class AnswerSignal(BaseModel):
    call_id: Identifier
    user_id: Identifier
    text: Text
    proof: Proof | None = None  # APPROVER_AUTH=signed: the inbox's proof for exactly this answer


class PendingQuestion(BaseModel):
    """An `ask_human` call waiting for the user's `answer`."""

    call_id: str
    question: str
    asked_at: str
    expires_at: str


# --- queries ----------------------------------------------------------------------------------


class PendingApproval(BaseModel):
    call_id: str
    tool: str
    args: str
    risk: Risk
    requested_by: str
    requested_at: str
    expires_at: str
    hints: str | None = None  # an MCP tool's annotations as the server claims them: shown, never trusted
    description: str | None = None  # an MCP tool's, from the snapshot (native ones: the registry)
    parameters: dict[str, Any] | None = None  # an MCP tool's input schema, from the snapshot
    quorum: str = ""  # a policy's quorum so far: "1 of 2: bob approved" ("" for one approval)

    @staticmethod
    def of(approval: Approval, mcp_spec: ToolSpec | None = None) -> PendingApproval:
        """What reviewers see of `approval`; for an MCP tool (`mcp_spec`, from the snapshot) its
        description and input schema too, from which the inbox builds its edit form (native ones are
        in the registry)."""
        return PendingApproval(
            call_id=approval.call_id,
            tool=approval.tool,
            args=approval.args,
            risk=approval.risk,
            requested_by=approval.requested_by,
            requested_at=approval.requested_at.isoformat(),
            expires_at=approval.expires_at.isoformat(),
            hints=approval.hints,
            description=mcp_spec.description if mcp_spec else None,
            parameters=mcp_spec.parameters if mcp_spec else None,
            quorum=approval.progress(),
        )


class StatusView(BaseModel):
    state: AgentState
    turn: int
    pending_approvals: list[PendingApproval] = Field(default_factory=list)
    pending_questions: list[PendingQuestion] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    limits: Limits = Field(default_factory=Limits)
    tenant_id: str = ""
    user_id: str = ""  # whose conversation it is: only they may send messages and answers
    agent: str = ""
    last_error: str | None = None
    compensation_failures: list[str] = Field(default_factory=list)
    policy: WindowPolicy | None = None  # the context window and token budget (message store on)


class Reply(BaseModel):
    """What the server's `GET /api/conversations/{wf}/reply` answers: the turn's result, what it
    waits for (a person), that it still runs (ask again), or that the conversation ended."""

    state: Literal["replied", "waiting", "running", "ended"]
    turn: TurnResult | None = None
    status: StatusView | None = None


class ServedCall(BaseModel):
    """A tool call a client asks the conversation for directly, without a model turn (Countersign
        as an MCP server: `countersign/server/mcp_face.py`): the `serve_call` update's payload.

        `arguments` is the JSON text as the client sent it; it goes through the same screening,
        argument check, tiers, approval and audit as a model's call. Sending the same `call_id` again
        (with the same tool and arguments) asks how that call stands: it never runs it twice; `resume`
    asks only that, refused when this run has no such call."""

    user_id: Identifier
    call_id: Identifier
    tool: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    arguments: str = Field("{}", max_length=MAX_ARGUMENTS_CHARS)
    proof: Proof | None = None  # signed mode: the server's proof for exactly this call
    resume: bool = False  # only wait for an earlier call to finish: never start one

    def tool_call(self) -> ToolCall:
        return ToolCall(id=self.call_id, name=self.tool, arguments=self.arguments)


class ServedOutcome(BaseModel):
    """How a served call stands: `done` (its result's envelope; the body is in the store at
    `result.seq`) or `waiting` for a reviewer (`expires_at`: when it fails closed)."""

    call_id: str
    state: Literal["done", "waiting"]
    result: StoredResult | None = None
    expires_at: datetime | None = None
