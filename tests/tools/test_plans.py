"""A write is a plan and its application (tools/registry.py `Plan`), and policies judge the plan.

Property tests on the real PostgreSQL (seeded data, each example rolled back) and the real Cedar
engine:
- every spelling a tool accepts for the same thing (an address in any case with blanks around it,
  a lead by its email in any case or by its id) plans to the same normalized arguments, so a
  `forbid` on `context.args` holds for each of them (issue 48, item 4);
- one `forbid` on the plan's field change ("no lead becomes converted") refuses every tool that
  would make it, update_lead_status and write_record alike (item 6);
- applying a plan changes exactly the records its effect names, and each only in the fields the
  effect lists.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from activities.policy_gate import judge
from countersign.core.calls import CallerContext, PolicyDecision, ToolInvocation
from countersign.core.cedar_policy import CallFacts, compile_policies, decide
from countersign.core.policy import PolicyCheck
from countersign.db import schema
from countersign.db.policies import digest
from tests.fixtures.policies import NEVER_CONVERTED, NOT_JANE, TO_COMPETITOR
from tests.fixtures.postgres import JANE
from tests.tools.test_effects import MODELS, context
from tools import REGISTRY
from tools.arguments import parse_arguments
from tools.registry import Plan, ToolContext
from tools.resolve import as_json

EXAMPLES = int(os.environ.get("PLAN_EXAMPLES", "25"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SPECS = [tool.spec() for tool in REGISTRY.values()]


def spelled(text: str, upper: list[bool], before: str, after: str) -> str:
    """`text` with the letters `upper` marks in upper case, and blanks around it."""
    letters = (c.upper() if up else c for c, up in zip(text, upper + [False] * len(text), strict=False))
    return before + "".join(letters) + after


BLANKS = st.sampled_from(["", " ", "  ", "\t", " \t "])
CASES = st.lists(st.booleans(), min_size=0, max_size=40)


def addresses(address: str) -> st.SearchStrategy[str]:
    """Every spelling of `address` a tool accepts: any case, blanks around it."""
    return st.builds(lambda up, b, a: spelled(address, up, b, a), CASES, BLANKS, BLANKS)


async def planned(ctx: ToolContext, tool: str, raw: dict[str, Any]) -> Plan:
    return await REGISTRY[tool].plan(ctx, parse_arguments(REGISTRY[tool], raw))


def judged(text: str, plan: Plan, tool: str, ctx: ToolContext) -> PolicyDecision:
    """The set's decision on the plan, as the policy gate (activities/policies.py) asks it."""
    call = CallFacts(
        user=ctx.caller.user_id,
        roles=tuple(ctx.caller.roles),
        agent=ctx.caller.agent,
        spec=REGISTRY[tool].spec(),
        arguments=plan.arguments(),
        effect=plan.effect(),
    )
    return decide(compile_policies(text, SPECS), call)


async def jane_id(session: AsyncSession) -> int:
    found = await session.scalar(
        select(schema.Lead.id).where(schema.Lead.tenant_id == "acme", schema.Lead.email == JANE)
    )
    assert found is not None
    return found


@PROPERTY
@given(to=addresses("x@competitor.example"))
async def test_a_forbid_on_an_address_holds_for_every_spelling_of_it(
    db_session: AsyncSession, to: str
) -> None:
    ctx = context(db_session)
    plan = await planned(ctx, "send_email", {"to": to, "subject": "Prices", "body": "Our list"})
    assert plan.arguments()["to"] == "x@competitor.example"
    assert plan.effect().messages[0].to == ["x@competitor.example"]  # what leaves is what was judged
    decision = judged(TO_COMPETITOR, plan, "send_email", ctx)
    assert (decision.outcome, decision.policy) == ("forbid", "no-competitors")


