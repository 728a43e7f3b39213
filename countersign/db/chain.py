"""The hash chain of a tenant's audit in PostgreSQL: appending a fact, reading the chain, checking it.

`chain` is called by every writer of a table of the audit (CHAINED), in the transaction of the
write, with the row as written: a row changed or deleted behind Countersign's back no longer
matches its last chained fact, and a chain record changed or deleted breaks the links after it.

The append is one round trip: the record's text is made here (it does not hold its own place in
the chain), and `audit_chain_append` (a PL/pgSQL function, migration 0023) takes the tenant's lock,
reads the head, hashes and inserts, as `countersign.core.evidence.link` computes and checks.

Appends of one tenant are serialized by a transaction-scoped advisory lock on the tenant
(`pg_advisory_xact_lock`), taken just before the head is read and held until the transaction
commits or rolls back: the next appender waits, then reads the head this one wrote (READ
COMMITTED, and a statement of a VOLATILE function takes a new snapshot: it sees what committed
while it waited). A head read without the lock could be read by two transactions at once and
fork the chain; the primary key (tenant, seq) would then refuse the second, but as an error, not
a wait. The lock is taken once each writer's own work is done (a decision's at its proof check,
a few statements before the commit), so it is held briefly. Other tenants do not wait (a hash
collision of two tenants' keys only makes them wait for each other).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import ColumnElement, String, bindparam, func, inspect, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.evidence import (
    GENESIS,
    Broken,
    Chained,
    Checkpoint,
    bundle_line,
    canonical,
    fact_digest,
    fixed_change,
    follows,
    jsonable,
    manifest_of,
    new_epoch,
    reaches,
    record_of,
    reopened,
)
from countersign.db.schema import (
    ApprovalDecision,
    ApprovalRequest,
    AuditChainRecord,
    Base,
    Compensation,
    DraftEdit,
    Grant,
    GrantUse,
    InputAudit,
    PolicyChange,
    ProofCheck,
    ReplyRating,
    RollbackRecord,
    TierChange,
    ToolExecution,
)

CHAINED: dict[str, type[Base]] = {
    m.__tablename__: m
    for m in (
        ToolExecution,
        ApprovalRequest,
        ApprovalDecision,
        ProofCheck,
        Compensation,
        RollbackRecord,
        TierChange,
        PolicyChange,
        InputAudit,
        DraftEdit,
        Grant,
        GrantUse,
        ReplyRating,
    )
}


# Columns added to a table of the audit after rows of it were chained: left out of a row's fact
# while NULL, so a row chained before the column existed still matches its chained fact.
ADDED_LATER: dict[str, frozenset[str]] = {"tool_executions": frozenset({"roles"})}


def fact_of(row: Base) -> dict[str, Any]:
    """The row's columns as JSON: what the chain holds of it, and what the live check compares."""
    later = ADDED_LATER.get(row.__tablename__, frozenset())
    return {
        c.key: jsonable(value)
        for c in inspect(type(row)).column_attrs
        if (value := getattr(row, c.key)) is not None or c.key not in later
    }


def source_id_of(row: Base) -> str:
    return canonical([jsonable(v) for v in inspect(row).identity or ()])


async def next_link(session: AsyncSession, tenant: str) -> tuple[int, str]:
    """The number and previous hash of the tenant's next record."""
    head = (
        await session.execute(
            select(AuditChainRecord.seq, AuditChainRecord.hash)
            .where(AuditChainRecord.tenant_id == tenant)
            .order_by(AuditChainRecord.seq.desc())
            .limit(1)
        )
    ).first()
    return (head.seq + 1, head.hash) if head else (1, GENESIS)


# Run once per chained row, on every tool call: built once, not per call (issue 36).
APPEND_LINK = select(
    func.audit_chain_append(
        *(bindparam(name, type_=String) for name in ("tenant", "source", "source_id", "digest", "record"))
    )
)


