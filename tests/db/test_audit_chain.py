"""The audit as evidence (issue 38): every fact a writer records is chained per tenant in its own
transaction; the bundle `audit export` writes verifies offline and any tampering with it (one
byte, two records swapped, one deleted) is named; so is a chained row changed or deleted in SQL.

Each test chains into a tenant of its own: other tests delete audit rows of the seeded tenants."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.audit import AuditActivities
from activities.authority import AuthorityActivities
from activities.tools import ToolActivities
from countersign.core.authority import ActionCheck
from countersign.core.calls import CallerContext, ToolInvocation, ToolResult, UnexecutedCall
from countersign.core.evidence import GENESIS, Broken, canonical, manifest_of, read_checkpoint, verify_bundle
from countersign.db.chain import chain, export_bundle, fact_of, verify_live
from countersign.db.engine import session_factory
from countersign.db.schema import (
    ApprovalDecision,
    AuditChainRecord,
    Compensation,
    DraftEdit,
    EmailDraft,
    InputAudit,
    ProofCheck,
    Task,
    Tenant,
    TierChange,
    ToolExecution,
)
from countersign.identity.proofs import (
    Binding,
    ProofVerifier,
    check_proof,
    load_private_key,
    mint_proof,
    pem_pair,
)
from countersign.runtime.config import Settings
from countersign.server.app import running_server
from tests.fixtures.cli import run_starter
from tools.drafts import DraftEditor, UpdateDraftArgs, edit_draft
from tools.tiers import change_tenant_tier

CALLS = 4


@pytest_asyncio.fixture
async def tenant(db_engine: AsyncEngine) -> AsyncIterator[str]:
    """A tenant of this test only, with its audit and chain removed afterwards."""
    slug = f"ev-{uuid.uuid4().hex[:10]}"
    async with session_factory(db_engine).begin() as session:
        session.add(Tenant(id=slug, name=slug))
    yield slug
    async with db_engine.begin() as conn:
        for model in (AuditChainRecord, ToolExecution, ApprovalDecision, Compensation, ProofCheck):
            await conn.execute(delete(model).where(model.tenant_id == slug))
        await conn.execute(delete(Tenant).where(Tenant.id == slug))


def refused_call(tenant: str, n: int) -> UnexecutedCall:
    caller = CallerContext(tenant_id=tenant, user_id="alice", roles=["sales"], agent="operations")
    invocation = ToolInvocation(
        caller=caller,
        workflow_id=f"wf-{uuid.uuid4()}",
        run_id="run-1",
        call_id=f"c{n}",
        tool="create_task",
        arguments=json.dumps({"title": f"Call back {n}", "note": "naïve ✓"}),
    )
    return UnexecutedCall(
        invocation=invocation,
        result=ToolResult.failure("REJECTED", "not now"),
        reason=f"rejected by bob ({n})",
    )


async def audited(db_engine: AsyncEngine, tenant: str) -> None:
    """The tenant's audit as its writers record it: refused calls (written twice, as a retry
    would), a decision and a compensation."""
    sessions = session_factory(db_engine)
    audit = AuditActivities(sessions)
    for n in range(CALLS):
        call = refused_call(tenant, n)
        await audit.record_unexecuted_call(call)
        await audit.record_unexecuted_call(call)  # a retry appends nothing
    async with sessions.begin() as session:
        decision = ApprovalDecision(
            tenant_id=tenant, workflow_id="wf-d", call_id="c9", tool="create_task",
            approver="bob", decision="approve", accepted=True, reason=None, args={"title": "edited"},
        )  # fmt: skip
        session.add(decision)
        await session.flush()
        await session.refresh(decision)
        await chain(session, decision)
        undone = Compensation(
            tenant_id=tenant, workflow_id="wf-d", call_id="c9", tool="create_task", compensation="delete_task"
        )
        session.add(undone)
        await session.flush()
        await session.refresh(undone)
        await chain(session, undone)


async def bundle(db_engine: AsyncEngine, tenant: str) -> tuple[bytes, bytes]:
    key = Ed25519PrivateKey.generate()
    async with session_factory(db_engine)() as session:
        records, manifest = await export_bundle(session, key, tenant, datetime.now(UTC))
    return manifest, records


async def test_every_fact_is_chained_once_and_the_live_chain_verifies(
    db_engine: AsyncEngine, tenant: str
) -> None:
    await audited(db_engine, tenant)
    async with session_factory(db_engine)() as session:
        sources = (
            await session.scalars(
                select(AuditChainRecord.source)
                .where(AuditChainRecord.tenant_id == tenant)
                .order_by(AuditChainRecord.seq)
            )
        ).all()
        assert sources == ["tool_executions"] * CALLS + ["approval_decisions", "compensations"]
        assert await verify_live(session, tenant) == CALLS + 2


async def test_the_bundle_verifies_offline_and_maps_who_asked_who_decided_and_when(
    db_engine: AsyncEngine, tenant: str
) -> None:
    await audited(db_engine, tenant)
    manifest, records = await bundle(db_engine, tenant)
    checked = verify_bundle(manifest, records)
    assert checked["count"] == CALLS + 2 and checked["tenant"] == tenant
    first = json.loads(records.splitlines()[0])["record"]
    assert first["asked_by"] == {"human": "alice", "agent": "operations"}
    assert first["evidence"]["reason"] == "rejected by bob (0)" and first["at"]
    decision = json.loads(records.splitlines()[CALLS])["record"]
    assert decision["decided_by"] == "bob" and decision["fact"]["args"] == {"title": "edited"}


async def test_tampering_with_the_bundle_is_named(db_engine: AsyncEngine, tenant: str) -> None:
    await audited(db_engine, tenant)
    manifest, records = await bundle(db_engine, tenant)
    lines = records.splitlines(keepends=True)

    def named(tampered: bytes, seq: int) -> None:
        with pytest.raises(Broken) as broken:
            verify_bundle(manifest, tampered)
        assert str(broken.value).startswith(f"record {seq} "), str(broken.value)

    quick = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

    @quick
    @given(st.data())
    def one_byte(data: st.DataObject) -> None:
        at = data.draw(st.integers(0, len(records) - 1))
        byte = data.draw(st.integers(0, 255).filter(lambda b: b != records[at]))
        line = records[:at].count(b"\n") + 1
        named(records[:at] + bytes([byte]) + records[at + 1 :], line)

    @quick
    @given(st.lists(st.integers(0, len(lines) - 1), min_size=2, max_size=2, unique=True))
    def two_swapped(pair: list[int]) -> None:
        i, j = sorted(pair)
        swapped = [*lines]
        swapped[i], swapped[j] = swapped[j], swapped[i]
        named(b"".join(swapped), i + 1)

    @quick
    @given(st.integers(0, len(lines) - 1))
    def one_deleted(i: int) -> None:
        named(b"".join(lines[:i] + lines[i + 1 :]), i + 1)

    one_byte()
    two_swapped()
    one_deleted()
    with pytest.raises(Broken, match="the manifest"):  # nor can the manifest change
        verify_bundle(manifest.replace(b'"count": 6', b'"count": 5'), records)


@pytest.mark.parametrize("tamper", ["update", "delete"])
async def test_a_row_changed_behind_countersigns_back_is_named(
    db_engine: AsyncEngine, database_url: str, tenant: str, tamper: str
) -> None:
    await audited(db_engine, tenant)
    async with db_engine.begin() as conn:
        victim = await conn.scalar(
            select(func.min(ToolExecution.id)).where(
                ToolExecution.tenant_id == tenant, ToolExecution.call_id == "c2"
            )
        )
        where = ToolExecution.id == victim
        await conn.execute(
            update(ToolExecution).where(where).values(approved_by="mallory")
            if tamper == "update"
            else delete(ToolExecution).where(where)
        )
    done = await run_starter("audit", "verify", "--tenant", tenant, env={"DATABASE_URL": database_url})
    assert done.returncode == 1
    what = "changed" if tamper == "update" else "deleted"
    assert f"record 3 (tool_executions [{victim}]) does not verify: the row was {what}" in done.stderr


async def test_a_chain_record_changed_or_removed_in_sql_is_named(db_engine: AsyncEngine, tenant: str) -> None:
    await audited(db_engine, tenant)
    async with db_engine.begin() as conn:
        forged = (
            "UPDATE audit_chain SET record = replace(record, 'alice', 'eve') WHERE tenant_id = :t AND seq = 2"
        )
        await conn.execute(text(forged), {"t": tenant})
    async with session_factory(db_engine)() as session:
        with pytest.raises(Broken, match=r"^record 2 does not verify: its hash"):
            await verify_live(session, tenant)
    async with db_engine.begin() as conn:
        await conn.execute(
            delete(AuditChainRecord).where(AuditChainRecord.tenant_id == tenant, AuditChainRecord.seq == 2)
        )
    async with session_factory(db_engine)() as session:
        with pytest.raises(Broken, match=r"^record 2 does not verify: record 3 stands in its place"):
            await verify_live(session, tenant)


async def test_concurrent_appends_of_a_tenant_make_one_chain(db_engine: AsyncEngine, tenant: str) -> None:
    """Writers racing in one tenant wait for each other's head: no fork, no gap."""
    audit = AuditActivities(session_factory(db_engine))
    await asyncio.gather(*(audit.record_unexecuted_call(refused_call(tenant, n)) for n in range(12)))
    async with session_factory(db_engine)() as session:
        assert await verify_live(session, tenant) == 12


