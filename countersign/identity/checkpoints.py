"""Signed checkpoints of each tenant's chain head, kept outside the database.

The hash chain (countersign.db.chain) proves that no record in it was changed or removed from its
middle, but someone who can write to PostgreSQL can remove its newest records (with their rows) and
leave a shorter chain that is whole. A checkpoint is the head as the deployment saw it, signed with
its key (countersign.core.evidence.Checkpoint) and written where the database's users cannot reach:
a directory the operator names (COUNTERSIGN_CHECKPOINT_DIR; a mounted volume or a synced folder of
an object store), in a folder per signing key and tenant. `audit verify --tenant` then checks that
the chain still reaches the latest one.

Written at every export (the CLI's and the inbox's) and every few minutes by the server
(COUNTERSIGN_CHECKPOINT_INTERVAL_S, default 300) for each tenant whose head moved. A new checkpoint
is written only while the chain still reaches the latest: after a truncation, the evidence of the
head that was removed is kept, never replaced by the shorter chain's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from countersign.core.evidence import (
    Broken,
    Checkpoint,
    checkpoint_text,
    fingerprint,
    reaches,
    read_checkpoint,
)
from countersign.db.chain import chain_head
from countersign.db.schema import AuditChainRecord, Tenant
from countersign.identity.proofs import load_private_key, load_public_key
from countersign.runtime.config import Settings

SUFFIX = ".checkpoint.json"
log = logging.getLogger(__name__)


def tenant_dir(directory: Path, key: Ed25519PublicKey, tenant: str) -> Path:
    """The folder of one tenant's checkpoints signed by `key`: a series per key (after a key
    rotation, the new key starts its own), and tenant ids are slugs, safe as a folder name."""
    return directory / fingerprint(key).removeprefix("SHA256:")[:32] / tenant


def latest(directory: Path, tenant: str, key: Ed25519PublicKey) -> Checkpoint | None:
    """The tenant's checkpoint with the furthest head, verified with the deployment's `key`
    (raises Broken for a file that is not one the deployment signed), or None before the first."""
    folder = tenant_dir(directory, key, tenant)
    found = sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []
    if not found:
        return None
    checkpoint = read_checkpoint(found[-1].read_bytes(), key)
    if checkpoint.tenant != tenant:
        raise Broken("the checkpoint", f"{found[-1].name} is {checkpoint.tenant}'s, not {tenant}'s")
    return checkpoint


async def hash_at(session: AsyncSession, tenant: str, seq: int) -> str | None:
    return await session.scalar(
        select(AuditChainRecord.hash).where(AuditChainRecord.tenant_id == tenant, AuditChainRecord.seq == seq)
    )


async def write_checkpoint(
    session: AsyncSession, key: Ed25519PrivateKey, directory: Path, tenant: str, now: datetime
) -> Checkpoint | None:
    """Sign and write the tenant's head now, unless it is the latest checkpoint's already (None).
    Raises Broken, writing nothing, when the chain no longer reaches the latest checkpoint."""
    seq, head = await chain_head(session, tenant)
    before = latest(directory, tenant, key.public_key())
    if before is not None:
        reaches(before, await hash_at(session, tenant, before.seq), seq)
        if before.seq == seq:
            return None
    checkpoint = Checkpoint(tenant=tenant, seq=seq, hash=head, at=now.isoformat())
    folder = tenant_dir(directory, key.public_key(), tenant)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{seq:020d}{SUFFIX}"  # sorted by name = sorted by head
    tmp = folder / f".{uuid.uuid4().hex}.tmp"
    tmp.write_text(checkpoint_text(key, checkpoint))
    os.replace(tmp, path)  # a reader never sees half a checkpoint
    return checkpoint


async def checkpoint_all(
    session: AsyncSession, key: Ed25519PrivateKey, directory: Path, now: datetime
) -> list[Checkpoint]:
    """A checkpoint of every tenant whose head moved since its latest one. A tenant whose chain no
    longer reaches its latest checkpoint gets none (that checkpoint stays the evidence), logged as
    an error; the others are written."""
    written = []
    for tenant in (await session.scalars(select(Tenant.id).order_by(Tenant.id))).all():
        try:
            checkpoint = await write_checkpoint(session, key, directory, tenant, now)
        except Broken as broken:
            log.error("audit chain of %s: %s (run `audit verify --tenant %s`)", tenant, broken, tenant)
            continue
        if checkpoint is not None:
            written.append(checkpoint)
    return written


async def keep_checkpoints(
    sessions: async_sessionmaker[AsyncSession], key: Ed25519PrivateKey, directory: Path, interval_s: float
) -> None:
    """Every `interval_s` seconds, a checkpoint of every tenant whose head moved (the server runs
    this for as long as it serves). A round that fails (the database out of reach) is logged and
    the next one tries again."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            async with sessions() as session:
                await checkpoint_all(session, key, directory, datetime.now(UTC))
        except Exception:
            log.exception("writing the audit checkpoints failed; trying again in %s s", interval_s)


def deployment_public_key(settings: Settings) -> Ed25519PublicKey:
    """The deployment's public key: the configured one, else the configured signing key's public
    half, else the embedded stack's."""
    if settings.proof_public_key is None and settings.proof_private_key is not None:
        return load_private_key(settings.proof_private_key).public_key()
    return load_public_key(settings.proof_public_key)