@PROPERTY
@given(lead=st.one_of(addresses(JANE), st.just("id")), status=st.sampled_from(["qualified", "converted"]))
async def test_a_forbid_on_a_lead_holds_for_every_spelling_that_names_her(
    db_session: AsyncSession, lead: str, status: str
) -> None:
    ctx = context(db_session)
    ref = str(await jane_id(db_session)) if lead == "id" else lead
    plan = await planned(ctx, "update_lead_status", {"lead": ref, "new_status": status, "reason": "x"})
    assert plan.arguments()["lead"] == JANE
    decision = judged(NOT_JANE, plan, "update_lead_status", ctx)
    assert (decision.outcome, decision.policy) == ("forbid", "leave-jane")
    # another lead is another plan: the rule does not reach it
    other = await planned(
        ctx, "update_lead_status", {"lead": "John.Smith@initech.example", "new_status": status, "reason": "x"}
    )
    assert other.arguments()["lead"] == "john.smith@initech.example"
    assert judged(NOT_JANE, other, "update_lead_status", ctx).outcome == "no_match"


async def test_one_forbid_on_the_field_change_covers_every_tool_that_makes_it(
    db_session: AsyncSession,
) -> None:
    """Item 6: "no lead becomes converted, by any tool" is one rule on the plan's field changes."""
    alice, carol = context(db_session), context(db_session, "carol", ("admin",))
    jane = await jane_id(db_session)
    by_status = {"lead": "Jane.Doe@Example.com", "new_status": "converted", "reason": "signed"}
    by_record = {"collection": "leads", "id": jane, "values": [{"field": "status", "value": "converted"}]}
    for ctx, tool, raw in (
        (alice, "update_lead_status", by_status),
        (carol, "write_record", by_record),
    ):
        decision = judged(NEVER_CONVERTED, await planned(ctx, tool, raw), tool, ctx)
        assert (decision.outcome, decision.policy) == ("forbid", "never-converted"), tool
    # the same tools making another change are not refused
    qualified = {**by_status, "new_status": "qualified"}
    assert (
        judged(
            NEVER_CONVERTED,
            await planned(alice, "update_lead_status", qualified),
            "update_lead_status",
            alice,
        ).outcome
        == "no_match"
    )
    renamed = {**by_record, "values": [{"field": "notes", "value": "converted last year"}]}
    assert (
        judged(NEVER_CONVERTED, await planned(carol, "write_record", renamed), "write_record", carol).outcome
        == "no_match"
    )


# --- applying a plan changes exactly what its effect names --------------------------------------------

TABLES = ("lead", "task", "project", "event")
DERIVED = frozenset({"updated_at", "score", "last_engaged_at"})  # kept current by the database and rescoring