async def test_export_and_verify_through_the_cli(
    db_engine: AsyncEngine, database_url: str, tenant: str, tmp_path: Path
) -> None:
    await audited(db_engine, tenant)
    private, _ = pem_pair()
    env = {
        "DATABASE_URL": database_url,
        "COUNTERSIGN_PROOF_PRIVATE_KEY": private,
        "COUNTERSIGN_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
    }
    out = tmp_path / "bundle"
    exported = await run_starter("audit", "export", "--tenant", tenant, "--out", str(out), env=env)
    assert exported.returncode == 0, exported.stderr
    verified = await run_starter("audit", "verify", str(out))
    assert verified.returncode == 0, verified.stderr
    assert f"bundle of {tenant} verifies: {CALLS + 2} records" in verified.stdout
    records = (out / "records.jsonl").read_bytes()
    (out / "records.jsonl").write_bytes(records.replace(b"alice", b"alicf", 1))
    broken = await run_starter("audit", "verify", str(out))
    assert broken.returncode == 1 and "record 1 (line 1) does not verify" in broken.stderr
    live = await run_starter("audit", "verify", "--tenant", tenant, env=env)
    assert live.returncode == 0 and f"chain of {tenant} verifies: {CALLS + 2} records" in live.stdout
    assert "reaching its checkpoint of " in live.stdout


