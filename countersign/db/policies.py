"""Tenants' Cedar policy sets in PostgreSQL: applied by a tenant's admin, every attempt chained.

The pure part (schema, checks, one call's decision) is countersign/core/cedar_policy.py, and the
tools a tenant's set may name (the registry's and the MCP tools its servers last listed) are
tools/policies.py's `tenant_tools`, which the callers pass in. Here: `apply_policies` (admins only,
per the database, like tier changes: tools/tiers.py; the attempt, refused or not, is a
`policy_changes` row in the tenant's audit chain), the tenant's sets as applied, a cache of parsed
sets by digest so that a call parses nothing, the policy gate's reads (`gate_reads`: the sets, the
requester's roles and the audit's history the sets name) and `policy test`'s replay of the
recorded calls against a candidate set.

An empty file applied removes the tenant's policies of that mode: with no set at all, a call's
rules in force (activities/rules.py) are its tier alone, read in the one statement that finds no set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import Numeric, Select, case, cast, func, select, true
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from countersign.core.authority import ADMIN
from countersign.core.bounds import load_arguments_or_raw
from countersign.core.calls import NO_MATCH, PolicyDecision, ToolSpec
from countersign.core.cedar_policy import (
    HISTORY_COUNTERS,
    HISTORY_SUMS,
    CallFacts,
    CompiledPolicies,
    PolicySetError,
    decide,
    load_policies,
    set_problems,
    summed_fields,
)
from countersign.core.effects import Effect
from countersign.core.policy_bounds import bounds_refusal
from countersign.db.chain import chain_written
from countersign.db.schema import (
    ApprovalRequest,
    PolicyChange,
    TenantPolicy,
    ToolExecution,
    UserRole,
    Via,
)
from countersign.runtime.isolated import ChildDied, run_isolated


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def checked_policies(text: str, tools: Sequence[ToolSpec]) -> CompiledPolicies:
    """`text` checked as `policy apply` checks it (compile_policies), and parsed: raises
    PolicySetError with every problem. The bounds are checked here, before any engine reads the
    text; the engine then checks it in a child process (countersign/runtime/isolated.py), so that a
    text that crashes it costs that child, not this process; only a text the child survived is
    parsed here."""
    refusal = bounds_refusal(text)
    if refusal is not None:
        raise PolicySetError([refusal])
    try:
        check = {"text": text, "tools": [t.model_dump(mode="json") for t in tools]}
        problems: list[str] = await run_isolated(f"{set_problems.__module__}:{set_problems.__name__}", check)
    except ChildDied as died:
        failed = f"the policy engine failed on this text ({died}); nothing was applied"
        raise PolicySetError([failed]) from None
    if problems:
        raise PolicySetError(problems)
    return loaded(text)


@lru_cache(maxsize=256)
def loaded(text: str) -> CompiledPolicies:
    """An applied set, parsed once per process (a call evaluates, it does not parse)."""
    return load_policies(text)


async def tenant_policies(session: AsyncSession, tenant_id: str) -> dict[str, TenantPolicy]:
    """The tenant's applied sets by mode (`enforced`, `shadow`); a mode without one is absent."""
    rows = await session.scalars(
        select(TenantPolicy).where(TenantPolicy.tenant_id == tenant_id, TenantPolicy.text != "")
    )
    return {row.mode: row for row in rows}


