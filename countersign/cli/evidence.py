"""`audit export` and `audit verify`: the tenant's audit as evidence an auditor can check alone.

A bundle (countersign.core.evidence) is a directory holding `records.jsonl` and `manifest.json`, or
a tar archive of the two (what the inbox's admin export downloads); `audit verify PATH` reads
either, with nothing but the bundle: the manifest carries the public half of the key that signed it.
"""

from __future__ import annotations

import json
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import run
from countersign.cli.records import audit
from countersign.cli.ux import shown_path, with_session
from countersign.core.evidence import (
    MANIFEST_FILE,
    RECORDS_FILE,
    Broken,
    Checkpoint,
    fingerprint,
    manifest_key,
    public_pem,
    verify_bundle,
)
from countersign.runtime.config import load_settings


@audit.command("export")
@click.option("--tenant", required=True, help="The tenant whose audit to export.")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="A new directory.")
@click.option("--since-days", type=click.IntRange(min=1), help="Only the records of the last N days.")
def export(tenant: str, out: Path, since_days: int | None) -> None:
    """Write the tenant's chained audit and its signed manifest to the directory OUT, and a signed
    checkpoint of its head to COUNTERSIGN_CHECKPOINT_DIR.

    Signed with the deployment's key (COUNTERSIGN_PROOF_PRIVATE_KEY, the inbox's; else the
    embedded stack's): run it where the inbox runs."""
    from countersign.db.chain import export_bundle
    from countersign.identity.checkpoints import write_checkpoint
    from countersign.identity.proofs import load_private_key

    if out.exists() and any(out.iterdir()):
        raise click.ClickException(f"{shown_path(out)} exists and is not empty: name a new directory")
    settings = load_settings()
    key = load_private_key(settings.proof_private_key)
    now = datetime.now(UTC)
    since = now - timedelta(days=since_days) if since_days else None

    async def exported(session: AsyncSession) -> tuple[bytes, bytes, str | None]:
        records, manifest = await export_bundle(session, key, tenant, now, since)
        try:
            await write_checkpoint(session, key, settings.checkpoint_dir, tenant, now)
        except Broken as broken:
            return records, manifest, str(broken)
        return records, manifest, None

    records, manifest, broken = run(with_session(exported))
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORDS_FILE).write_bytes(records)
    (out / MANIFEST_FILE).write_bytes(manifest)
    count = records.count(b"\n")
    click.echo(
        f"{count} records of {tenant} written to {shown_path(out)}; check them with "
        f"`audit verify {out} --fingerprint {fingerprint(key.public_key())}`"
    )
    if broken is not None:
        raise click.ClickException(
            f"the chain of {tenant} no longer reaches its latest checkpoint ({broken}): no new "
            f"checkpoint written; run `audit verify --tenant {tenant}`"
        )


@audit.command("key")
@click.option("--json", "as_json", is_flag=True, help="Print {public_key, fingerprint} as JSON.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the PEM to this file; print the fingerprint.",
)
def key(as_json: bool, out: Path | None) -> None:
    """Print the deployment's public key (PEM) and its fingerprint: what an auditor pins with
    `audit verify PATH --key FILE` or `--fingerprint`, so a bundle signed by any other key fails."""
    from countersign.identity.checkpoints import deployment_public_key

    public = deployment_public_key(load_settings())
    if out is not None:
        out.write_text(public_pem(public))
        click.echo(f"{shown_path(out)}: the deployment's public key, fingerprint {fingerprint(public)}")
        return
    if as_json:
        click.echo(json.dumps({"public_key": public_pem(public), "fingerprint": fingerprint(public)}))
        return
    click.echo(public_pem(public), nl=False)
    click.echo(f"fingerprint: {fingerprint(public)}")


@audit.command("checkpoint")
@click.option("--tenant", help="Only this tenant (default: every tenant whose head moved).")
def checkpoint(tenant: str | None) -> None:
    """Sign the head of each tenant's chain and write it to COUNTERSIGN_CHECKPOINT_DIR (the server
    does so every few minutes; this is for a cron job, or before a risky change)."""
    from countersign.identity.checkpoints import checkpoint_all, write_checkpoint
    from countersign.identity.proofs import load_private_key

    settings = load_settings()
    signing = load_private_key(settings.proof_private_key)
    now = datetime.now(UTC)
    directory = settings.checkpoint_dir

    async def written_now(session: AsyncSession) -> list[Checkpoint]:
        try:
            if tenant is None:
                return await checkpoint_all(session, signing, directory, now)
            one = await write_checkpoint(session, signing, directory, tenant, now)
        except Broken as broken:
            raise click.ClickException(f"no checkpoint written: {broken}") from None
        return [one] if one is not None else []

    written = run(with_session(written_now))
    for c in written:
        click.echo(f"checkpoint of {c.tenant}: record {c.seq} ({c.hash[:16]}…) in {shown_path(directory)}")
    if not written:
        click.echo("no head moved since its latest checkpoint: nothing written")