async def test_a_bundle_of_the_last_days_starts_at_its_anchor(db_engine: AsyncEngine, tenant: str) -> None:
    await audited(db_engine, tenant)
    async with db_engine.begin() as conn:  # the first two records were written long ago
        await conn.execute(
            update(AuditChainRecord)
            .where(AuditChainRecord.tenant_id == tenant, AuditChainRecord.seq <= 2)
            .values(created_at=func.now() - text("interval '30 days'"))
        )
    now = datetime.now(UTC)
    async with session_factory(db_engine)() as session:
        second = await session.scalar(
            select(AuditChainRecord.hash).where(
                AuditChainRecord.tenant_id == tenant, AuditChainRecord.seq == 2
            )
        )
        records, manifest = await export_bundle(
            session, Ed25519PrivateKey.generate(), tenant, now, now - timedelta(days=7)
        )
    checked = verify_bundle(manifest, records)
    assert (checked["first_seq"], checked["count"], checked["anchor"]) == (3, CALLS, second)
    without_first = b"".join(records.splitlines(keepends=True)[1:])
    with pytest.raises(Broken, match=r"^record 3 \(line 1\) does not verify: record 4 stands in its place"):
        verify_bundle(manifest, without_first)


async def test_an_executed_call_is_chained_in_the_transaction_of_its_effect(db_engine: AsyncEngine) -> None:
    """Through the tool activity itself (the seeded tenant: its tools need its people)."""
    title = f"Chained {uuid.uuid4()}"
    caller = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="operations")
    invocation = ToolInvocation(
        caller=caller, workflow_id=f"wf-{uuid.uuid4()}", run_id="run-1", call_id="c1", tool="create_task",
        arguments=json.dumps({"title": title}),
    )  # fmt: skip
    assert (await ToolActivities(session_factory(db_engine)).execute_tool(invocation)).ok
    try:
        async with session_factory(db_engine)() as session:
            row = await session.scalar(
                select(ToolExecution).where(ToolExecution.workflow_id == invocation.workflow_id)
            )
            assert row is not None
            chained = (
                await session.scalars(
                    select(AuditChainRecord.record).where(
                        AuditChainRecord.source == "tool_executions",
                        AuditChainRecord.source_id == f"[{row.id}]",
                    )
                )
            ).all()
        assert len(chained) == 1
        record = json.loads(chained[0])
        assert record["fact"]["outcome"] == "executed" and record["fact"]["args"] == {"title": title}
        assert record["asked_by"] == {"human": "alice", "agent": "operations"}
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(
                delete(AuditChainRecord).where(AuditChainRecord.record.contains(invocation.workflow_id))
            )
            await conn.execute(
                delete(ToolExecution).where(ToolExecution.workflow_id == invocation.workflow_id)
            )
            await conn.execute(delete(Task).where(Task.title == title))