async def apply_policies(
    session: AsyncSession,
    *,
    tenant_id: str,
    text: str,
    shadow: bool,
    changed_by: str,
    via: Via,
    tools: Sequence[ToolSpec],
) -> PolicyChange:
    """Install `text` as the tenant's enforced (or shadow) set if `changed_by` (an admin of the
    tenant, per the database) may and the set passes every check against `tools` (the tenant's:
    tools/policies.py `tenant_tools`); record the attempt either way, in the caller's transaction.
    The returned row says whether it was accepted and, if not, why."""
    mode = "shadow" if shadow else "enforced"
    current = await session.get(TenantPolicy, (tenant_id, mode), with_for_update=True)
    roles = await session.scalars(
        select(UserRole.role).where(UserRole.tenant_id == tenant_id, UserRole.user_id == changed_by)
    )
    refusal: str | None = None
    if ADMIN not in set(roles):
        refusal = f"only an admin of {tenant_id} may change its policies ({changed_by} is not)"
    elif text.strip():
        try:
            await checked_policies(text, tools)
        except PolicySetError as err:
            refusal = str(err)
    version = (current.version if current else 0) + 1
    change = PolicyChange(
        tenant_id=tenant_id,
        mode=mode,
        version=version if refusal is None else None,
        text=text,
        sha256=digest(text),
        changed_by=changed_by,
        via=via,
        accepted=refusal is None,
        reason=refusal,
    )
    session.add(change)
    if refusal is None:
        if current is None:
            current = TenantPolicy(tenant_id=tenant_id, mode=mode)
            session.add(current)
        current.version, current.text, current.sha256 = version, text, change.sha256
        current.applied_by, current.applied_at = changed_by, func.now()
    await chain_written(session, change)
    return change


# --- history-aware context: the audit's counts and sums a set names ----------------------------------


@dataclass(frozen=True)
class AuditHistory:
    """The audit's history of a call, as far as the sets name it (CallFacts' `history`, `sums`)."""

    counts: dict[str, int]
    sums: dict[tuple[str, str], int]


def _since(name: str, at: datetime) -> datetime:
    if name.endswith("_last_hour_by_requester"):
        return at - timedelta(hours=1)
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class HistoryQuery:
    """The statement reading the history a call's sets name, and the names of its columns."""

    counters: list[str]
    sums: list[tuple[str, str]]
    statement: Select[*tuple[Any, ...]] | None  # None: the sets name no history, nothing to read

    def read(self, row: Sequence[Any]) -> AuditHistory:
        """The history from the statement's row (its columns in order)."""
        n = len(self.counters)
        return AuditHistory(
            counts=dict(zip(self.counters, row[:n], strict=True)),
            sums={key: int(value or 0) for key, value in zip(self.sums, row[n:], strict=True)},
        )


def history_query(
    *,
    tenant_id: str,
    user: str,
    spec: ToolSpec,
    at: datetime,
    counters: frozenset[str],
    sums: frozenset[tuple[str, str]],
) -> HistoryQuery:
    """The HISTORY_COUNTERS `counters` and HISTORY_SUMS `sums` for a call of `spec` by `user` at
    `at`, over calls of the tool that ran (`executed`) before it, as one statement. A sum totals
    the field as the call ran (an approver's edit counts) and skips a call whose value is no number;
    a field the tool does not declare an integer is not summed (the schema refused it at apply; the
    tool may have changed since)."""
    wanted = sorted(counters & set(HISTORY_COUNTERS))
    totals = sorted((n, f) for n, f in sums if n in HISTORY_SUMS and f in summed_fields(spec))
    if not wanted and not totals:
        return HistoryQuery(counters=[], sums=[], statement=None)

    def scope(name: str) -> ColumnElement[bool]:
        within = ToolExecution.created_at >= _since(name, at)
        return within & (ToolExecution.user_id == user) if name.endswith("_by_requester") else within

    def total(field: str) -> ColumnElement[Any]:
        edited = func.jsonb_typeof(ToolExecution.edited_args) == "object"  # none is JSON null, not NULL
        ran = case((edited, ToolExecution.edited_args), else_=ToolExecution.args)
        number = func.jsonb_typeof(func.jsonb_extract_path(ran, field)) == "number"
        return func.sum(case((number, cast(func.jsonb_extract_path_text(ran, field), Numeric))))

    columns = [func.count().filter(scope(name)).label(f"h{i}") for i, name in enumerate(wanted)]
    columns += [total(f).filter(scope(n)).label(f"h{len(wanted) + i}") for i, (n, f) in enumerate(totals)]
    statement = select(*columns).where(
        ToolExecution.tenant_id == tenant_id,
        ToolExecution.tool == spec.name,
        ToolExecution.outcome == "executed",
        ToolExecution.created_at >= min(_since(n, at) for n in [*wanted, *(n for n, _ in totals)]),
        ToolExecution.created_at < at,
    )
    return HistoryQuery(counters=wanted, sums=totals, statement=statement)


