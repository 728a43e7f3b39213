"""What a tenant's Cedar policies cost per call (issue 35).

    .venv/bin/python -m bench.policy [--calls 2000] [--policies 100]

Two measures, one call at a time (the machine is shared: a sequential measure is the honest one):

- Cedar's decision on one call (`countersign.core.cedar_policy.decide`: the request built, the
  parsed set evaluated, forbid > strictest permit) with `--policies` policies in the set: forbids on
  argument values, quorum permits, history-aware limits, spread over the registry's tools;
- the whole policy gate (`evaluate_policy`: the tenant's sets, the requester's roles and the history
  counts the set names read from PostgreSQL, then the decision), against a real, seeded PostgreSQL
  (embedded unless DATABASE_URL is set), with the same set applied for a bench tenant; beside it,
  per call, its reads in one statement (`gate_reads`) and the same reads as the three statements
  they were before, and the ratio of the two.

Beside them, what the rules in force add to every call's check and run (`activities/rules.py`
`rules_now`: the tier now and, for a tenant with sets, the gate), for the bench tenant with the set
and for a tenant without one (one statement), with this process's CPU; and what evaluating each call
in a child process of its own would add (`run_isolated`), the isolation apply, validate and test
have.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from activities.policies import PolicyActivities
from activities.rules import rules_now
from bench.sections import run_to_the_end
from countersign.core.authority import ADMIN
from countersign.core.calls import CallerContext, ToolInvocation, ToolSpec
from countersign.core.cedar_policy import CallFacts, compile_policies, decide
from countersign.core.policy import PolicyCheck
from countersign.db.engine import create_engine, session_factory
from countersign.db.policies import (
    apply_policies,
    audit_history,
    gate_reads,
    history_query,
    loaded,
    roles_of,
    tenant_policies,
)
from countersign.db.schema import Tenant, TenantPolicy, User, UserRole
from countersign.devstack.postgres import seeded_postgres
from countersign.runtime.isolated import run_isolated
from countersign.runtime.ports import free_port
from tools.policies import tenant_tools
from tools.registry import REGISTRY


def policy_set(count: int, specs: list[ToolSpec], rng: random.Random) -> str:
    """`count` policies over the tools: a third forbids on an argument, a third quorum permits, a
    third history-aware limits (every tool named by its action, as a tenant writes them)."""
    lines = []
    for n in range(count):
        spec = specs[n % len(specs)]
        action = f'action == Countersign::Action::"{spec.name}"'
        strings = [a for a, s in spec.parameters.get("properties", {}).items() if s.get("type") == "string"]
        kind = n % 3
        if kind == 0 and strings:
            arg = rng.choice(strings)
            condition = f'context.args has {arg} && context.args.{arg} like "*blocked-{n}*"'
            lines.append(f'@id("forbid-{n}") forbid(principal, {action}, resource) when {{ {condition} }};')
        elif kind == 1:
            lines.append(
                f'@id("quorum-{n}") @approvals("2") @approvers("reviewer,admin") '
                f'permit(principal, {action}, resource) when {{ principal.roles.contains("sales") }};'
            )
        else:
            lines.append(
                f'@id("limit-{n}") forbid(principal, {action}, resource) '
                f"when {{ context.history.calls_today_by_requester >= {20 + n} }};"
            )
    return "\n".join(lines)


def arguments(spec: ToolSpec, n: int) -> dict[str, object]:
    """Plausible arguments: every string property filled, the rest left out."""
    properties = spec.parameters.get("properties", {})
    return {a: f"value-{n}" for a, s in properties.items() if s.get("type") == "string"}


def ms(samples: list[float], q: int) -> str:
    return f"{statistics.quantiles(samples, n=100)[q - 1] * 1000:.3f}"


def row(name: str, samples: list[float]) -> str:
    return f"| {name} | {ms(samples, 50)} | {ms(samples, 95)} | {ms(samples, 99)} |"


def cedar_times(text: str, specs: list[ToolSpec], calls: int) -> tuple[float, list[float]]:
    started = time.perf_counter()
    compiled = compile_policies(text, specs)
    apply_s = time.perf_counter() - started
    samples = []
    for n in range(calls):
        spec = specs[n % len(specs)]
        call = CallFacts(
            user="alice", roles=("sales",), agent="operations", spec=spec, arguments=arguments(spec, n),
            history={"calls_today_by_requester": n % 30},
        )  # fmt: skip
        started = time.perf_counter()
        decide(compiled, call)
        samples.append(time.perf_counter() - started)
    return apply_s, samples


async def three_reads(session: AsyncSession, tenant: str, spec: ToolSpec) -> None:
    """The gate's reads as they were before `gate_reads`: sets, roles, history, a round trip each."""
    sets = [loaded(row.text) for row in (await tenant_policies(session, tenant)).values()]
    await roles_of(session, tenant, "alice")
    counters, sums = (
        frozenset().union(*(s.counters for s in sets)),
        frozenset().union(*(s.sums for s in sets)),
    )
    at = datetime.now(UTC)
    await audit_history(
        session,
        history_query(tenant_id=tenant, user="alice", spec=spec, at=at, counters=counters, sums=sums),
    )