async def test_a_refused_grant_is_chained(db_engine: AsyncEngine) -> None:
    """Grants and their refusals (tier_changes) are facts of the audit too."""
    async with session_factory(db_engine).begin() as session:
        change = await change_tenant_tier(
            session, tenant_id="acme", agent="operations", tool="create_task", tier="always_allow",
            changed_by="alice", via="cli",
        )  # fmt: skip
    source_id = f"[{change.id}]"
    try:
        async with session_factory(db_engine)() as session:
            text_ = await session.scalar(
                select(AuditChainRecord.record).where(
                    AuditChainRecord.source == "tier_changes", AuditChainRecord.source_id == source_id
                )
            )
        assert text_ is not None
        record = json.loads(text_)
        assert not change.accepted and record["decided_by"] == "alice"
        assert record["evidence"] == {
            "old_tier": change.old_tier,
            "new_tier": "always_allow",
            "accepted": False,
        }
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(
                delete(AuditChainRecord).where(
                    AuditChainRecord.source == "tier_changes", AuditChainRecord.source_id == source_id
                )
            )
            await conn.execute(delete(TierChange).where(TierChange.id == change.id))


async def test_a_proof_check_is_chained_with_the_proofs_claims(db_engine: AsyncEngine, tenant: str) -> None:
    """What the decision rested on: the claims of the proof, accepted or replayed."""
    key = Ed25519PrivateKey.generate()
    verifier = ProofVerifier(mode="signed", key=key.public_key())
    binding = Binding.start(tenant, f"wf-{uuid.uuid4()}", "operations", {"text": "hello"})
    now = datetime.now(UTC)
    proof = mint_proof(key, "alice", binding, now)
    for attempt in ("a1", "a2"):  # the second is a replay: refused, and chained as well
        async with session_factory(db_engine).begin() as session:
            await check_proof(session, verifier, proof, binding, "alice", now, attempt)
    async with session_factory(db_engine)() as session:
        records = [
            json.loads(r)
            for r in (
                await session.scalars(
                    select(AuditChainRecord.record)
                    .where(AuditChainRecord.tenant_id == tenant)
                    .order_by(AuditChainRecord.seq)
                )
            ).all()
        ]
        assert await verify_live(session, tenant) == 2
    assert [r["evidence"]["accepted"] for r in records] == [True, False]
    for r in records:
        assert r["source"] == "proof_checks" and r["decided_by"] == "alice"
        assert r["evidence"]["claims"]["sub"] == "alice" and r["evidence"]["claims"]["tenant"] == tenant