def read_bundle(path: Path) -> tuple[bytes, bytes]:
    """(manifest, records) of the bundle at `path`: a directory, or a tar archive of one."""
    if path.is_dir():
        files = {name: path / name for name in (MANIFEST_FILE, RECORDS_FILE)}
        missing = [name for name, p in files.items() if not p.is_file()]
        if missing:
            raise click.ClickException(f"{shown_path(path)} holds no {', '.join(missing)}: not a bundle")
        return files[MANIFEST_FILE].read_bytes(), files[RECORDS_FILE].read_bytes()
    try:
        with tarfile.open(path) as archive:
            found = {}
            for name in (MANIFEST_FILE, RECORDS_FILE):
                member = archive.extractfile(name)
                if member is None:
                    raise KeyError(name)
                found[name] = member.read()
    except (OSError, tarfile.TarError, KeyError) as exc:
        raise click.ClickException(f"{shown_path(path)} is not a bundle ({exc})") from None
    return found[MANIFEST_FILE], found[RECORDS_FILE]


@audit.command("verify")
@click.argument("path", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("--tenant", help="Check the tenant's chain in PostgreSQL instead, and its rows.")
@click.option(
    "--key",
    "key_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The deployment's public key (PEM, as `audit key` prints it): refuse a bundle signed by another.",
)
@click.option(
    "--fingerprint", "pinned", help="The deployment key's fingerprint (`audit key`), instead of --key."
)
@click.option(
    "--checkpoints",
    type=click.Path(file_okay=False, path_type=Path),
    help="With --tenant: the checkpoints' directory (default COUNTERSIGN_CHECKPOINT_DIR).",
)
def verify(
    path: Path | None, tenant: str | None, key_file: Path | None, pinned: str | None, checkpoints: Path | None
) -> None:
    """Check a bundle offline (PATH), or the tenant's live chain (--tenant): exit 0 when whole,
    else 1, naming the first record that does not verify.

    A bundle is checked against the key pinned with --key or --fingerprint; without one, only its
    integrity is checked, not who signed it. The live chain is checked against the tenant's latest
    signed checkpoint, so records removed from its end are found too."""
    if (path is None) == (tenant is None):
        raise click.UsageError("give a bundle's PATH, or --tenant T for the chain in PostgreSQL")
    if key_file is not None and pinned is not None:
        raise click.UsageError("pin the key with --key or with --fingerprint, not both")
    try:
        if path is not None:
            origin = _pinned_key(key_file) if key_file is not None else pinned
            manifest = verify_bundle(*read_bundle(path), origin=origin)
            carried = fingerprint(manifest_key(manifest))
            said = (
                f"bundle of {manifest['tenant']} verifies: {manifest['count']} records "
                f"(from {manifest['first_seq']})"
            )
            if origin is None:
                click.echo(
                    f"{said}, whole and signed by the key it carries ({carried}); "
                    "its origin is NOT checked: pin the deployment's key with --key FILE or "
                    "--fingerprint (`audit key` prints both)"
                )
            else:
                click.echo(f"{said}, signed by the pinned key {carried}")
        else:
            assert tenant is not None
            _verify_live(tenant, checkpoints)
    except Broken as broken:
        raise click.ClickException(str(broken)) from None


def _pinned_key(path: Path) -> Ed25519PublicKey:
    try:
        loaded = serialization.load_pem_public_key(path.read_bytes())
    except (ValueError, TypeError, OSError) as exc:
        raise click.BadParameter(
            f"{shown_path(path)} is not a PEM public key ({exc})", param_hint="--key"
        ) from None
    if not isinstance(loaded, Ed25519PublicKey):
        raise click.BadParameter(f"{shown_path(path)} is not an Ed25519 public key", param_hint="--key")
    return loaded


def _verify_live(tenant: str, directory: Path | None) -> None:
    from countersign.db.chain import verify_live
    from countersign.identity.checkpoints import deployment_public_key, latest

    settings = load_settings()
    directory = directory or settings.checkpoint_dir
    checkpoint = latest(directory, tenant, deployment_public_key(settings))
    count = run(with_session(lambda session: verify_live(session, tenant, checkpoint)))
    said = f"chain of {tenant} verifies: {count} records, every chained row as recorded"
    if checkpoint is None:
        click.echo(
            f"{said}; no checkpoint of {tenant} in {shown_path(directory)}, so records removed from "
            "the end of the chain cannot be seen (`audit checkpoint` writes one)"
        )
    else:
        click.echo(f"{said}, reaching its checkpoint of {checkpoint.at} (record {checkpoint.seq})")
