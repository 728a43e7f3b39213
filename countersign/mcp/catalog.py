"""Pure rules for MCP tools: how a listed tool becomes a ToolSpec, how its arguments are checked,
how reviewers are told what the server claims, and how a result becomes an envelope.

No SDK, no I/O: the pool hands over `ListedTool`s and `CallOutcome`s, plain validated data, so the
rules are tested without a server.

Authority stays with Countersign: every MCP tool is risk "high", category "external" (its effects
are another process's, unknown to us) and tier `needs_approval` unless an operator set one. The
server's annotations (`readOnlyHint`, `destructiveHint`, ...) are shown, never obeyed.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
from pydantic import BaseModel, Field

from countersign.core.calls import Category, McpTool, Risk, Tier, ToolResult, ToolSpec
from countersign.mcp.servers import listing_hash, tool_name

MCP_RISK: Risk = "high"
MCP_CATEGORY: Category = "external"
MCP_DEFAULT_TIER: Tier = "needs_approval"
MAX_DESCRIPTION = 1_000  # characters of a server's tool description the model is shown
MAX_SCHEMA_CHARS = 20_000  # a tool whose input schema is larger is left out
HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


class ListedTool(BaseModel):
    """A tool as an MCP server lists it (camelCase keys as on the wire)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(alias="inputSchema")
    annotations: dict[str, Any] = Field(default_factory=dict)

    model_config = {"populate_by_name": True}

    def fingerprint(self) -> str:
        return listing_hash([self.name, self.description, self.input_schema])

    def shown(self) -> dict[str, Any]:
        """What a server's row keeps of it (`remember_listing`): what `permissions show` prints, and
        its input schema, which a tenant's policies are checked against (tools/policies.py)."""
        return {
            "name": self.name,
            "description": self.description[:300],
            "annotations": self.annotations,
            "inputSchema": self.input_schema,
        }


class CallOutcome(BaseModel):
    """What a server answered to `tools/call`, content reduced to JSON-able parts."""

    is_error: bool = False
    structured: Any = None
    texts: list[str] = Field(default_factory=list)
    other: list[dict[str, Any]] = Field(default_factory=list)  # images, resources: type and size only


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` in which every object refuses keys it does not declare."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" or "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


def spec_of(server: str, listed: ListedTool, tier: Tier | None) -> ToolSpec | None:
    """The snapshot entry of one listed tool, or None when it cannot be offered safely (a name no
    model API accepts, a schema that is no JSON Schema object or is oversized)."""
    name = tool_name(server, listed.name)
    if name is None or listed.input_schema.get("type") != "object":
        return None
    try:
        jsonschema.validators.validator_for(listed.input_schema).check_schema(listed.input_schema)
    except jsonschema.SchemaError:
        return None
    parameters = closed(listed.input_schema)
    if len(json.dumps(parameters)) > MAX_SCHEMA_CHARS:
        return None
    parameters.pop("title", None)
    hints = {k: v for k, v in listed.annotations.items() if k in (*HINTS, "title")}
    return ToolSpec(
        name=name,
        description=f"[MCP server {server}] {listed.description}"[:MAX_DESCRIPTION],
        parameters=parameters,
        risk=MCP_RISK,
        category=MCP_CATEGORY,
        tier=tier or MCP_DEFAULT_TIER,
        mcp=McpTool(server=server, tool=listed.name, fingerprint=listed.fingerprint(), annotations=hints),
    )


def argument_errors(spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit the snapshotted schema (unknown keys included), else None."""
    validator_class = jsonschema.validators.validator_for(spec.parameters)
    errors = sorted(validator_class(spec.parameters).iter_errors(arguments), key=lambda e: list(e.path))
    if not errors:
        return None
    return "; ".join(
        f"{'.'.join(str(p) for p in e.path) or 'arguments'}: {e.message[:300]}" for e in errors[:5]
    )


def normalized(schema: Any, value: Any) -> Any:
    """`value` in the one spelling its schema gives it: an MCP tool's plan (Countersign resolves
    nothing of what its arguments mean, so its plan is the call, normalized). Strings of
    `format: "email"` trimmed and lowercased, a whole number given as `3.0` where the schema wants
    an integer as `3`, objects' keys sorted, recursing into `properties` and `items`; anything else
    as given. The arguments must already fit the schema (`argument_errors`)."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, str) and schema.get("format") == "email":
        return value.strip().lower()
    if isinstance(value, float) and schema.get("type") == "integer" and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [normalized(schema.get("items"), item) for item in value]
    if isinstance(value, dict):
        properties = schema.get("properties")
        fields = properties if isinstance(properties, dict) else {}
        return {key: normalized(fields.get(key), value[key]) for key in sorted(value)}
    return value


def mcp_result(outcome: CallOutcome, tool: str) -> ToolResult:
    """The envelope the model sees (before the common redaction and truncation)."""
    text = "\n".join(outcome.texts)
    if outcome.is_error:
        return ToolResult.failure("INTERNAL_ERROR", f"{tool} reported an error: {text[:2_000]}")
    data: dict[str, Any] = {}
    if outcome.structured is not None:
        data["result"] = outcome.structured
    elif text:
        data["text"] = text
    if outcome.other:
        data["other_content"] = outcome.other
    return ToolResult.success(data)