async def test_a_draft_edit_and_a_refused_input_are_chained(db_engine: AsyncEngine, tenant: str) -> None:
    """Content a call may send, changed (who, through what, before → after), and an input to a
    conversation that was refused (who it said it was, why) are facts of the audit too: chained in
    their writers' transactions, once (a retried activity finds its row), and the chain verifies."""
    async with session_factory(db_engine).begin() as session:
        draft = EmailDraft(
            tenant_id=tenant, idempotency_key=f"ev-{uuid.uuid4()}", created_by="alice",
            to_address="partner@example.org", subject="Our offer", body="Dear partner",
        )  # fmt: skip
        session.add(draft)
        await session.flush()
        changes = UpdateDraftArgs(draft=draft.id, to="someone.else@example.org")
        await edit_draft(session, draft, changes, DraftEditor("alice", "inbox"))
    check = ActionCheck(
        tenant_id=tenant, workflow_id="wf-input", action="end", actor="mallory", conversation_user="alice",
        refusal="mallory may not end alice's conversation",
    )  # fmt: skip
    authority = AuthorityActivities(session_factory(db_engine), key=b"k" * 32)
    for _ in range(2):  # a retry of the same attempt
        assert await ActivityEnvironment().run(authority.authorize_action, check) != ""
    try:
        async with session_factory(db_engine)() as session:
            found = (
                await session.execute(
                    select(AuditChainRecord.source, AuditChainRecord.record)
                    .where(AuditChainRecord.tenant_id == tenant)
                    .order_by(AuditChainRecord.seq)
                )
            ).all()
            assert [source for source, _ in found] == ["draft_edits", "input_audit"]
            edit, refused = (json.loads(record) for _, record in found)
            assert edit["asked_by"] == {"human": "alice", "agent": None}
            assert edit["evidence"]["changes"]["to_address"] == {
                "before": "partner@example.org",
                "after": "someone.else@example.org",
            }
            assert refused["asked_by"]["human"] == "mallory" and refused["evidence"]["accepted"] is False
            assert await verify_live(session, tenant) == 2
    finally:
        async with db_engine.begin() as conn:
            for model in (DraftEdit, InputAudit, EmailDraft):
                await conn.execute(delete(model).where(model.tenant_id == tenant))


# --- issue 53: who signed, what was removed from the end, what was rewritten and re-appended ---------


def cli_env(database_url: str, private: str, checkpoints: Path) -> dict[str, str]:
    """The deployment as the CLI sees it: its database, its signing key, its checkpoints."""
    return {
        "DATABASE_URL": database_url,
        "COUNTERSIGN_PROOF_PRIVATE_KEY": private,
        "COUNTERSIGN_CHECKPOINT_DIR": str(checkpoints),
    }


async def test_a_bundle_signed_by_another_key_fails_against_the_pinned_key(
    db_engine: AsyncEngine, database_url: str, tenant: str, tmp_path: Path
) -> None:
    """A one-record bundle fabricated with a key of one's own ("carol approved send_email") is
    whole; only the deployment's pinned key or fingerprint tells it apart."""
    await audited(db_engine, tenant)
    private, public = pem_pair()
    env = cli_env(database_url, private, tmp_path / "checkpoints")
    printed = await run_starter("audit", "key", "--json", env=env)
    assert printed.returncode == 0, printed.stderr
    deployment = json.loads(printed.stdout)
    assert deployment["public_key"] == public and deployment["fingerprint"].startswith("SHA256:")
    written = await run_starter("audit", "key", "--out", str(tmp_path / "deployment.pem"), env=env)
    assert written.returncode == 0 and deployment["fingerprint"] in written.stdout
    assert (tmp_path / "deployment.pem").read_text() == public

    real = tmp_path / "real"
    assert (
        await run_starter("audit", "export", "--tenant", tenant, "--out", str(real), env=env)
    ).returncode == 0
    forged = tmp_path / "forged"
    forged.mkdir()
    manifest, records = await bundle(db_engine, tenant)  # the same records, signed by another key
    (forged / "manifest.json").write_bytes(manifest)
    (forged / "records.jsonl").write_bytes(records)

    unpinned = await run_starter("audit", "verify", str(forged))
    assert unpinned.returncode == 0 and "its origin is NOT checked" in unpinned.stdout
    for pin in (["--key", str(tmp_path / "deployment.pem")], ["--fingerprint", deployment["fingerprint"]]):
        refused = await run_starter("audit", "verify", str(forged), *pin)
        assert refused.returncode == 1, refused.stdout
        assert "the manifest does not verify: it is signed by the key SHA256:" in refused.stderr
        assert (
            f"not by the pinned {deployment['fingerprint']}" in refused.stderr or "pinned" in refused.stderr
        )
        kept = await run_starter("audit", "verify", str(real), *pin)
        assert kept.returncode == 0 and "signed by the pinned key" in kept.stdout, kept.stderr
    bare = deployment["fingerprint"].removeprefix("SHA256:").upper()  # as another tool may print it
    assert (await run_starter("audit", "verify", str(real), "--fingerprint", bare)).returncode == 0


