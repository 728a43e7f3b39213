"""What crosses the boundary between the workflow and the tool activities.

The workflow never imports tool code (it does I/O); it gets `ToolSpec`s from the context activity and
hands `ToolInvocation`s to the tool activity, which answers with a `ToolResult` envelope: the exact
JSON the model sees (CONTRACT.md, "Tool results").
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

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
]


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
    def success(cls, data: Any) -> ToolResult:
        return cls(ok=True, data=data)

    @classmethod
    def failure(cls, code: ErrorCode, message: str) -> ToolResult:
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


class ToolInvocation(BaseModel):
    caller: CallerContext
    workflow_id: str
    run_id: str
    call_id: str
    tool: str
    arguments: str  # raw JSON text from the model (or edited by an approver)
    turn: int = 0
    approved_by: str | None = None
    # The model's arguments when the approver edited them (`arguments` then holds the edit): the
    # audit keeps both (tool_executions.args and edited_args).
    model_arguments: str | None = None


class McpCall(BaseModel):
    """A call of an MCP tool with the spec its conversation snapshotted (activities/mcp.py)."""

    invocation: ToolInvocation
    spec: ToolSpec
