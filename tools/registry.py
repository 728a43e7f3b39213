"""The tool registry: a tool is one decorated async function, declared once in typed code.

    class SearchLeadsArgs(ToolArgs):
        query: str = Field(description="Name, email or company to look for")

    @tool(risk="low", category="read")
    async def search_leads(ctx: ToolContext, args: SearchLeadsArgs) -> LeadList:
        \"\"\"Search the tenant's leads.\"\"\"

The name is the function's, the description its docstring, the arguments model its second
parameter's annotation and the result model its return annotation. The OpenAI schema is generated
from the arguments model in strict mode. Tenant, user and roles reach a tool only through
`ToolContext`; an arguments model that declares them is refused at import time.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from typing import Any, Literal, Self, get_type_hints

from pydantic import BaseModel, ConfigDict, model_validator
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.access import Scope
from countersign.core.calls import CallerContext, Category, ErrorCode, Risk, Tier, ToolSpec, call_key
from countersign.core.effects import Effect

# Identity fields only the trusted caller may set; no arguments model may declare them.
IDENTITY_FIELDS = frozenset({"tenant_id", "tenant", "user_id", "user", "roles", "role", "caller"})


# What the code and the database can hold: BIGINT ids and counts, and dates whose UTC conversion
# (an offset moves them by up to a day) stays inside Python's and PostgreSQL's calendars.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EARLIEST_YEAR, LATEST_YEAR = 1900, 2199
ASCII_ID = re.compile(r"[0-9]{1,19}")  # what `int()` accepts of digit strings (`isdigit` accepts "²")


def out_of_range(value: Any) -> str | None:
    """Why a value from the model cannot be stored or compared with the database, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return "integers must fit in 64 bits"
    if isinstance(value, float) and not math.isfinite(value):
        return "numbers must be finite"
    if isinstance(value, date) and not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
        return f"dates must be between the years {EARLIEST_YEAR} and {LATEST_YEAR}"
    if isinstance(value, timedelta) and abs(value) > timedelta(days=3650):
        return "durations must be under ten years"
    if isinstance(value, BaseModel):
        return next(filter(None, (out_of_range(v) for v in value.__dict__.values())), None)
    if isinstance(value, dict):
        return next(filter(None, (out_of_range(v) for v in value.values())), None)
    if isinstance(value, list | tuple | set | frozenset):
        return next(filter(None, (out_of_range(v) for v in value)), None)
    return None


def record_id(ref: str) -> int | None:
    """`ref` as a BIGINT id when it is one (ASCII digits, 1..2^63-1), else None: a name or email."""
    if not ASCII_ID.fullmatch(ref):
        return None
    value = int(ref)
    return value if 1 <= value <= INT64_MAX else None


class ToolArgs(BaseModel):
    """Base of every arguments model: unknown keys (a model trying `tenant_id`) are errors, and
    every number and date must be one the database can hold (checked before any approval)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    @model_validator(mode="after")
    def _within_range(self) -> Self:
        problem = out_of_range(self)
        if problem is not None:
            raise ValueError(problem)
        return self


class ToolFailure(Exception):
    """Raised by a tool for an expected failure; becomes `{"ok": false, "error": {code, message}}`."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message


class OutcomeUnknown(ToolFailure):
    """The call's effect was sent out and no usable answer came: audited as `unknown`, not as not done."""


class Needs(BaseModel):
    """Returned by a tool that cannot proceed without more (or less ambiguous) input."""

    fields: dict[str, bool]
    candidates: list[dict[str, Any]] = []


@dataclass
class ToolContext:
    """What a tool may know about the call. `session` is inside the call's transaction."""

    caller: CallerContext
    session: AsyncSession
    workflow_id: str
    call_id: str
    now: datetime
    conversation_id: str = ""
    # A preview sets it when it runs inside the transaction that makes the change: it then takes the
    # rows it reads FOR UPDATE, so nothing changes them between the check and the change.
    lock_reads: bool = False
    # When the call was put to a reviewer (its approval request's `requested_at`), for the preview the
    # reviewer is shown and for the run after the decision alike; None for a call nobody was asked
    # about. A default that depends on the clock (schedule_meeting's window) starts from `asked`, so
    # the run resolves what was approved however long the decision took.
    asked_at: datetime | None = None

    @property
    def asked(self) -> datetime:
        """When the call was asked: its approval request's time, else now."""
        return self.asked_at or self.now

    @property
    def tenant_id(self) -> str:
        return self.caller.tenant_id

    @property
    def idempotency_key(self) -> str:
        """Stable across activity retries of the same call, and unique across conversation
        instances: workflow id, instance, call id (calls.call_key)."""
        return call_key(self.workflow_id, self.conversation_id, self.call_id)


