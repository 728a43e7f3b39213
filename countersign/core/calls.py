"""What crosses the boundary between the workflow and the tool activities.

The workflow never imports tool code (it does I/O); it gets `ToolSpec`s from the context activity and
hands `ToolInvocation`s to the tool activity, which answers with a `ToolResult` envelope: the exact
JSON the model sees (CONTRACT.md, "Tool results").
"""

from __future__ import annotations

import json
from typing import Any, Literal, Self

from pydantic import BaseModel, Field

from countersign.core.bounds import loads_bounded
from countersign.core.effects import FieldChange, canonical_json

Risk = Literal["low", "medium", "high"]
Category = Literal["read", "write", "external"]
Tier = Literal["always_allow", "needs_approval", "blocked"]
ErrorCode = Literal[
    "UNAUTHORIZED",
    "FORBIDDEN",
    "BLOCKED",
    "REJECTED",
    "EXPIRED",
    "VALIDATION_ERROR",
    "UNKNOWN_TOOL",
    "NOT_FOUND",
    "CONFLICT",
    "RATE_LIMITED",
    "LIMIT_REACHED",
    "INTERNAL_ERROR",
    "SCOPES_MISSING",  # the conversation's user lacks a grant the tool needs (countersign/core/access.py)
    "CONNECTION_INACTIVE",  # the conversation's user was removed or deactivated since it started
    # what an approved call would do now differs from what was approved: nothing ran, it is asked again
    "EFFECT_CHANGED",
    # a call nobody approved needs approval under the rules in force now (a tier set since, a
    # policy's quorum): nothing ran, it is asked (activities/rules.py); the model never reads it
    "APPROVAL_REQUIRED",
]


# A tenant's Cedar policy set on one call (countersign/core/cedar_policy.py decides it, in an activity).
PolicyOutcome = Literal["forbid", "permit_run", "permit_approvals", "no_match"]


class PolicyDecision(BaseModel):
    """What the tenant's policies say about one call; `policy` is the deciding policy's `@id`."""

    outcome: PolicyOutcome
    policy: str | None = None
    approvals: int = 0  # permit_approvals: how many distinct approvers
    approvers: list[str] = Field(default_factory=list)  # roles that may approve ([]: the tool's own)
    error: str | None = None  # a policy's evaluation failed: the call is refused, naming it
    version: int | None = None  # the enforced set's version that decided (recorded with the decision)


NO_MATCH = PolicyDecision(outcome="no_match")


class RulesNow(BaseModel):
    """The rules in force at a call, read when it is checked or run (activities/rules.py): the
    operators' tier for its tool now, and the tenant's enforced set's decision now (None: no set,
    or none of its policies matched, and the tier decides)."""

    tier: Tier
    policy: PolicyDecision | None = None
    roles: list[str] = Field(default_factory=list)  # the requester's now, sorted: recorded with the call


class ToolError(BaseModel):
    code: ErrorCode
    message: str


class ToolResult(BaseModel):
    """`{"ok": true, "data": …}` | `{"ok": false, "needs": {…}}` | `{"ok": false, "error": {…}}`."""

    ok: bool
    data: Any = None
    needs: dict[str, bool] | None = None
    error: ToolError | None = None

    @classmethod
    def success(cls, data: Any) -> Self:
        return cls(ok=True, data=data)

    @classmethod
    def failure(cls, code: ErrorCode, message: str) -> Self:
        return cls(ok=False, error=ToolError(code=code, message=message))

    @classmethod
    def needing(cls, **fields: bool) -> ToolResult:
        return cls(ok=False, needs=fields)

    def envelope(self) -> dict[str, Any]:
        if self.ok:
            return {"ok": True, "data": self.data}
        if self.needs is not None:  # with the candidates to choose from, when the tool found several
            return {"ok": False, "needs": self.needs, **({"candidates": self.data} if self.data else {})}
        assert self.error is not None
        return {"ok": False, "error": self.error.model_dump()}

    def to_content(self) -> str:
        """The tool message content the model reads."""
        return json.dumps(self.envelope(), default=str, separators=(",", ":"))

    @property
    def code(self) -> ErrorCode | None:
        return self.error.code if self.error else None


class McpTool(BaseModel):
    """Where an MCP tool comes from, snapshotted with its spec (countersign/mcp/).

    `fingerprint` hashes the server's name, description and input schema of the tool as listed at
    conversation start: a call whose server now lists something else is refused, not guessed at.
    `annotations` are the server's hints (`readOnlyHint`, `destructiveHint`, ...), shown to
    reviewers and never used as authority.
    """

    server: str
    tool: str
    fingerprint: str
    annotations: dict[str, Any] = Field(default_factory=dict)

    def hints(self) -> str:
        """The server's claims, worded as claims, for reviewers: `MCP server git says (unverified): …`."""
        words = {
            "readOnlyHint": ("read-only", "not read-only"),
            "destructiveHint": ("destructive", "not destructive"),
            "idempotentHint": ("idempotent", "not idempotent"),
            "openWorldHint": ("reaches outside systems", "closed world"),
        }
        said = [
            words[k][0 if v else 1] for k, v in self.annotations.items() if k in words and isinstance(v, bool)
        ]
        claims = ", ".join(said) if said else "no hints"
        return f"MCP server {self.server} says (unverified): {claims}"