async def newest_removed(db_engine: AsyncEngine, tenant: str, count: int) -> None:
    """Remove the tenant's newest `count` chain records and the rows they record, in SQL."""
    async with db_engine.begin() as conn:
        head = await conn.scalar(
            select(func.max(AuditChainRecord.seq)).where(AuditChainRecord.tenant_id == tenant)
        )
        gone = (
            await conn.execute(
                delete(AuditChainRecord)
                .where(AuditChainRecord.tenant_id == tenant, AuditChainRecord.seq > (head or 0) - count)
                .returning(AuditChainRecord.source, AuditChainRecord.source_id)
            )
        ).all()
        for source, source_id in gone:
            await conn.execute(text(f"DELETE FROM {source} WHERE id = :id"), {"id": json.loads(source_id)[0]})


async def test_truncating_the_newest_records_fails_against_the_latest_checkpoint(
    db_engine: AsyncEngine, database_url: str, tenant: str, tmp_path: Path
) -> None:
    await audited(db_engine, tenant)
    private, _ = pem_pair()
    env = cli_env(database_url, private, tmp_path / "checkpoints")
    written = await run_starter("audit", "checkpoint", "--tenant", tenant, env=env)
    assert written.returncode == 0 and f"checkpoint of {tenant}: record {CALLS + 2}" in written.stdout
    assert (await run_starter("audit", "verify", "--tenant", tenant, env=env)).returncode == 0

    await newest_removed(db_engine, tenant, 2)  # the decision and the compensation, rows and all
    truncated = await run_starter("audit", "verify", "--tenant", tenant, env=env)
    assert truncated.returncode == 1
    assert f"record {CALLS + 1} does not verify: it is missing: the checkpoint of" in truncated.stderr
    assert f"saw the chain reach record {CALLS + 2}" in truncated.stderr
    # nor can the truncation be checkpointed over: the evidence of the removed head stays
    again = await run_starter("audit", "checkpoint", "--tenant", tenant, env=env)
    assert again.returncode == 1 and "no checkpoint written" in again.stderr

    # the next records reuse the freed numbers: the chain is long enough again, but not the same
    audit = AuditActivities(session_factory(db_engine))
    for n in range(2):
        await audit.record_unexecuted_call(refused_call(tenant, 10 + n))
    reused = await run_starter("audit", "verify", "--tenant", tenant, env=env)
    assert reused.returncode == 1
    assert f"record {CALLS + 2} does not verify: it is not the record the checkpoint of" in reused.stderr


async def test_a_chain_record_removed_with_its_row_kept_is_named_without_a_checkpoint(
    db_engine: AsyncEngine, tenant: str
) -> None:
    """The newest record gone, its row left: the row has no record (no checkpoint needed)."""
    await audited(db_engine, tenant)
    async with db_engine.begin() as conn:
        head = await conn.scalar(
            select(func.max(AuditChainRecord.seq)).where(AuditChainRecord.tenant_id == tenant)
        )
        await conn.execute(
            delete(AuditChainRecord).where(AuditChainRecord.tenant_id == tenant, AuditChainRecord.seq == head)
        )
    async with session_factory(db_engine)() as session:
        with pytest.raises(Broken, match=r"^compensations \[\d+\] does not verify: the row has no record"):
            await verify_live(session, tenant)