async def rows(session: AsyncSession) -> dict[tuple[str, int], dict[str, Any]]:
    """Every acme row of the tables a write below may touch, by (kind, id), without derived columns."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for kind in TABLES:
        model = MODELS[kind]
        for row in (
            await session.execute(select(model.__table__).where(model.__table__.c.tenant_id == "acme"))
        ).mappings():
            found[(kind, row["id"])] = {k: as_json(v) for k, v in row.items() if k not in DERIVED}
    return found


Raw = Callable[[int], dict[str, Any]]
CALLS: list[tuple[str, tuple[str, ...], st.SearchStrategy[Raw]]] = [
    (
        "update_lead_status",
        ("sales",),
        st.builds(
            lambda status, ref: lambda jane: {"lead": ref or str(jane), "new_status": status, "reason": "x"},
            st.sampled_from(["new", "contacted", "qualified", "disqualified", "converted"]),
            st.sampled_from([JANE, "", "MARIA.GARCIA@umbrella.example "]),
        ),
    ),
    (
        "write_record",
        ("admin",),
        st.builds(
            lambda values: lambda jane: {"collection": "leads", "id": jane, "values": values},
            st.lists(
                st.sampled_from(
                    [
                        {"field": "status", "value": "converted"},
                        {"field": "status", "value": "qualified"},
                        {"field": "notes", "value": "a note"},
                        {"field": "company", "value": "Acme Ltd"},
                    ]
                ),
                min_size=1,
                max_size=3,
                unique_by=lambda v: v["field"],
            ),
        ),
    ),
    (
        "update_task",
        ("sales",),
        st.builds(
            lambda status, title: (
                lambda jane: {"task": "Review pricing page", "status": status, "title": title}
            ),
            st.sampled_from(["open", "in_progress", "done"]),
            st.sampled_from([None, "Review the pricing page"]),
        ),
    ),
    (
        "create_task",
        ("sales",),
        st.builds(
            lambda title, assignee: lambda jane: {"title": title, "assignee": assignee},
            st.sampled_from(["Call Jane", "Send the deck"]),
            st.sampled_from([None, "bob", "Bob Brennan"]),
        ),
    ),
    (
        "update_project",
        ("sales",),
        st.builds(
            lambda status: lambda jane: {"project": "CRM data cleanup", "status": status},
            st.sampled_from(["planned", "active", "on_hold", "done"]),
        ),
    ),
]


@pytest.mark.parametrize(("tool", "roles", "calls"), CALLS, ids=[c[0] for c in CALLS])
@PROPERTY
@given(data=st.data())
async def test_applying_a_plan_changes_exactly_the_records_its_effect_names(
    db_session: AsyncSession,
    tool: str,
    roles: tuple[str, ...],
    calls: st.SearchStrategy[Raw],
    data: st.DataObject,
) -> None:
    example = await db_session.begin_nested()
    try:
        ctx = context(db_session, "carol" if "admin" in roles else "alice", roles)
        raw = data.draw(calls)(await jane_id(db_session))
        before = await rows(db_session)
        plan = await planned(ctx, tool, raw)
        effect = plan.effect()
        assert await rows(db_session) == before  # planning changes nothing
        await REGISTRY[tool].apply(ctx, plan)
        after = await rows(db_session)
        changed = {
            key: sorted(k for k in after[key] if after[key][k] != before[key][k])
            for key in before
            if after.get(key) != before[key]
        }
        named = {(c.kind, int(c.id)): sorted(c.fields) for c in effect.changes}
        assert changed == named, (raw, effect.summary)
        created = sorted(kind for kind, _ in set(after) - set(before))
        assert created == sorted(c.kind for c in effect.creates), (raw, effect.summary)
        for (kind, row_id), fields in named.items():
            change = next(c for c in effect.changes if (c.kind, c.id) == (kind, str(row_id)))
            assert {name: after[(kind, row_id)][name] for name in fields} == {
                n: f.after for n, f in change.fields.items()
            }
    finally:
        await example.rollback()


@PROPERTY
@given(to=addresses("x@competitor.example"))
async def test_a_reviewers_edit_meets_the_forbid_in_every_spelling_it_accepts(
    db_session: AsyncSession, to: str
) -> None:
    """An edit is a new plan, judged again (issue 48, item 5): the judgement a reviewer's edited
    arguments meet (activities/policy_gate.py `judge`, as record_decision asks it) refuses a forbid's
    target in every spelling the tool accepts, as it refuses the model's own call."""
    if await db_session.get(schema.TenantPolicy, ("acme", "enforced")) is None:  # once per test
        db_session.add(
            schema.TenantPolicy(
                tenant_id="acme",
                mode="enforced",
                version=1,
                text=TO_COMPETITOR,
                sha256=digest(TO_COMPETITOR),
                applied_by="carol",
            )
        )
        await db_session.flush()
    edited = {"to": to, "subject": "Prices", "body": "Our list"}
    invocation = ToolInvocation(
        caller=CallerContext(tenant_id="acme", user_id="alice", roles=[], agent="lead-qualifier"),
        workflow_id="wf-edit",
        run_id="",
        call_id="c1",
        tool="send_email",
        arguments=json.dumps(edited),
    )
    check = PolicyCheck(invocation=invocation, spec=REGISTRY["send_email"].spec())
    decision = await judge(db_session, check, edited)
    assert (decision.outcome, decision.policy, decision.version) == ("forbid", "no-competitors", 1)