class ToolSpec(BaseModel):
    """A tool as the workflow sees it: its OpenAI schema plus the policy facts about it."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments
    risk: Risk
    category: Category
    tier: Tier  # the agent's snapshotted tier, already resolved from the default
    required_roles: list[str] = Field(default_factory=list)
    compensable: bool = False
    # Run as a local activity: inside the workflow task that asked for it, recorded as a marker,
    # without a round trip through the server's task queue. Snapshotted with the rest, so a
    # conversation started before a tool became local keeps running it as it did.
    local: bool = False
    mcp: McpTool | None = None  # set for a tool an MCP server provides (`mcp__SERVER__TOOL`)

    def openai_tool(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
                # an MCP server's schema is not written for strict mode (optional properties);
                # the MCP activities validate arguments against it themselves
                "strict": self.mcp is None,
            },
        }


class CallerContext(BaseModel):
    """Who is acting. Built from the trusted workflow input and the database, never from the model."""

    tenant_id: str
    user_id: str
    roles: list[str]
    agent: str


def call_key(workflow_id: str, conversation_id: str, call_id: str) -> str:
    """A call's key in idempotency keys and locks: `workflow:instance:call` (`workflow:call` for a
    conversation from before instances, whose rows and keys are spelled that way). Call ids restart
    at c1 in every instance: without the instance, a conversation started again under a closed
    one's workflow id was handed the old one's results and emails."""
    return f"{workflow_id}:{conversation_id}:{call_id}" if conversation_id else f"{workflow_id}:{call_id}"


def lock_key(workflow_id: str, call_id: str) -> str:
    """The advisory lock that serializes attempts of a call: `workflow:call`, across instances.

    Coarser than `call_key` on purpose: one run of a workflow id is open at a time, so all it adds
    is ordering a closed run's straggling attempt against a new instance's call of the same id
    (their rows and results stay apart, by `call_key`). And a key known before the conversation
    starts lets an operator (or a fault test) hold a call in flight.
    """
    return f"{workflow_id}:{call_id}"


class ApproverEdit(BaseModel):
    """A reviewer's edit of a call's arguments on approving it, as the model is told with the result:
    each argument they changed, as the model asked it (`before`) and as approved (`after`), and why."""

    approver: str
    changes: dict[str, FieldChange] = {}
    reason: str | None = None

    def note(self) -> str:
        """One line for the model: "bob changed new_status from "qualified" to "contacted" (reason: …)"."""
        changed = "; ".join(
            f"{name} from {canonical_json(c.before)} to {canonical_json(c.after)}"
            for name, c in self.changes.items()
        )
        why = f"reason: {self.reason}" if self.reason else "no reason given"
        return f"{self.approver} changed {changed or 'the arguments'} before approving ({why})"


def argument_changes(asked: dict[str, Any], approved: dict[str, Any]) -> dict[str, FieldChange]:
    """The arguments a reviewer changed: each key whose value differs, as asked and as approved (a
    key one side lacks counts as null), in sorted order."""
    return {
        name: FieldChange(before=asked.get(name), after=approved.get(name))
        for name in sorted(asked.keys() | approved.keys())
        if asked.get(name) != approved.get(name)
    }


class ToolInvocation(BaseModel):
    caller: CallerContext
    workflow_id: str
    conversation_id: str = ""  # the conversation instance (countersign.db.schema.Conversation)
    run_id: str
    call_id: str
    tool: str
    arguments: str  # raw JSON text from the model (or edited by an approver)
    turn: int = 0
    approved_by: str | None = None
    grant_id: int | None = None  # approved unasked, by this grant of `approved_by` (core/grants.py)
    # The model's arguments when the approver edited them (`arguments` then holds the edit): the
    # audit keeps both (tool_executions.args and edited_args), and the model is told of the edit.
    model_arguments: str | None = None
    # With `model_arguments`: who changed which arguments and why, told to the model with the result.
    approver_edit: ApproverEdit | None = None
    # The sequence number at which the activity that produces the call's result stores it as a
    # tool message (conversation store), answering with a `StoredResult`; AgentWorkflow always sets
    # it. None (a call outside a conversation, e.g. the bench's in-process loop): the whole `ToolResult`.
    store_seq: int | None = None
    # The tenant's policy decision on the call, when its policies decided (tool_executions.policy)
    policy: PolicyDecision | None = None

    @property
    def key(self) -> str:
        return call_key(self.workflow_id, self.conversation_id, self.call_id)

    @property
    def arguments_edited(self) -> bool:
        """`arguments` are an approver's edit."""
        return self.model_arguments is not None


class McpCall(BaseModel):
    """A call of an MCP tool with the spec its conversation snapshotted (activities/mcp.py)."""

    invocation: ToolInvocation
    spec: ToolSpec


# --- tool results in the conversation store --------------------------------------------------

