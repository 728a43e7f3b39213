"""`policy apply`, `policy show`, `policy test` against a real PostgreSQL: only a tenant's admin
applies a set, every attempt is chained in the tenant's audit, a refused set changes nothing, and
`policy test` replays the recorded calls (history counts as they were before each call)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest_asyncio
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.cedar_policy import compile_policies
from countersign.db.engine import session_factory
from countersign.db.schema import ApprovalRequest, AuditChainRecord, PolicyChange, TenantPolicy, ToolExecution
from countersign.runtime.config import PROJECT_ROOT
from tests.fixtures.cli import run_starter
from tools.registry import REGISTRY

FORBID_COMPETITOR = """
@id("no-competitor")
forbid(principal, action == Countersign::Action::"send_email", resource)
when { context.args.to like "*@competitor.example" };
"""
DAILY_CAP = """
@id("two-a-day")
forbid(principal, action == Countersign::Action::"send_email", resource)
when { context.history.calls_today_by_requester >= 2 };
"""


async def policy(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await run_starter("policy", *args, env={"DATABASE_URL": database_url})


@pytest_asyncio.fixture
async def acme_without_policies(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """A marker for the calls this test records; acme's sets and those calls removed afterwards
    (policy_changes are chained: they stay, like every audit row)."""
    marker = f"policy-cli-{uuid.uuid4().hex[:8]}"
    yield marker
    async with db_engine.begin() as conn:
        await conn.execute(delete(TenantPolicy).where(TenantPolicy.tenant_id == "acme"))
        await conn.execute(delete(ToolExecution).where(ToolExecution.workflow_id == marker))
        await conn.execute(delete(ApprovalRequest).where(ApprovalRequest.workflow_id == marker))


def written(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"{uuid.uuid4().hex}.cedar"
    path.write_text(text)
    return str(path)


async def test_only_an_admin_applies_a_valid_set_and_every_attempt_is_chained(
    database_url: str, db_engine: AsyncEngine, tmp_path: Path, acme_without_policies: str
) -> None:
    file = written(tmp_path, FORBID_COMPETITOR)
    by_bob = await policy(database_url, "apply", file, "--tenant", "acme", "--as", "bob")
    assert by_bob.returncode == 1
    assert "refused (recorded): only an admin of acme may change its policies (bob is not)" in by_bob.stderr
    bad = written(tmp_path, '@id("x") @approval("2") permit(principal, action, resource);')
    refused = await policy(database_url, "apply", bad, "--tenant", "acme", "--as", "carol")
    assert refused.returncode == 1 and "unknown annotation @approval" in refused.stderr
    shown = await policy(database_url, "show", "--tenant", "acme")
    assert shown.stdout.strip() == "acme: no policies (the tiers decide every call)"

    done = await policy(database_url, "apply", file, "--tenant", "acme", "--as", "carol")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "acme: enforced policy set version 1 applied by carol"
    shadow = await policy(
        database_url, "apply", written(tmp_path, DAILY_CAP), "--tenant", "acme", "--as", "carol", "--shadow"
    )
    assert shadow.returncode == 0, shadow.stderr
    shown = await policy(database_url, "show", "--tenant", "acme", "--json")
    sets = json.loads(shown.stdout)
    assert sets["enforced"]["version"] == 1 and sets["enforced"]["text"] == FORBID_COMPETITOR
    assert sets["shadow"]["applied_by"] == "carol" and "two-a-day" in sets["shadow"]["text"]

    async with session_factory(db_engine)() as session:
        changes = (
            await session.scalars(
                select(PolicyChange)
                .where(PolicyChange.tenant_id == "acme")
                .order_by(PolicyChange.id.desc())
                .limit(4)
            )
        ).all()
        assert [(c.changed_by, c.accepted, c.version, c.mode) for c in reversed(changes)] == [
            ("bob", False, None, "enforced"),
            ("carol", False, None, "enforced"),
            ("carol", True, 1, "enforced"),
            ("carol", True, 1, "shadow"),
        ]
        chained = await session.scalars(
            select(AuditChainRecord.source_id).where(
                AuditChainRecord.tenant_id == "acme", AuditChainRecord.source == "policy_changes"
            )
        )
        assert {f"[{c.id}]" for c in changes} <= set(chained)


async def test_policy_test_replays_recorded_calls_with_their_history(
    database_url: str, db_engine: AsyncEngine, tmp_path: Path, acme_without_policies: str
) -> None:
    marker, now = acme_without_policies, datetime.now(UTC)
    start = max(now.replace(hour=0, minute=0, second=0, microsecond=0), now - timedelta(minutes=30))
    recipients = ["a@ok.example", "b@ok.example", "c@competitor.example"]
    async with db_engine.begin() as conn:
        for i, to in enumerate(recipients):
            await conn.execute(
                insert(ToolExecution).values(
                    tenant_id="acme", agent="sales-assistant", user_id="alice", workflow_id=marker,
                    run_id="r", call_id=f"c{i}", tool="send_email", risk="high", category="external",
                    args={"to": to, "subject": "s", "body": "b", "html_body": None, "lead": None},
                    outcome="executed", created_at=start + timedelta(seconds=i),
                )
            )  # fmt: skip
        for i, state in ((3, "pending"), (4, "approved")):  # waiting now, and decided (its call ran)
            await conn.execute(
                insert(ApprovalRequest).values(
                    conversation_id=marker, call_id=f"c{i}", workflow_id=marker, tenant_id="acme",
                    agent="sales-assistant", tool="send_email", risk="high",
                    args=json.dumps({"to": "d@ok.example", "subject": "s", "body": "b"}), args_sha256="x",
                    nonce=f"n{i}", requested_by="alice", requested_at=start + timedelta(seconds=i),
                    expires_at=now + timedelta(hours=1), state=state,
                )
            )  # fmt: skip
    replayed = await policy(
        database_url, "test", written(tmp_path, DAILY_CAP), "--tenant", "acme", "--since-days", "1", "--json"
    )
    assert replayed.returncode == 0, replayed.stderr
    changed = [c for c in json.loads(replayed.stdout)["changed"] if c["workflow_id"] == marker]
    # the third call had two before it today: the cap would have refused it, and so the call
    # waiting for its approval (three before it); the decided request is its call's audit row
    cap = {"outcome": "forbid", "policy": "two-a-day"}
    assert [(c["call_id"], c["outcome"], c["enforced"], c["candidate"]) for c in changed] == [
        ("c3", "pending", {"outcome": "no_match"}, cap),
        ("c2", "executed", {"outcome": "no_match"}, cap),
    ]

    applied = await policy(
        database_url, "apply", written(tmp_path, FORBID_COMPETITOR), "--tenant", "acme", "--as", "carol"
    )
    assert applied.returncode == 0, applied.stderr
    same = await policy(database_url, "test", written(tmp_path, FORBID_COMPETITOR), "--tenant", "acme")
    assert same.returncode == 0 and "; 0 would be decided otherwise" in same.stdout
    text = await policy(database_url, "test", written(tmp_path, DAILY_CAP), "--tenant", "acme")
    assert (
        f"send_email by alice (roles sales today; {marker} c2, was executed): forbid by no-competitor"
        " -> forbid by two-a-day" in text.stdout
    )
    assert (
        f"send_email by alice (roles sales today; {marker} c3, was pending): tiers -> forbid by two-a-day"
        in text.stdout
    )
    assert f"({marker} c0" not in text.stdout


NO_SALES_EMAIL = """
@id("no-sales-email")
forbid(principal, action == Countersign::Action::"send_email", resource)
when { principal.roles.contains("sales") };
"""


async def test_policy_test_replays_each_call_with_the_roles_recorded_at_it(
    database_url: str, db_engine: AsyncEngine, tmp_path: Path, acme_without_policies: str
) -> None:
    """Issue 50: bob (a reviewer today) sent an email while he was in sales, as the call recorded;
    a set that forbids sales people's emails would have refused it, whatever his roles are today. A
    call recorded before roles were (NULL) is replayed with today's, and the report says how many."""
    marker, now = acme_without_policies, datetime.now(UTC)
    async with db_engine.begin() as conn:
        for call_id, roles in (("c0", ["sales"]), ("c1", None)):
            await conn.execute(
                insert(ToolExecution).values(
                    tenant_id="acme", agent="sales-assistant", user_id="bob", workflow_id=marker,
                    run_id="r", call_id=call_id, tool="send_email", risk="high", category="external",
                    args={"to": "a@ok.example", "subject": "s", "body": "b", "html_body": None, "lead": None},
                    outcome="executed", created_at=now - timedelta(minutes=5), roles=roles,
                )
            )  # fmt: skip
    replayed = await policy(
        database_url, "test", written(tmp_path, NO_SALES_EMAIL), "--tenant", "acme", "--json"
    )
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    changed = [c for c in report["changed"] if c["workflow_id"] == marker]
    assert [(c["call_id"], c["roles"], c["roles_as"]) for c in changed] == [("c0", ["sales"], "at the call")]
    assert report["with_roles_today"] >= 1  # c1, recorded without its roles
    text = await policy(database_url, "test", written(tmp_path, NO_SALES_EMAIL), "--tenant", "acme")
    assert f"send_email by bob (roles sales at the call; {marker} c0, was executed)" in text.stdout
    assert "recorded before roles were: replayed with their requester's roles today" in text.stdout


def test_the_readmes_policy_file_is_a_valid_set_with_each_kind() -> None:
    """docs/reference/policies.md, "Policies, grants and quorum": the file it shows is the repository's
    examples/policies.cedar (which its commands apply), and it is a valid set with each kind."""
    readme = (PROJECT_ROOT / "docs" / "reference" / "policies.md").read_text()
    section = readme[readme.index("A policy file with each kind") :]
    text = section[section.index("```text\n") + len("```text\n") : section.index("```\n", 10)]
    assert text == (PROJECT_ROOT / "examples" / "policies.cedar").read_text()
    compiled = compile_policies(text, [tool.spec() for tool in REGISTRY.values()])
    kinds = {(p.effect, p.approvals > 0) for p in compiled.policies.values()}
    assert kinds == {("forbid", False), ("permit", False), ("permit", True)}
    assert compiled.counters == {"calls_today_by_requester"}
    assert compiled.sums == {("sum_last_hour_by_requester", "limit")}