ToolFn = Callable[[ToolContext, Any], Awaitable[BaseModel]]

# What a compensation found and did. It must tolerate a forward step that never committed
# ("never_happened") and running twice ("already_undone"); "irreversible" records an effect that
# cannot be taken back (an email already delivered).
UndoOutcome = Literal["undone", "already_undone", "never_happened", "irreversible"]
# (context, the forward call's validated arguments, the forward call's recorded result data or None
# when the forward step never recorded one) -> outcome
CompensationFn = Callable[[ToolContext, Any, dict[str, Any] | None], Awaitable[UndoOutcome]]
# (context, the call's validated arguments) -> what the call would do if it ran now, resolved without
# changing anything (countersign/core/effects.py); see tools/effects.py. It may raise what the tool
# raises for the same arguments (ToolFailure, NeedsInput): the effect then names the problem.
PreviewFn = Callable[[ToolContext, Any], Awaitable[Effect]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args_model: type[ToolArgs]
    result_model: type[BaseModel]
    risk: Risk
    category: Category
    default_tier: Tier
    required_roles: tuple[str, ...]
    local: bool
    fn: ToolFn = field(repr=False)
    preview: PreviewFn = field(repr=False)
    compensation: CompensationFn | None = field(default=None, repr=False)
    # the grants the conversation's user must hold for it to run (activities/access.py)
    scopes: tuple[Scope, ...] = ()
    # arguments a reviewer's grant does not bind (countersign/core/grants.py: `scope_digest`)
    free_args: tuple[str, ...] = ()

    def spec(self, tier: Tier | None = None) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=strict_schema(self.args_model),
            risk=self.risk,
            category=self.category,
            tier=tier or self.default_tier,
            required_roles=list(self.required_roles),
            compensable=self.compensation is not None,
            local=self.local,
        )


REGISTRY: dict[str, Tool] = {}


def default_tier_for(risk: Risk, category: Category) -> Tier:
    """Restrictive by default: anything that changes data or reaches outside waits for a human until
    an operator sets the agent's tier (`permissions set`); only reads run unasked."""
    return "always_allow" if category == "read" and risk != "high" else "needs_approval"


def tool(
    *,
    risk: Risk,
    category: Category,
    tier: Tier | None = None,
    roles: tuple[str, ...] = (),
    local: bool | None = None,
    scopes: tuple[Scope, ...] = (),
    free_args: tuple[str, ...] = (),
    preview: PreviewFn,
) -> Callable[[ToolFn], ToolFn]:
    """Declare a tool. See the module docstring.

    `preview` resolves what a call will do (tools/effects.py): what a reviewer is shown and
    decides. Every tool has one, reads too (`tools.effects.reads_only`); its arguments model must
    be the tool's.

    `scopes` are the grants the conversation's user must hold (`user_scopes`) for the tool to run.

    `free_args` (default none) are arguments a reviewer's grant of "the same again" does not bind
    (countersign/core/grants.py): a later call differing only in them (a `reason`, say) is covered.

    `local` (default: reads) runs the tool as a local activity. It suits short, idempotent calls
    whose only I/O is this process's PostgreSQL: a retry re-runs them, and they hold the
    workflow task while they run.
    """

    def register(fn: ToolFn) -> ToolFn:
        hints = get_type_hints(fn)
        params = list(inspect.signature(fn).parameters)
        if len(params) != 2:
            raise TypeError(f"tool {fn.__name__} must take (ctx: ToolContext, args: <ToolArgs model>)")
        args_model = hints[params[1]]
        result_model = hints["return"]
        if not (isinstance(args_model, type) and issubclass(args_model, ToolArgs)):
            raise TypeError(f"tool {fn.__name__}: arguments must be a ToolArgs subclass")
        leaked = IDENTITY_FIELDS & set(args_model.model_fields)
        if leaked:
            raise TypeError(f"tool {fn.__name__}: arguments may not carry identity fields {sorted(leaked)}")
        if fn.__name__ in REGISTRY:
            raise ValueError(f"tool {fn.__name__} is declared twice")
        check_preview(fn.__name__, preview, args_model)
        unknown = set(free_args) - set(args_model.model_fields)
        if unknown:
            raise TypeError(f"tool {fn.__name__}: free arguments {sorted(unknown)} are not its arguments")
        REGISTRY[fn.__name__] = Tool(
            name=fn.__name__,
            description=inspect.cleandoc(fn.__doc__ or "").strip(),
            args_model=args_model,
            result_model=result_model,
            risk=risk,
            category=category,
            default_tier=tier or default_tier_for(risk, category),
            required_roles=roles,
            local=category == "read" if local is None else local,
            fn=fn,
            preview=preview,
            scopes=scopes,
            free_args=free_args,
        )
        return fn

    return register