# Tools whose results name queued outbox rows the workflow delivers after the turn's undo window
# (`outbox_id` with status "queued", or `outbox_ids`). Named, not inferred from a result's shape:
# an MCP tool's result may say anything.
QUEUES_EMAIL = frozenset(
    {
        "send_email",
        "send_email_to_contact",
        "send_draft",
        "schedule_meeting",
        "confirm_meeting",
        "accept_meeting",
    }
)


def queued_emails(tool: str, data: dict[str, Any]) -> list[int]:
    """The outbox rows a tool call's result queued (none for other tools, and nothing but ints)."""
    if tool not in QUEUES_EMAIL:
        return []
    if data.get("status") == "queued" and isinstance(data.get("outbox_id"), int):
        return [data["outbox_id"]]
    ids = data.get("outbox_ids")
    return [i for i in ids if isinstance(i, int)] if isinstance(ids, list) else []


def result_for_model(invocation: ToolInvocation, result: ToolResult) -> ToolResult:
    """The result the model reads: a call that ran with an approver's edited arguments says so, and
    (`approver_edit`) which arguments the reviewer changed from what to what, and why."""
    if not (invocation.arguments_edited and result.ok):
        return result
    edited, _ = loads_bounded(invocation.arguments)  # validated by record_decision: always an object
    data: dict[str, Any] = {"result": result.data, "arguments_edited_by_approver": edited}
    edit = invocation.approver_edit
    if edit is not None:
        data["approver_edit"] = {
            "note": edit.note(),
            "approved_by": edit.approver,
            "changed": {name: {"from": c.before, "to": c.after} for name, c in edit.changes.items()},
            "reason": edit.reason,
        }
    return result.model_copy(update={"data": data})


class CheckedCall(ToolResult):
    """A call's arguments checked before anyone is asked (`check_arguments`, `check_mcp_arguments`),
    with the rules in force then, which the workflow acts on; None in results recorded before."""

    rules: RulesNow | None = None

    def envelope_result(self) -> ToolResult:
        """The result alone, as the model reads it and the audit keeps it."""
        return ToolResult(ok=self.ok, data=self.data, needs=self.needs, error=self.error)


class StoredResult(BaseModel):
    """What workflow history carries of a tool result stored in the conversation store: never its
    body, only what the workflow decides by (ok, the error code, emails to deliver) and what its
    context window counts (the stored message's estimated tokens)."""

    seq: int
    call_id: str
    tool: str
    ok: bool
    code: ErrorCode | None = None
    needs: list[str] | None = None  # the fields the tool asks for (`{"ok": false, "needs": ...}`)
    tokens: int = 0
    outbox: list[int] = Field(default_factory=list)  # emails the call queued (QUEUES_EMAIL tools)

    def stub(self) -> str:
        """The tool message content the `transcript` query shows in place of the body: valid JSON
        with the envelope's fields and where the body is (`stored_at`, see `stored_at`)."""
        shown: dict[str, Any] = {"ok": self.ok}
        if self.code is not None:
            shown["error"] = {"code": self.code}
        if self.needs is not None:
            shown["needs"] = self.needs
        return json.dumps(shown | {STORED_AT: self.seq}, separators=(",", ":"))


STORED_AT = "stored_at"


def stored_at(content: str | None) -> int | None:
    """The sequence number a `StoredResult.stub` names (None for any other content): a real
    envelope never has this key, so the stub cannot be mistaken for a tool's answer."""
    if not content or STORED_AT not in content:
        return None
    try:
        shown = json.loads(content)
    except ValueError:
        return None
    seq = shown.get(STORED_AT) if isinstance(shown, dict) else None
    return seq if isinstance(seq, int) else None


# The audit outcome (`tool_executions.outcome`) of a call whose result carries an error, by its code.
# A call stopped before its activity (`record_unexecuted_call`) may meet any of them. A call its
# activity ran has only the checks made before the tool to speak for it, its arguments (`invalid`)
# and the access gate (`refused`): whatever the tool itself answers has `failed` (a tool refusing
# with FORBIDDEN failed; policy did not block it).
OUTCOME_OF: dict[ErrorCode, str] = {
    "UNKNOWN_TOOL": "invalid",
    "VALIDATION_ERROR": "invalid",
    "BLOCKED": "blocked",
    "FORBIDDEN": "blocked",
    "LIMIT_REACHED": "limit_reached",
    "REJECTED": "rejected",
    "EXPIRED": "expired",
    "SCOPES_MISSING": "refused",
    "CONNECTION_INACTIVE": "refused",
}
BEFORE_THE_TOOL = frozenset({"invalid", "refused"})


def outcome_of(code: ErrorCode | None, *, ran: bool) -> str:
    """The audit outcome of a call whose result has error `code` (None: no error), `ran` by its
    activity or stopped before it. One table for the audit rows and the metrics that count them;
    an activity that cannot know whether its call took effect records `unknown` instead."""
    if code is None:
        return "executed" if ran else "failed"
    outcome = OUTCOME_OF.get(code, "failed")
    return outcome if not ran or outcome in BEFORE_THE_TOOL else "failed"


class UnexecutedCall(BaseModel):
    invocation: ToolInvocation
    result: ToolResult  # the error envelope the model was given
    reason: str | None = None  # who decided and why, for rejected and expired calls
