"""Policies judge the plan, not the model's spelling (issue 48, items 4 and 6), end to end in signed
mode through the real server, worker, Temporal and PostgreSQL.

A `forbid` on `context.args` holds for every spelling the tool accepts, since `context.args` holds
the arguments as the call's plan normalizes them: an address in any case or with blanks around it,
Jane's lead by her email in any case or by her id; on a tool that runs unasked too. And one
`forbid` on the plan's field change ("no lead becomes converted") refuses every tool that would
make it. Each refusal names the policy, asks nobody and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db.schema import AgentProfile, AgentToolPermission, ApprovalRequest, EmailOutbox, Lead
from tests.fixtures.approvals import last_tool_result, lead_status
from tests.fixtures.inbox import SignedStack
from tests.fixtures.policies import NEVER_CONVERTED, NOT_JANE, TO_COMPETITOR, ApplyPolicies
from tests.fixtures.postgres import JANE

pytestmark = pytest.mark.usefixtures("jane_is_new")
UNASKED = "plan-unasked"  # an agent whose update_lead_status runs without asking anyone


async def jane_id(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        found = await conn.scalar(select(Lead.id).where(Lead.tenant_id == "acme", Lead.email == JANE))
    assert found is not None
    return found


def calls(marker: str, tool: str, *arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's rules: asked `marker`, it calls `tool` once per arguments, one call a turn."""
    rules: list[dict[str, Any]] = []
    for done, args in enumerate(arguments):
        when: dict[str, Any] = {"user_contains": marker}
        if done:
            when |= {"after_tool": tool, "turn_calls": done}
        rules.append({"when": when, "reply": {"tool_calls": [{"name": tool, "arguments": args}]}})
    rules.append({"when": {"after_tool": tool}, "reply": {"content": "done"}})
    return rules


async def refusals(
    stack: SignedStack, engine: AsyncEngine, marker: str, tool: str, *arguments: dict[str, Any], **start: Any
) -> list[dict[str, Any]]:
    """Each call's result, once the conversation is over; nobody was asked about any of them."""
    stack.agent.script(*calls(marker, tool, *arguments))
    handle = await stack.agent.start(marker, single_turn=True, **start)
    await handle.result()
    transcript = await stack.agent.transcript(handle)
    results = [m for m in transcript if m.role == "tool"]
    assert len(results) == len(arguments), transcript
    async with engine.connect() as conn:
        asked = (
            await conn.execute(select(ApprovalRequest).where(ApprovalRequest.workflow_id == handle.id))
        ).all()
    assert asked == [], "nobody is asked about a forbidden call"
    return [last_tool_result([m]) for m in results]


def forbidden(result: dict[str, Any], policy: str) -> bool:
    return result.get("error", {}).get("code") == "FORBIDDEN" and policy in result["error"]["message"]


async def test_a_forbid_on_an_address_holds_in_any_case_and_with_blanks(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    await policies(TO_COMPETITOR)
    mail = {"subject": "Our prices", "body": "The full list"}
    results = await refusals(
        signed_agent, db_engine, "mail them", "send_email",
        {"to": "x@COMPETITOR.EXAMPLE", **mail}, {"to": " x@competitor.example", **mail},
    )  # fmt: skip
    assert all(forbidden(r, "no-competitors") for r in results), results
    async with db_engine.connect() as conn:
        sent = await conn.scalar(select(EmailOutbox.id).where(EmailOutbox.to_address.ilike("%competitor%")))
    assert sent is None


async def test_a_forbid_on_a_lead_holds_for_her_email_in_any_spelling_and_her_id(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    await policies(NOT_JANE)
    spellings = ["JANE.DOE@example.com", " jane.doe@example.com ", str(await jane_id(db_engine))]
    arguments = [{"lead": lead, "new_status": "qualified", "reason": "budget"} for lead in spellings]
    results = await refusals(signed_agent, db_engine, "qualify", "update_lead_status", *arguments)
    assert all(forbidden(r, "leave-jane") for r in results), results
    assert await lead_status(db_engine, "acme") == "new"


@pytest_asyncio.fixture
async def unasked(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """An agent whose update_lead_status is always_allow: its calls run without a reviewer."""
    async with db_engine.begin() as conn:
        await conn.execute(
            insert(AgentProfile).values(name=UNASKED, description="tests", system_prompt="Test.")
        )
        await conn.execute(
            insert(AgentToolPermission).values(agent=UNASKED, tool="update_lead_status", tier="always_allow")
        )
    yield UNASKED
    async with db_engine.begin() as conn:
        await conn.execute(delete(AgentProfile).where(AgentProfile.name == UNASKED))


async def test_a_forbid_holds_on_a_tool_that_runs_unasked(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies, unasked: str
) -> None:
    await policies(NOT_JANE)
    arguments = {"lead": "Jane.Doe@Example.COM", "new_status": "converted", "reason": "signed"}
    (result,) = await refusals(
        signed_agent, db_engine, "convert", "update_lead_status", arguments, agent=unasked
    )
    assert forbidden(result, "leave-jane"), result
    assert await lead_status(db_engine, "acme") == "new"


async def test_one_forbid_on_the_field_change_refuses_every_tool_that_makes_it(
    signed_agent: SignedStack, db_engine: AsyncEngine, policies: ApplyPolicies
) -> None:
    """Item 6: "no lead becomes converted" is one rule, for update_lead_status and write_record."""
    await policies(NEVER_CONVERTED)
    by_status = {"lead": JANE, "new_status": "converted", "reason": "signed"}
    (result,) = await refusals(signed_agent, db_engine, "convert", "update_lead_status", by_status)
    assert forbidden(result, "never-converted"), result
    by_record = {
        "collection": "leads",
        "id": await jane_id(db_engine),
        "values": [{"field": "status", "value": "converted"}],
    }
    (result,) = await refusals(
        signed_agent, db_engine, "convert", "write_record", by_record, user="carol", agent="admin-assistant"
    )
    assert forbidden(result, "never-converted"), result
    assert await lead_status(db_engine, "acme") == "new"
