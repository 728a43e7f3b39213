"""A tenant's Cedar policy set: its schema, the checks at `policy apply`, and one call's decision.

Cedar (`cedarpy`, the Cedar engine's own binding) decides beside the tiers (shared/CONTRACT.md,
"Policies, grants and quorum"). The request for one tool call is:

- principal `Countersign::User::"<requester>"` with `roles` (a Set of String, from the database);
- action `Countersign::Action::"<tool>"` (an MCP tool by its flat name `mcp__SERVER__TOOL`);
- resource `Countersign::Agent::"<agent>"`;
- context `{args, risk, category, effect?, history}`: the arguments as the call's plan normalizes
  them (tools/registry.py `Plan.arguments`: addresses trimmed and lowercased, a lead by its email),
  the tool's declared risk and category, the plan's effect (`EFFECT_TYPE`: its kinds, targets,
  recipients and each field it sets with its new value, so one rule covers every tool with the same
  effect), and the audit's counts and sums the set names (`HISTORY_COUNTERS`, `HISTORY_SUMS`; only
  those are computed).

The outcome (`PolicyDecision`): a matching `forbid` refuses the call (it always wins, whatever
permits match); a matching `permit` annotated `@approvals("N")` needs N distinct approvers
(`@approvers("role,role")` narrows who); a matching `permit` alone runs the call; nothing matching
leaves the call to the tiers, so a tenant without policies behaves as before.

Fail closed, everywhere a policy set could quietly widen what runs:
- an annotation Countersign does not know (`@approval("2")`, a typo) is refused at apply, since the
  permit would otherwise run calls unasked;
- `@approvals` is parsed strictly (digits only, 1..MAX_APPROVALS), never guessed at;
- a `permit` without `@approvals` whose scope reaches a high-risk tool is refused unless it says why
  (`@allow_high("why")`): "can match" is read from the policy's action scope, not its conditions;
- a policy whose evaluation errs (an overflow, a missing attribute) refuses the call, naming it: Cedar
  itself would skip it, and a skipped `forbid` (or a skipped quorum permit) would let a call through.

Pure: no I/O. Only activities and the CLI call it (the Cedar engine is native code, never workflow
code).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import cedarpy

from countersign.core.calls import NO_MATCH, PolicyDecision, ToolSpec
from countersign.core.effects import Effect, canonical_json
from countersign.core.policy_bounds import bounds_refusal

NAMESPACE = "Countersign"
USER, ACTION, AGENT = (f"{NAMESPACE}::{kind}" for kind in ("User", "Action", "Agent"))

# Most approvers a quorum may ask for: more is not a review, it is a meeting.
MAX_APPROVALS = 5
ANNOTATIONS = frozenset({"id", "approvals", "approvers", "allow_high"})
_APPROVALS = re.compile(r"[1-9][0-9]*")
_ROLE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_ERRED = re.compile(r"policy `([^`]+)`")
# Cedar's Long: an argument outside it is left out of the context (a policy naming it finds no value).
_LONG = (-(2**63), 2**63 - 1)

# The audit's counts a policy may name as `context.history.<name>`, each computed in SQL (by the
# policy gate) only when the set names it. "Today" is the UTC day.
HISTORY_COUNTERS: dict[str, str] = {
    "calls_today_by_requester": "this tool's calls by this requester today",
    "calls_last_hour_by_requester": "this tool's calls by this requester in the last hour",
    "calls_today_by_tenant": "this tool's calls in the whole tenant today",
}
# The audit's sums a policy may name as `context.history.<name>.<field>`: the total of the tool's
# integer argument `field` over the same windows as the counters (each a Record with one Long per
# integer argument the tool declares, so a field the tool lacks is refused at apply), each computed
# in SQL only for the fields the set names.
HISTORY_SUMS: dict[str, str] = {
    "sum_today_by_requester": "a field's total over this tool's calls by this requester today",
    "sum_last_hour_by_requester": "a field's total over this tool's calls by this requester in the last hour",
    "sum_today_by_tenant": "a field's total over this tool's calls in the whole tenant today",
}

_STRINGS = {"type": "Set", "element": {"type": "String"}}


def _records(*names: str) -> dict[str, Any]:
    """A Set of Records whose attributes are all Strings."""
    attributes = {name: {"type": "String"} for name in names}
    return {"type": "Set", "element": {"type": "Record", "attributes": attributes}}


EFFECT_TYPE: dict[str, Any] = {
    "type": "Record",
    "attributes": {
        "summary": {"type": "String"},
        "resolved": {"type": "Boolean"},
        "recipients": _STRINGS,  # every address a message of the call goes to
        "channels": _STRINGS,  # "email", "slack"…
        "kinds": _STRINGS,  # kinds of the records it changes, deletes or creates
        "deletes": {"type": "Boolean"},
        "changes": {"type": "Long"},  # how many records it changes, deletes or creates
        # each record it changes or deletes: {kind: "lead", id: "12"}
        "targets": {**_records("kind", "id"), "required": False},
        # each field it sets, on a record it changes or creates, with its new value as text
        # (`field_text`): {kind: "lead", field: "status", value: "converted"}, whichever tool sets it
        "fields": {**_records("kind", "field", "value"), "required": False},
    },
}


class PolicySetError(ValueError):
    """A policy set refused at apply: every problem found, each naming its policy."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class PolicyInfo:
    """One policy of the set, as its annotations declare it."""

    id: str
    effect: Literal["permit", "forbid"]
    approvals: int
    approvers: tuple[str, ...]