async def audit_history(session: AsyncSession, query: HistoryQuery) -> AuditHistory:
    """The history `query` reads (nothing is read when the sets name none)."""
    if query.statement is None:
        return AuditHistory(counts={}, sums={})
    return query.read((await session.execute(query.statement)).one())


@dataclass(frozen=True)
class GateReads:
    """What the policy gate reads for one call: the tenant's sets by mode (text, version), the
    requester's roles, and the history the sets name."""

    sets: dict[str, tuple[str, int]]
    roles: tuple[str, ...]
    history: AuditHistory


# The history each tenant's sets named when the gate last read them, by the sets' digests: the gate
# reads sets, roles and that history in one statement, and the history again only when the sets
# changed since (the first call after an apply, or in a fresh process).
_NAMED: dict[str, tuple[frozenset[str], frozenset[str], frozenset[tuple[str, str]]]] = {}


async def gate_reads(
    session: AsyncSession, *, tenant_id: str, user: str, spec: ToolSpec, at: datetime
) -> GateReads | None:
    """The gate's reads in one round trip while the tenant's sets are unchanged; None when the
    tenant has no sets."""
    digests, counters, sums = _NAMED.get(tenant_id, (frozenset(), frozenset(), frozenset()))
    guess = history_query(tenant_id=tenant_id, user=user, spec=spec, at=at, counters=counters, sums=sums)
    roles = select(func.array_agg(UserRole.role)).where(
        UserRole.tenant_id == tenant_id, UserRole.user_id == user
    )
    statement = select(
        TenantPolicy.mode,
        TenantPolicy.text,
        TenantPolicy.version,
        TenantPolicy.sha256,
        roles.scalar_subquery(),
    ).where(TenantPolicy.tenant_id == tenant_id, TenantPolicy.text != "")
    if guess.statement is not None:
        named = guess.statement.subquery()
        statement = statement.add_columns(*named.c).join(named, true())
    rows = (await session.execute(statement)).all()
    if not rows:
        return None
    sets = {row[0]: (row[1], row[2]) for row in rows}
    if frozenset(row[3] for row in rows) == digests:
        return GateReads(sets=sets, roles=tuple(sorted(rows[0][4] or ())), history=guess.read(rows[0][5:]))
    parsed = [loaded(text) for text, _ in sets.values()]
    counters = frozenset().union(*(p.counters for p in parsed))
    sums = frozenset().union(*(p.sums for p in parsed))
    _NAMED[tenant_id] = (frozenset(row[3] for row in rows), counters, sums)
    history = await audit_history(
        session,
        history_query(tenant_id=tenant_id, user=user, spec=spec, at=at, counters=counters, sums=sums),
    )
    return GateReads(sets=sets, roles=tuple(sorted(rows[0][4] or ())), history=history)


async def roles_of(session: AsyncSession, tenant_id: str, user: str) -> tuple[str, ...]:
    rows = await session.scalars(
        select(UserRole.role).where(UserRole.tenant_id == tenant_id, UserRole.user_id == user)
    )
    return tuple(sorted(rows))


# --- policy test: the recorded calls against a candidate set -----------------------------------------


@dataclass(frozen=True)
class RecordedCall:
    """A call `policy test` replays: one that ran or was refused (the audit), or one waiting for its
    approval now (a pending approval request: a policy set applied today would decide it too)."""

    at: datetime
    workflow_id: str
    call_id: str
    tool: str
    user: str
    agent: str
    arguments: dict[str, Any]
    effect: dict[str, Any] | None
    outcome: str  # the audit's outcome, or "pending"
    # the requester's roles at the call, as recorded (None: a pending request, which a set applied
    # today decides with today's roles, or a call recorded before migration 0033 recorded them)
    roles: tuple[str, ...] | None = None


