"""The tool registry: a tool is one decorated async function, declared once in typed code.

A read is its body:

    class SearchLeadsArgs(ToolArgs):
        query: str = Field(description="Name, email or company to look for")

    @tool(risk="low", category="read")
    async def search_leads(ctx: ToolContext, args: SearchLeadsArgs) -> LeadList:
        \"\"\"Search the tenant's leads.\"\"\"

A write is a plan and its application (docs/how-to/write-a-tool.md):

    @tool(risk="high", category="write", plan=plan_lead_status)
    async def update_lead_status(ctx: ToolContext, plan: LeadStatusPlan) -> LeadStatusChange:

`plan(ctx, args) -> P` only reads: it resolves every reference, normalizes the arguments and returns
a `Plan` holding everything the call will do; `P.effect()` is what a reviewer is shown, what their
proof binds and what policies judge. The body applies exactly that plan, resolving nothing again.

The name is the function's, the description its docstring, the arguments model the second
parameter's annotation (of the plan for a write) and the result model its return annotation. The
OpenAI schema is generated from the arguments model in strict mode. Tenant, user and roles reach a
tool only through `ToolContext`; an arguments model that declares them is refused at import time.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from typing import Any, Literal, Self, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, JsonValue, model_validator
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.access import Scope
from countersign.core.calls import CallerContext, Category, ErrorCode, Risk, Tier, ToolSpec, call_key
from countersign.core.effects import Effect, one_line

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


class NeedsInput(Exception):
    """Raised by a resolver that cannot pick one row: the call answers its `Needs` (a plan that
    raises it is `Unplannable`; `tools.resolve.answers_needs` for a read)."""

    def __init__(self, needs: Needs) -> None:
        super().__init__(f"needs {sorted(needs.fields)}")
        self.needs = needs


@dataclass
class ToolContext:
    """What a tool may know about the call. `session` is inside the call's transaction."""

    caller: CallerContext
    session: AsyncSession
    workflow_id: str
    call_id: str
    now: datetime
    conversation_id: str = ""
    # Set when a plan is made inside the transaction that applies it: the plan then takes the rows it
    # reads FOR UPDATE, so nothing changes them between the plan and its application.
    lock_reads: bool = False
    # When the call was put to a reviewer (its approval request's `requested_at`), for the plan the
    # reviewer is shown and for the one that runs after the decision alike; None for a call nobody was asked
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


@dataclass(kw_only=True)
class Plan(ABC):
    """What one call will do, resolved once against the tenant's data and changing nothing.

    A write tool's plan holds every record it changes (with the values read: its preconditions),
    creates or deletes and every message as it will leave; `effect()` is derived from it alone, and
    the tool's body applies exactly it. `args` are the call's validated arguments; `named` gives
    the canonical spelling of each reference the plan resolved (a lead by its email, lowercased),
    so `arguments()`, what policies read as `context.args`, is the same for every spelling the tool
    accepts.
    """

    args: ToolArgs
    named: Mapping[str, JsonValue] = field(default_factory=dict)

    @abstractmethod
    def effect(self) -> Effect:
        """What the call will change, send and create (countersign/core/effects.py)."""

    def arguments(self) -> dict[str, JsonValue]:
        """The arguments in their canonical spelling: validated, references as `named`."""
        values: dict[str, JsonValue] = self.args.model_dump(mode="json")
        return values | dict(self.named)


@dataclass(kw_only=True)
class Reads(Plan):
    """The plan of a tool that only reads: its normalized arguments, changing nothing."""

    def effect(self) -> Effect:
        return Effect(summary="Changes nothing: reads only")


@dataclass(kw_only=True)
class Unplannable(Plan):
    """A call its plan stopped (no such record, a name matching two people): its effect names the
    problem, which the reviewer sees, and applying it answers what stopped it."""

    tool: str
    stop: ToolFailure | NeedsInput

    @property
    def problem(self) -> str:
        if isinstance(self.stop, NeedsInput):
            return f"needs {', '.join(sorted(self.stop.needs.fields))}: more than one match, or none"
        return f"{self.stop.code}: {self.stop.message}"

    def effect(self) -> Effect:
        return Effect(summary=one_line(f"{self.tool} would fail now: {self.problem}"), problem=self.problem)