def check_preview(name: str, preview: object, args_model: type[ToolArgs]) -> None:
    """Refuse a tool whose preview is missing or is not one for its arguments: a tool cannot be
    registered without saying what it changes."""
    if not inspect.iscoroutinefunction(preview):
        raise TypeError(f"tool {name} needs a preview: an async (ctx, args) -> Effect (tools/effects.py)")
    hints = get_type_hints(preview)
    params = list(inspect.signature(preview).parameters)
    if len(params) != 2 or hints.get("return") is not Effect:
        raise TypeError(f"tool {name}: its preview {preview.__name__} must be (ctx, args) -> Effect")
    accepted = hints.get(params[1])
    if not (accepted is ToolArgs or (isinstance(accepted, type) and issubclass(args_model, accepted))):
        raise TypeError(
            f"tool {name}: its preview {preview.__name__} takes {accepted}, not {args_model.__name__}"
        )


def compensates(forward: ToolFn) -> Callable[[CompensationFn], CompensationFn]:
    """Declare the compensation of a write tool, right below it:

    @compensates(create_task)
    async def cancel_created_task(ctx: ToolContext, args: CreateTaskArgs, result: dict | None) -> UndoOutcome:
    """

    def register(fn: CompensationFn) -> CompensationFn:
        declared = REGISTRY.get(forward.__name__)
        if declared is None or declared.fn is not forward:
            raise ValueError(f"{fn.__name__}: {forward.__name__} is not a registered tool")
        if declared.compensation is not None:
            raise ValueError(f"{forward.__name__} already has a compensation")
        REGISTRY[declared.name] = replace(declared, compensation=fn)
        return fn

    return register


@functools.cache  # every conversation's start snapshots the schemas: compute each once per process
def strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of an arguments model in OpenAI strict mode (shared: do not mutate it).

    Strict mode wants every property listed in `required` and `additionalProperties: false` on every
    object; a field with a default therefore becomes nullable, and `parse_arguments`
    (tools/arguments.py) maps a null back to the default. Titles and defaults are dropped (noise to
    the model; defaults go in descriptions).
    """
    schema = copy.deepcopy(model.model_json_schema())

    def fix(node: dict[str, Any]) -> None:
        node.pop("title", None)
        if "default" in node:
            default = node.pop("default")
            if default is not None:
                node["description"] = f"{node.get('description', '')} (default: {default})".strip()
            if "anyOf" not in node and "$ref" not in node:
                inner = {k: node.pop(k) for k in list(node) if k != "description"}
                node["anyOf"] = [inner, {"type": "null"}]
        if node.get("type") == "object" and "properties" in node:
            node["additionalProperties"] = False
            node["required"] = list(node["properties"])
        for key in ("properties", "$defs"):
            for child in node.get(key, {}).values():
                fix(child)
        for key in ("anyOf", "allOf", "oneOf"):
            for child in node.get(key, []):
                fix(child)
        if isinstance(node.get("items"), dict):
            fix(node["items"])

    fix(schema)
    return schema