async def gate_times(
    sessions: async_sessionmaker[AsyncSession], text: str, specs: list[ToolSpec], calls: int
) -> dict[str, list[float]]:
    """For a bench tenant that has the set (its admin applies it), per call, interleaved so that
    each sees the same load: the whole activity, its reads in one statement (`gate_reads`), and the
    same reads as three statements (before)."""
    tenant = f"bench-policy-{uuid.uuid4().hex[:6]}"
    async with sessions.begin() as session:
        session.add(Tenant(id=tenant, name=tenant))
        await session.flush()
        for user, role in (("alice", "sales"), ("carol", ADMIN)):
            session.add(User(tenant_id=tenant, id=user, display_name=user, email=f"{user}@{tenant}.example"))
            await session.flush()
            session.add(UserRole(tenant_id=tenant, user_id=user, role=role))
        await session.flush()
        change = await apply_policies(
            session,
            tenant_id=tenant,
            text=text,
            shadow=False,
            changed_by="carol",
            via="cli",
            tools=await tenant_tools(session, tenant),
        )
        assert change.accepted, change.reason
    gate = PolicyActivities(sessions)
    caller = CallerContext(tenant_id=tenant, user_id="alice", roles=["sales"], agent="operations")
    samples: dict[str, list[float]] = {
        name: [] for name in ("gate", "one", "three", "rules", "rules_cpu", "bare", "bare_cpu")
    }
    acme = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="operations")
    try:
        for n in range(calls + 20):  # the first 20 warm the pool and the plans
            spec = specs[n % len(specs)]
            invocation = ToolInvocation(
                caller=caller, workflow_id=f"wf-{n}", run_id="r", call_id=f"c{n}", tool=spec.name,
                arguments=json.dumps(arguments(spec, n)),
            )  # fmt: skip
            started = time.perf_counter()
            await gate.evaluate_policy(PolicyCheck(invocation=invocation, spec=spec))
            gate_s = time.perf_counter() - started
            async with sessions.begin() as session:
                started = time.perf_counter()
                await gate_reads(session, tenant_id=tenant, user="alice", spec=spec, at=datetime.now(UTC))
                one_s = time.perf_counter() - started
            async with sessions.begin() as session:
                started = time.perf_counter()
                await three_reads(session, tenant, spec)
                three_s = time.perf_counter() - started
            # what every call's check and run add (activities/rules.py): with the set, and for a
            # tenant without one (acme, seeded without policies: one statement)
            rules_s, rules_cpu = await timed(sessions, invocation, spec)
            bare_s, bare_cpu = await timed(sessions, invocation.model_copy(update={"caller": acme}), spec)
            if n >= 20:
                for name, value in (
                    ("gate", gate_s), ("one", one_s), ("three", three_s), ("rules", rules_s),
                    ("rules_cpu", rules_cpu), ("bare", bare_s), ("bare_cpu", bare_cpu),
                ):  # fmt: skip
                    samples[name].append(value)
    finally:  # policy_changes are chained and stay, like every audit row (and the tenant with them)
        async with sessions.begin() as session:
            for model in (TenantPolicy, UserRole, User):
                await session.execute(delete(model).where(model.tenant_id == tenant))
    return samples


async def timed(
    sessions: async_sessionmaker[AsyncSession], invocation: ToolInvocation, spec: ToolSpec
) -> tuple[float, float]:
    """`rules_now` on one call in its own transaction: wall and this process's CPU, in seconds."""
    async with sessions.begin() as session:
        started, cpu = time.perf_counter(), time.process_time()
        await rules_now(session, invocation, spec)
        return time.perf_counter() - started, time.process_time() - cpu


async def isolated_times(calls: int) -> list[float]:
    """What evaluating each call in a child process of its own would add: one child's round trip."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await run_isolated("json:dumps", 1)
        samples.append(time.perf_counter() - started)
    return samples


async def run(url: str | None, calls: int, count: int) -> str:
    specs = [tool.spec() for tool in REGISTRY.values()]
    text = policy_set(count, specs, random.Random(35))
    apply_s, cedar = cedar_times(text, specs, calls)
    lines = ["| measured (ms) | p50 | p95 | p99 |", "|---|---:|---:|---:|"]
    lines.append(row("Cedar's decision (`decide`)", cedar))
    if url is not None:
        engine = create_engine(url)
        try:
            gate = await gate_times(session_factory(engine), text, specs, calls)
        finally:
            await engine.dispose()
        lines.append(row("the whole gate (`evaluate_policy`, PostgreSQL)", gate["gate"]))
        lines.append(row("its reads, one statement (`gate_reads`)", gate["one"]))
        lines.append(row("the same reads, three statements (before)", gate["three"]))
        lines.append(row("the rules in force (`rules_now`), a tenant with the set", gate["rules"]))
        lines.append(row("the rules in force (`rules_now`), a tenant without a set", gate["bare"]))
        lines.append(row("evaluation in a child process per call (`run_isolated`)", await isolated_times(20)))
        ratio = statistics.median(gate["one"]) / statistics.median(gate["three"])
        lines.append(f"\nOne statement ÷ three, p50: **{ratio:.2f}**")
        cpu = {k: statistics.mean(gate[k]) * 1000 for k in ("rules_cpu", "bare_cpu")}
        lines.append(
            f"\nThis process's CPU per `rules_now`, mean: with the set {cpu['rules_cpu']:.3f} ms, "
            f"without {cpu['bare_cpu']:.3f} ms"
        )
    return (
        f"{count} policies over {len(specs)} tools, {calls} calls, one at a time; checking and parsing the "
        f"set at `policy apply`: {apply_s * 1000:.0f} ms\n\n" + "\n".join(lines)
    )


async def main(calls: int, count: int) -> None:
    url = os.environ.get("DATABASE_URL")
    if url:
        print(await run(url, calls, count))
        return
    with tempfile.TemporaryDirectory() as data:
        async with seeded_postgres(Path(data), free_port()) as own:
            print(await run(own, calls, count))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--policies", type=int, default=100)
    arguments_ = parser.parse_args()
    run_to_the_end(main(arguments_.calls, arguments_.policies))