# (context, the call's validated arguments) -> the call's plan, read without changing anything. It
# may raise what the call would meet (ToolFailure, NeedsInput): the plan is then `Unplannable`.
PlanFn = Callable[[ToolContext, Any], Awaitable[Plan]]


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
    # a read's body `(ctx, args)`; a write's `apply(ctx, plan)`, writing exactly the plan
    fn: ToolFn = field(repr=False)
    # a write's plan; None for a read (its plan is `Reads`: the arguments, changing nothing)
    planner: PlanFn | None = field(default=None, repr=False)
    compensation: CompensationFn | None = field(default=None, repr=False)
    # the grants the conversation's user must hold for it to run (activities/access.py)
    scopes: tuple[Scope, ...] = ()
    # arguments a reviewer's grant does not bind (countersign/core/grants.py: `scope_digest`)
    free_args: tuple[str, ...] = ()

    async def plan(self, ctx: ToolContext, args: ToolArgs) -> Plan:
        """The call's plan (see `Plan`); a call its plan stops is `Unplannable`, not an error."""
        if self.planner is None:
            return Reads(args=args)
        try:
            return await self.planner(ctx, args)
        except (ToolFailure, NeedsInput) as stop:
            return Unplannable(args=args, tool=self.name, stop=stop)

    async def apply(self, ctx: ToolContext, plan: Plan) -> BaseModel:
        """Carry out `plan`, made by `self.plan` (in the same transaction when it must hold)."""
        if isinstance(plan, Unplannable):
            if isinstance(plan.stop, NeedsInput):
                return plan.stop.needs
            raise plan.stop
        return await self.fn(ctx, plan.args if isinstance(plan, Reads) else plan)

    async def run(self, ctx: ToolContext, args: ToolArgs) -> BaseModel:
        """Plan the call and apply that plan at once (no approval between them)."""
        return await self.apply(ctx, await self.plan(replace(ctx, lock_reads=True), args))

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
    plan: PlanFn | None = None,
) -> Callable[[ToolFn], ToolFn]:
    """Declare a tool. See the module docstring.

    `plan` (every tool that is not a read must have one) resolves what a call will do: its
    arguments model is the tool's, and the decorated function applies the plan it returns.

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
        if (plan is None) != (category == "read"):
            raise TypeError(f"tool {fn.__name__}: a write declares a plan, a read does not")
        args_model = hints[params[1]]
        if plan is not None:
            args_model = planned_arguments(fn.__name__, plan, args_model)
        result_model = hints["return"]
        if not (isinstance(args_model, type) and issubclass(args_model, ToolArgs)):
            raise TypeError(f"tool {fn.__name__}: arguments must be a ToolArgs subclass")
        leaked = IDENTITY_FIELDS & set(args_model.model_fields)
        if leaked:
            raise TypeError(f"tool {fn.__name__}: arguments may not carry identity fields {sorted(leaked)}")
        if fn.__name__ in REGISTRY:
            raise ValueError(f"tool {fn.__name__} is declared twice")
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
            planner=plan,
            scopes=scopes,
            free_args=free_args,
        )
        return fn

    return register


def planned_arguments(name: str, plan: object, applied: object) -> type[ToolArgs]:
    """The arguments model of a write tool's plan: refuse a plan that is not an async
    `(ctx, args: <ToolArgs model>) -> P` whose `P` (a `Plan`) is what the tool's body applies."""
    if not inspect.iscoroutinefunction(plan):
        raise TypeError(f"tool {name} needs a plan: an async (ctx, args) -> Plan (tools/registry.py)")
    hints = get_type_hints(plan)
    params = list(inspect.signature(plan).parameters)
    planned = get_origin(hints.get("return")) or hints.get("return")  # RowUpdate[Task]: RowUpdate
    applied = get_origin(applied) or applied
    if len(params) != 2 or not (isinstance(planned, type) and issubclass(planned, Plan)):
        raise TypeError(f"tool {name}: its plan {plan.__name__} must be (ctx, args) -> a Plan")
    if not (isinstance(applied, type) and issubclass(planned, applied)):
        raise TypeError(f"tool {name} applies {applied}, not its plan's {planned.__name__}")
    return hints[params[1]]  # type: ignore[no-any-return]


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