async def recorded_calls(
    session: AsyncSession, tenant_id: str, since: datetime, limit: int
) -> list[RecordedCall]:
    """The tenant's calls since `since`, newest first (at most `limit`): the audit's, with an
    approver's edit, and the approval requests still pending, with the arguments they ask for."""
    ran = await session.scalars(
        select(ToolExecution)
        .where(ToolExecution.tenant_id == tenant_id, ToolExecution.created_at >= since)
        .order_by(ToolExecution.created_at.desc())
        .limit(limit)
    )
    waiting = await session.scalars(
        select(ApprovalRequest)
        .where(
            ApprovalRequest.tenant_id == tenant_id,
            ApprovalRequest.state == "pending",
            ApprovalRequest.requested_at >= since,
        )
        .order_by(ApprovalRequest.requested_at.desc())
        .limit(limit)
    )
    calls = [
        RecordedCall(
            at=row.created_at, workflow_id=row.workflow_id, call_id=row.call_id, tool=row.tool,
            user=row.user_id, agent=row.agent, arguments=row.edited_args or row.args,
            effect=row.effect, outcome=row.outcome,
            roles=tuple(row.roles) if row.roles is not None else None,
        )
        for row in ran
    ] + [
        RecordedCall(
            at=row.requested_at, workflow_id=row.workflow_id, call_id=row.call_id, tool=row.tool,
            user=row.requested_by, agent=row.agent, arguments=load_arguments_or_raw(row.args),
            effect=row.effect, outcome="pending",
        )
        for row in waiting
    ]  # fmt: skip
    return sorted(calls, key=lambda c: c.at, reverse=True)[:limit]


async def replay(
    session: AsyncSession,
    *,
    tenant_id: str,
    candidate: CompiledPolicies,
    tools: Sequence[ToolSpec],
    since: datetime,
    limit: int = 10_000,
) -> dict[str, Any]:
    """The tenant's recorded calls since `since` (`recorded_calls`), each decided by the enforced
    set (none: no match, the tiers) and by `candidate`, with the tenant's `tools` (tools/policies.py
    `tenant_tools`; a call of any other tool is skipped); the calls whose decision would change.

    The audit keeps the arguments as recorded (redacted where the tool redacts), an approver's
    edit, and the effect the call resolved; a pending request, the arguments and effect it asks
    approval for. Roles are the requester's at the call, as recorded with it; a pending request
    (decided under today's) and a call recorded before they were (migration 0033) get the
    requester's today, and the report counts those (`with_roles_today`). The history counts and
    sums are those before each call."""
    applied = (await tenant_policies(session, tenant_id)).get("enforced")
    current = loaded(applied.text) if applied else None
    specs = {spec.name: spec for spec in tools}
    rows = await recorded_calls(session, tenant_id, since, limit)
    today: dict[str, tuple[str, ...]] = {}
    changed: list[dict[str, Any]] = []
    with_roles_today = 0
    for row in rows:
        spec = specs.get(row.tool)
        if spec is None:  # a tool nobody declares (any more): no policy can name it
            continue
        if row.roles is None and row.user not in today:
            today[row.user] = await roles_of(session, tenant_id, row.user)
        with_roles_today += row.roles is None and row.outcome != "pending"
        roles = row.roles if row.roles is not None else today[row.user]
        history = await audit_history(
            session,
            history_query(
                tenant_id=tenant_id,
                user=row.user,
                spec=spec,
                at=row.at,
                counters=candidate.counters | (current.counters if current else frozenset()),
                sums=candidate.sums | (current.sums if current else frozenset()),
            ),
        )
        call = CallFacts(
            user=row.user,
            roles=roles,
            agent=row.agent,
            spec=spec,
            arguments=row.arguments,
            effect=Effect.model_validate(row.effect) if row.effect else None,
            history=history.counts,
            sums=history.sums,
        )
        before: PolicyDecision = decide(current, call) if current else NO_MATCH
        after = decide(candidate, call)
        if before != after:
            changed.append(
                {
                    "at": row.at.isoformat(),
                    "workflow_id": row.workflow_id,
                    "call_id": row.call_id,
                    "tool": row.tool,
                    "requested_by": row.user,
                    "roles": list(roles),
                    "roles_as": "today" if row.roles is None else "at the call",
                    "outcome": row.outcome,
                    "enforced": before.model_dump(exclude_defaults=True),
                    "candidate": after.model_dump(exclude_defaults=True),
                }
            )
    return {
        "tenant": tenant_id,
        "replayed": len(rows),
        "with_roles_today": with_roles_today,
        "changed": changed,
    }