async def test_a_rewritten_approver_reappended_with_chain_fails(db_engine: AsyncEngine, tenant: str) -> None:
    """bob's decision rewritten to eve in SQL, and the row chained again with the project's own
    chain(): every link holds, and the last record matches the row, but not the first record."""
    await audited(db_engine, tenant)
    sessions = session_factory(db_engine)
    async with sessions.begin() as session:
        decision = await session.scalar(select(ApprovalDecision).where(ApprovalDecision.tenant_id == tenant))
        assert decision is not None and decision.approver == "bob"
        decision.approver = "eve"
        await session.flush()
        await chain(session, decision)
    async with sessions() as session:
        with pytest.raises(Broken) as broken:
            await verify_live(session, tenant)
    assert str(broken.value) == (
        f"record {CALLS + 3} (approval_decisions [{decision.id}]) does not verify: "
        'its approver is not the one first recorded ("bob" -> "eve")'
    )


async def test_columns_a_writer_changes_later_still_verify(db_engine: AsyncEngine, tenant: str) -> None:
    """A decision voided after the fact and a compensation finished are chained again: honest."""
    await audited(db_engine, tenant)
    sessions = session_factory(db_engine)
    async with sessions.begin() as session:
        decision = await session.scalar(select(ApprovalDecision).where(ApprovalDecision.tenant_id == tenant))
        assert decision is not None
        decision.voided = {"summary": "changed"}
        await session.flush()
        await chain(session, decision)
        undone = await session.scalar(select(Compensation).where(Compensation.tenant_id == tenant))
        assert undone is not None
        undone.state = "done"
        await session.flush()
        await chain(session, undone)
    async with sessions() as session:
        assert await verify_live(session, tenant) == CALLS + 4


@pytest.mark.parametrize(
    "manifest",
    [b"[]", b"{}", b'{"signature": "x"}', "not json \udcff".encode(errors="surrogateescape"), b"\xff\xfe"],
)
async def test_a_malformed_manifest_is_a_one_line_reason(tmp_path: Path, manifest: bytes) -> None:
    (tmp_path / "manifest.json").write_bytes(manifest)
    (tmp_path / "records.jsonl").write_bytes(b"")
    done = await run_starter("audit", "verify", str(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("Error: the manifest does not verify") and done.stderr.count("\n") == 1


async def test_a_manifest_of_the_wrong_types_signed_by_its_own_key_is_a_one_line_reason(
    tmp_path: Path,
) -> None:
    key = Ed25519PrivateKey.generate()
    body = manifest_of(key, "acme", b"", [], GENESIS, 1, datetime.now(UTC), None)
    body.pop("signature")
    body["first_seq"] = "1"  # a string where a number belongs, signed all the same
    signed = body | {"signature": base64.b64encode(key.sign(canonical(body).encode())).decode()}
    (tmp_path / "manifest.json").write_text(json.dumps(signed))
    (tmp_path / "records.jsonl").write_bytes(b"")
    done = await run_starter("audit", "verify", str(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "the manifest does not verify: it is not a signed manifest (bad first_seq)" in done.stderr


async def test_the_server_checkpoints_every_tenant_whose_head_moved(
    db_engine: AsyncEngine, database_url: str, tenant: str, tmp_path: Path
) -> None:
    await audited(db_engine, tenant)
    private, _ = pem_pair()
    settings = Settings(
        database_url=database_url,
        proof_private_key=private,
        checkpoint_dir=tmp_path / "checkpoints",
        checkpoint_interval_s=0.2,
    )
    client = await Client.connect("127.0.0.1:1", lazy=True)  # the server never reaches Temporal here
    async with running_server(settings, "127.0.0.1", 0, client=client):
        for _ in range(100):
            found = list((tmp_path / "checkpoints").glob(f"*/{tenant}/*.checkpoint.json"))
            if found:
                break
            await asyncio.sleep(0.1)
    assert len(found) == 1
    checked = read_checkpoint(found[0].read_bytes(), load_private_key(private).public_key())
    assert (checked.tenant, checked.seq) == (tenant, CALLS + 2)


def test_a_column_added_later_is_left_out_of_a_rows_fact_while_it_is_null() -> None:
    """tool_executions.roles (migration 0033): a row chained before the column existed has no
    `roles` in its fact, and the live check, which recomputes the fact, must find the same."""
    row = ToolExecution(tenant_id="acme", workflow_id="w", call_id="c1", tool="t", outcome="executed")
    assert "roles" not in fact_of(row) and "decision_reason" in fact_of(row)
    row.roles = ["sales"]
    assert fact_of(row)["roles"] == ["sales"]