@dataclass(frozen=True)
class CompiledPolicies:
    """A policy set checked at apply and parsed once for evaluation."""

    text: str
    handle: cedarpy.PolicySet
    policies: Mapping[str, PolicyInfo]  # by Cedar's own id (policy0, policy1…)
    counters: frozenset[str]  # the HISTORY_COUNTERS the set names
    sums: frozenset[tuple[str, str]]  # the HISTORY_SUMS the set names, as (sum, field)


# --- the schema ------------------------------------------------------------------------------------


def cedar_type(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Cedar type of a JSON Schema value, or None when Cedar has no faithful one (a float, a
    value that may be null, a mix): such an argument stays out of the context and the schema."""
    kind = schema.get("type")
    if kind == "string":
        return {"type": "String"}
    if kind == "integer":
        return {"type": "Long"}
    if kind == "boolean":
        return {"type": "Boolean"}
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        element = cedar_type(schema["items"])
        return {"type": "Set", "element": element} if element else None
    if kind == "object":
        return {"type": "Record", "attributes": _attributes(schema)}
    return None


def _attributes(schema: Mapping[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return {}
    required = set(schema.get("required") or ())
    attributes: dict[str, Any] = {}
    for name, sub in properties.items():
        typed = cedar_type(sub) if isinstance(sub, Mapping) else None
        if typed is not None:
            attributes[name] = {**typed, "required": name in required}
    return attributes


def _integer(schema: Any) -> bool:
    """An integer argument, or one that may also be null (a call whose value is null adds nothing)."""
    if not isinstance(schema, Mapping):
        return False
    kinds = [k.get("type") for k in schema.get("anyOf") or [schema] if isinstance(k, Mapping)]
    return "integer" in kinds and set(kinds) <= {"integer", "null"}


def summed_fields(spec: ToolSpec) -> tuple[str, ...]:
    """The tool's arguments a HISTORY_SUMS record totals: its top-level integer ones."""
    properties = spec.parameters.get("properties")
    if not isinstance(properties, Mapping):
        return ()
    return tuple(sorted(name for name, sub in properties.items() if _integer(sub)))


def _context_type(spec: ToolSpec) -> dict[str, Any]:
    history: dict[str, Any] = {name: {"type": "Long"} for name in HISTORY_COUNTERS}
    totals = {"type": "Record", "attributes": {field: {"type": "Long"} for field in summed_fields(spec)}}
    history |= {name: totals for name in HISTORY_SUMS}
    return {
        "type": "Record",
        "attributes": {
            "args": {"type": "Record", "attributes": _attributes(spec.parameters)},
            "risk": {"type": "String"},
            "category": {"type": "String"},
            "effect": {**EFFECT_TYPE, "required": False},
            "history": {"type": "Record", "attributes": history},
        },
    }


def schema_for(tools: Iterable[ToolSpec]) -> dict[str, Any]:
    """The Cedar schema (JSON form) a tenant's policy set is validated against: one action per tool."""
    return {
        NAMESPACE: {
            "entityTypes": {
                "User": {"shape": {"type": "Record", "attributes": {"roles": _STRINGS}}},
                "Agent": {},
            },
            "actions": {
                spec.name: {
                    "appliesTo": {
                        "principalTypes": ["User"],
                        "resourceTypes": ["Agent"],
                        "context": _context_type(spec),
                    }
                }
                for spec in tools
            },
        }
    }


# --- apply: parse, check the annotations, validate --------------------------------------------------


def _info(pid: str, policy: Mapping[str, Any], problems: list[str]) -> PolicyInfo:
    notes: dict[str, str] = policy.get("annotations") or {}
    name = notes.get("id") or ""
    where = f"policy {name!r}" if name else f"the policy at position {pid.removeprefix('policy')}"
    if not name:
        problems.append(f'{where} has no @id("…"): a refusal must be able to name it')
    for unknown in sorted(set(notes) - ANNOTATIONS):
        problems.append(f"{where}: unknown annotation @{unknown} (known: {', '.join(sorted(ANNOTATIONS))})")
    effect = policy["effect"]
    approvals = 0
    if "approvals" in notes:
        raw = notes["approvals"]
        if effect != "permit":
            problems.append(f"{where}: @approvals belongs on a permit")
        elif not _APPROVALS.fullmatch(raw) or int(raw) > MAX_APPROVALS:
            problems.append(f'{where}: @approvals("{raw}") must be a whole number from 1 to {MAX_APPROVALS}')
        else:
            approvals = int(raw)
    approvers: tuple[str, ...] = ()
    if "approvers" in notes:
        approvers = tuple(r.strip() for r in notes["approvers"].split(","))
        if "approvals" not in notes:
            problems.append(f"{where}: @approvers needs @approvals")
        bad = [r for r in approvers if not _ROLE.fullmatch(r)]
        if bad or not approvers:
            problems.append(f'{where}: @approvers("{notes["approvers"]}") must name roles, comma-separated')
    if "allow_high" in notes and not notes["allow_high"].strip():
        problems.append(f'{where}: @allow_high needs the reason, @allow_high("why")')
    return PolicyInfo(id=name, effect=effect, approvals=approvals, approvers=approvers)


def _actions_in_scope(scope: Mapping[str, Any], tools: Iterable[str]) -> set[str]:
    """The tools a policy's action scope can match (no action groups exist in the schema)."""
    if scope.get("op") == "All":
        return set(tools)
    entities = scope.get("entities") or ([scope["entity"]] if "entity" in scope else [])
    return {e.get("id", "") for e in entities}


def _walk(node: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _is_history(node: Any) -> bool:
    inner = node.get(".") if isinstance(node, Mapping) else None
    return (
        isinstance(inner, Mapping)
        and inner.get("attr") == "history"
        and inner.get("left") == {"Var": "context"}
    )


def _accesses(policies: Mapping[str, Any]) -> Iterable[tuple[Any, str]]:
    """Each attribute access in a set's conditions (`x.attr`, `x has attr`): `x` and `attr`."""
    for node in _walk(policies):
        for op in (".", "has"):
            access = node.get(op)
            if isinstance(access, Mapping):
                yield access.get("left"), str(access.get("attr"))


def sums_named(policies: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """The HISTORY_SUMS fields a set's conditions read (`context.history.sum_….x`, `… has x`), as
    (sum, field)."""
    named = set()
    for left, field in _accesses(policies):
        inner = left.get(".") if isinstance(left, Mapping) else None
        if (
            isinstance(inner, Mapping)
            and inner.get("attr") in HISTORY_SUMS
            and _is_history(inner.get("left"))
        ):
            named.add((str(inner["attr"]), field))
    return frozenset(named)


def counters_named(policies: Mapping[str, Any]) -> frozenset[str]:
    """The HISTORY_COUNTERS a set's conditions read (`context.history.x`, `context.history has x`)."""
    return frozenset(
        {name for left, name in _accesses(policies) if _is_history(left)} & set(HISTORY_COUNTERS)
    )


def _parsed(text: str) -> tuple[dict[str, Any], dict[str, PolicyInfo], list[str]]:
    """The set's policies (Cedar's JSON form), what their annotations declare, and the problems
    found in them. Text past the bounds (countersign/core/policy_bounds.py) never reaches the engine."""
    refusal = bounds_refusal(text)
    if refusal is not None:
        raise PolicySetError([refusal])
    try:
        parsed = json.loads(cedarpy.policies_to_json_str(text))
    except ValueError as err:
        raise PolicySetError([f"not a Cedar policy set: {err}"]) from None
    if parsed.get("templates"):
        raise PolicySetError(["templates are not supported: write each policy out"])
    problems: list[str] = []
    policies: dict[str, Any] = parsed["staticPolicies"]
    infos = {pid: _info(pid, policy, problems) for pid, policy in policies.items()}
    names = [info.id for info in infos.values() if info.id]
    problems += [f"@id({n!r}) is used twice" for n in sorted({n for n in names if names.count(n) > 1})]
    return policies, infos, problems


def _high_risk_problems(
    policies: Mapping[str, Any], infos: Mapping[str, PolicyInfo], specs: Mapping[str, ToolSpec]
) -> list[str]:
    problems = []
    for pid, policy in policies.items():
        info = infos[pid]
        if info.effect != "permit" or info.approvals or "allow_high" in (policy.get("annotations") or {}):
            continue
        high = sorted(
            t for t in _actions_in_scope(policy["action"], specs) if t in specs and specs[t].risk == "high"
        )
        if high:
            problems.append(
                f"policy {info.id!r} would run high-risk tools without asking ({', '.join(high)}): "
                'add @approvals("N"), narrow its action, or say why with @allow_high("why")'
            )
    return problems


def compile_policies(text: str, tools: Iterable[ToolSpec]) -> CompiledPolicies:
    """Check a policy set against the tenant's tools and parse it (at `policy apply`); raises
    PolicySetError with every problem found (a syntax error, an unknown annotation, a bad
    @approvals, a schema error, an auto-allowed high-risk tool without @allow_high)."""
    specs = {spec.name: spec for spec in tools}
    policies, infos, problems = _parsed(text)
    problems += _high_risk_problems(policies, infos, specs)
    validation = cedarpy.validate_policies(text, schema_for(specs.values()))
    for error in validation.errors:
        named = validation.id_annotations_by_policy_id.get(error.policy_id) or error.policy_id
        problems.append(f"policy {named!r}: {error.error}" if named else error.error)
    if problems:
        raise PolicySetError(problems)
    return load_policies(text)


def set_problems(check: Mapping[str, Any]) -> list[str]:
    """compile_policies' problems with `check["text"]` against `check["tools"]` (ToolSpecs as JSON),
    none when it may be applied: what a child process answers (countersign/runtime/isolated.py),
    where the engine may crash."""
    try:
        compile_policies(check["text"], [ToolSpec.model_validate(t) for t in check["tools"]])
    except PolicySetError as err:
        return err.problems
    return []


def load_policies(text: str) -> CompiledPolicies:
    """An applied set (checked by compile_policies when it was applied), parsed for evaluation:
    the tools it was checked against may have changed since, its annotations may not."""
    policies, infos, problems = _parsed(text)
    if problems:
        raise PolicySetError(problems)
    return CompiledPolicies(
        text=text,
        handle=cedarpy.PolicySet.from_str(text),
        policies=infos,
        counters=counters_named(policies),
        sums=sums_named(policies),
    )


# --- one call ---------------------------------------------------------------------------------------


def cedar_value(value: Any) -> Any:
    """A JSON value as Cedar reads it, or None for what Cedar cannot hold faithfully (null, a float,
    an integer outside Long): left out, as the schema leaves those arguments out."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if _LONG[0] <= value <= _LONG[1] else None
    if isinstance(value, list):
        return [v for v in map(cedar_value, value) if v is not None]
    if isinstance(value, dict):
        return {k: v for k, v in ((k, cedar_value(v)) for k, v in value.items()) if v is not None}
    return None


def field_text(value: Any) -> str:
    """A field's new value as `context.effect.fields` holds it: text as is, nothing as "", any
    other JSON value canonical ("3", "true", "[\"bob\"]")."""
    if value is None:
        return ""
    return value if isinstance(value, str) else canonical_json(value)


def effect_context(effect: Effect) -> dict[str, Any]:
    """The call's resolved effect as EFFECT_TYPE."""
    changed = [(c.kind, name, field.after) for c in effect.changes for name, field in c.fields.items()]
    created = [(c.kind, name, value) for c in effect.creates for name, value in c.fields.items()]
    fields = dict.fromkeys((kind, name, field_text(value)) for kind, name, value in changed + created)
    return {
        "summary": effect.summary,
        "resolved": effect.resolved,
        "recipients": sorted({to for m in effect.messages for to in m.to}),
        "channels": sorted({m.channel for m in effect.messages}),
        "kinds": sorted({c.kind for c in effect.changes} | {c.kind for c in effect.creates}),
        "deletes": any(c.deleted for c in effect.changes),
        "changes": len(effect.changes) + len(effect.creates),
        "targets": [{"kind": c.kind, "id": c.id} for c in effect.changes],
        "fields": [{"kind": kind, "field": name, "value": value} for kind, name, value in fields],
    }


@dataclass(frozen=True)
class CallFacts:
    """One tool call as a policy sees it (authority from the database, arguments validated)."""

    user: str
    roles: tuple[str, ...]
    agent: str
    spec: ToolSpec
    arguments: Mapping[str, Any]
    effect: Effect | None = None
    history: Mapping[str, int] | None = None  # the counters the set names; the rest are 0
    sums: Mapping[tuple[str, str], int] | None = None  # the (sum, field)s the set names; the rest 0


def _request(call: CallFacts) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    user = {"type": USER, "id": call.user}
    agent = {"type": AGENT, "id": call.agent}
    history: dict[str, Any] = {name: (call.history or {}).get(name, 0) for name in HISTORY_COUNTERS}
    for name in HISTORY_SUMS:  # a total past Cedar's Long is held at its bound: still past any limit
        history[name] = {
            field: min(max((call.sums or {}).get((name, field), 0), _LONG[0]), _LONG[1])
            for field in summed_fields(call.spec)
        }
    context: dict[str, Any] = {
        "args": cedar_value(dict(call.arguments)),
        "risk": call.spec.risk,
        "category": call.spec.category,
        "history": history,
    }
    if call.effect is not None:
        context["effect"] = effect_context(call.effect)
    request = {
        "principal": user,
        "action": {"type": ACTION, "id": call.spec.name},
        "resource": agent,
        "context": context,
    }
    entities: list[dict[str, Any]] = [
        {"uid": user, "attrs": {"roles": sorted(set(call.roles))}, "parents": []},
        {"uid": agent, "attrs": {}, "parents": []},
    ]
    return request, entities


def decide(policies: CompiledPolicies, call: CallFacts) -> PolicyDecision:
    """The set's decision on one call: forbid (any matching forbid, or any policy that erred) >
    the strictest matching permit (most approvers; then the first by @id) > no match."""
    request, entities = _request(call)
    result = cedarpy.is_authorized(request, policies.handle, entities)
    for error in result.diagnostics.errors:
        erred = _ERRED.search(error)
        info = policies.policies.get(erred.group(1)) if erred else None
        return PolicyDecision(outcome="forbid", policy=info.id if info else None, error=error)
    matched = [policies.policies[pid] for pid in result.diagnostics.reasons if pid in policies.policies]
    if not matched:
        return NO_MATCH
    if result.decision != cedarpy.Decision.Allow:
        return PolicyDecision(outcome="forbid", policy=min(m.id for m in matched))
    strictest = min(matched, key=lambda m: (-m.approvals, m.id))
    if not strictest.approvals:
        return PolicyDecision(outcome="permit_run", policy=strictest.id)
    return PolicyDecision(
        outcome="permit_approvals",
        policy=strictest.id,
        approvals=strictest.approvals,
        approvers=list(strictest.approvers),
    )