async def chain(session: AsyncSession, row: Base, context: Mapping[str, Any] | None = None) -> None:
    """Append `row` (a row of a table in CHAINED, as just written and read back in `session`'s
    transaction) to its tenant's chain; `context` is what its writer knew beside it (a proof's
    claims). The same row written again unchanged (a retry) appends nothing."""
    tenant: str = row.tenant_id  # type: ignore[attr-defined]
    fact = fact_of(row)
    source, source_id = type(row).__tablename__, source_id_of(row)
    record = canonical(record_of(tenant, source, source_id, fact, context))
    await session.execute(
        APPEND_LINK,
        {
            "tenant": tenant,
            "source": source,
            "source_id": source_id,
            "digest": fact_digest(fact),
            "record": record,
        },
    )


async def chain_written(session: AsyncSession, row: Base) -> None:
    """Write `row` (added to `session`) and read back what the database filled in (its id and
    created_at, which the chain's record holds), then append it to its tenant's chain."""
    await session.flush()
    await session.refresh(row)
    await chain(session, row)


def chained(r: AuditChainRecord) -> Chained:
    return Chained(seq=r.seq, prev_hash=r.prev_hash, text=r.record, hash=r.hash)


async def chain_records(
    session: AsyncSession, tenant: str, since: datetime | None = None, batch: int = 1000
) -> AsyncIterator[AuditChainRecord]:
    """The tenant's chain in order (from the first record written at or after `since`), in batches."""
    after = 0
    if since is not None:
        first = await session.scalar(
            select(func.min(AuditChainRecord.seq)).where(
                AuditChainRecord.tenant_id == tenant, AuditChainRecord.created_at >= since
            )
        )
        if first is None:
            return
        after = first - 1
    while True:
        rows = (
            await session.scalars(
                select(AuditChainRecord)
                .where(AuditChainRecord.tenant_id == tenant, AuditChainRecord.seq > after)
                .order_by(AuditChainRecord.seq)
                .limit(batch)
            )
        ).all()
        for r in rows:
            yield r
        if len(rows) < batch:
            return
        after = rows[-1].seq


async def last_fact(session: AsyncSession, tenant: str, source: str, source_id: str) -> str | None:
    """The digest of the row's newest chained fact: Countersign may have written the row again (and
    chained it) while the check read the chain."""
    return await session.scalar(
        select(AuditChainRecord.fact_sha256)
        .where(
            AuditChainRecord.tenant_id == tenant,
            AuditChainRecord.source == source,
            AuditChainRecord.source_id == source_id,
        )
        .order_by(AuditChainRecord.seq.desc())
        .limit(1)
    )


async def verify_live(session: AsyncSession, tenant: str, checkpoint: Checkpoint | None = None) -> int:
    """The number of records when the tenant's chain in PostgreSQL is whole; else raises Broken
    naming the first record (or row) that is not. Whole means:
    - every record follows the one before it (`follows`);
    - no record changes what its row's first record fixed (`fixed_change`): a row rewritten in SQL
      and re-appended with `chain()` links up, but its approver is not the first one recorded;
    - every chained row still holds its last chained fact, and every row of a table of the audit
      has a record (one whose record was removed is named);
    - the chain still reaches `checkpoint`, the head the deployment signed outside the database:
      records removed from the end, rows and all, or the end rewritten, are named."""
    prev, seq = GENESIS, 1
    last: dict[tuple[str, str], tuple[int, str]] = {}  # (source, source id) -> its last record
    first: dict[tuple[str, str], dict[str, Any]] = {}  # -> its first fact (of its epoch)
    latest: dict[tuple[str, str], dict[str, Any]] = {}  # -> its latest fact
    at_checkpoint: str | None = None
    async for r in chain_records(session, tenant):
        where = f"record {seq}"
        follows(tenant, chained(r), seq, prev, where)
        row_id = (r.source, r.source_id)
        fact = json.loads(r.record)["fact"]
        if row_id in latest:
            why = reopened(r.source, latest[row_id], fact) or fixed_change(r.source, first[row_id], fact)
            if why is not None:
                raise Broken(f"{where} ({r.source} {r.source_id})", why)
        if row_id not in first or new_epoch(r.source, first[row_id], fact):
            first[row_id] = fact
        latest[row_id] = fact
        last[row_id] = (r.seq, r.fact_sha256)
        if checkpoint is not None and r.seq == checkpoint.seq:
            at_checkpoint = r.hash
        prev, seq = r.hash, seq + 1
    if checkpoint is not None:
        reaches(checkpoint, at_checkpoint, seq - 1)
    for (source, source_id), (at, digest) in sorted(last.items(), key=lambda item: item[1][0]):
        model = CHAINED.get(source)
        where = f"record {at} ({source} {source_id})"
        if model is None:
            raise Broken(where, f"{source} is not a table of the audit")
        row = await session.get(model, tuple(json.loads(source_id)), populate_existing=True)
        if row is None:
            raise Broken(where, "the row was deleted")
        fact = fact_of(row)
        now = fact_digest(fact)
        if now != digest and now != await last_fact(session, tenant, source, source_id):
            raise Broken(where, "the row was changed")
        why = fixed_change(source, first[(source, source_id)], fact)
        if why is not None:
            raise Broken(where, why)
    await unchained_rows(session, tenant, set(last))
    return seq - 1


# When a row of a table of the audit was written, where it is not `created_at`.
WRITTEN_AT = {"approval_requests": "requested_at", "draft_edits": "edited_at"}


async def unchained_rows(session: AsyncSession, tenant: str, chained_ids: set[tuple[str, str]]) -> None:
    """Raises Broken naming the first row of the tenant in a table of the audit that no record of
    the chain holds, though it was written after the table's first chained row: its record was
    removed (say, with the newest records of the chain), or the row was written behind
    Countersign's back. Rows older than a table's first chained row were written before chaining
    began (migration 0023) and are left alone: ids and request times only grow."""
    began = await session.scalar(
        select(func.min(AuditChainRecord.created_at)).where(AuditChainRecord.tenant_id == tenant)
    )
    if began is None:
        return  # an empty chain: the checkpoint's to find, if it was not always empty
    for source, model in CHAINED.items():
        keys = list(inspect(model).primary_key)
        ids = [json.loads(source_id) for s, source_id in chained_ids if s == source]
        written: Any = getattr(model, WRITTEN_AT.get(source, "created_at"))
        newer: ColumnElement[bool] = written >= began  # written after the chain began
        if ids and source == "approval_requests":  # or after the table's first chained row
            requests = tuple_(ApprovalRequest.conversation_id, ApprovalRequest.call_id)
            first_asked = select(func.min(written)).where(requests.in_([tuple(i) for i in ids]))
            newer = written >= first_asked.scalar_subquery()
        elif ids:
            newer = keys[0] >= min(i[0] for i in ids)
        rows = await session.execute(
            select(*keys).where(model.tenant_id == tenant, newer).order_by(*keys)  # type: ignore[attr-defined]
        )
        for values in rows:
            source_id = canonical([jsonable(v) for v in values])
            if (source, source_id) not in chained_ids:
                raise Broken(
                    f"{source} {source_id}",
                    "the row has no record in the chain (its record was removed, or the row was "
                    "written behind Countersign's back)",
                )


async def chain_head(session: AsyncSession, tenant: str) -> tuple[int, str]:
    """The number and hash of the tenant's newest record ((0, GENESIS) before the first)."""
    seq, prev = await next_link(session, tenant)
    return seq - 1, prev


async def export_bundle(
    session: AsyncSession, key: Ed25519PrivateKey, tenant: str, now: datetime, since: datetime | None = None
) -> tuple[bytes, bytes]:
    """The tenant's chain (from `since`) as a bundle: the records file and its signed manifest
    (countersign.core.evidence)."""
    records = [chained(r) async for r in chain_records(session, tenant, since)]
    if records:
        first_seq, anchor = records[0].seq, records[0].prev_hash
    else:  # nothing since: the bundle is empty, anchored at the head
        first_seq, anchor = await next_link(session, tenant)
    lines = "".join(bundle_line(c) + "\n" for c in records).encode()
    manifest = manifest_of(key, tenant, lines, records, anchor, first_seq, now, since)
    return lines, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
