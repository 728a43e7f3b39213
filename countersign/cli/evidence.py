"""`audit export` and `audit verify`: the tenant's audit as evidence an auditor can check alone.

A bundle (countersign.core.evidence) is a directory holding `records.jsonl` and `manifest.json`, or
a tar archive of the two (what the inbox's admin export downloads); `audit verify PATH` reads
either, with nothing but the bundle: the manifest carries the public half of the key that signed it.
"""

from __future__ import annotations

import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from countersign.cli.app import run
from countersign.cli.records import audit
from countersign.cli.ux import shown_path, with_session
from countersign.core.evidence import MANIFEST_FILE, RECORDS_FILE, Broken, verify_bundle
from countersign.runtime.config import load_settings


@audit.command("export")
@click.option("--tenant", required=True, help="The tenant whose audit to export.")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="A new directory.")
@click.option("--since-days", type=click.IntRange(min=1), help="Only the records of the last N days.")
def export(tenant: str, out: Path, since_days: int | None) -> None:
    """Write the tenant's chained audit and its signed manifest to the directory OUT.

    Signed with the deployment's key (COUNTERSIGN_PROOF_PRIVATE_KEY, the inbox's; else the
    embedded stack's): run it where the inbox runs."""
    from countersign.db.chain import export_bundle
    from countersign.identity.proofs import load_private_key

    if out.exists() and any(out.iterdir()):
        raise click.ClickException(f"{shown_path(out)} exists and is not empty: name a new directory")
    key = load_private_key(load_settings().proof_private_key)
    now = datetime.now(UTC)
    since = now - timedelta(days=since_days) if since_days else None
    records, manifest = run(with_session(lambda session: export_bundle(session, key, tenant, now, since)))
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORDS_FILE).write_bytes(records)
    (out / MANIFEST_FILE).write_bytes(manifest)
    count = records.count(b"\n")
    click.echo(
        f"{count} records of {tenant} written to {shown_path(out)}; check them with `audit verify {out}`"
    )


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
def verify(path: Path | None, tenant: str | None) -> None:
    """Check a bundle offline (PATH), or the tenant's live chain (--tenant): exit 0 when whole,
    else 1, naming the first record that does not verify."""
    if (path is None) == (tenant is None):
        raise click.UsageError("give a bundle's PATH, or --tenant T for the chain in PostgreSQL")
    try:
        if path is not None:
            manifest = verify_bundle(*read_bundle(path))
            click.echo(
                f"bundle of {manifest['tenant']} verifies: {manifest['count']} records "
                f"(from {manifest['first_seq']}), signed by the key it carries"
            )
        else:
            from countersign.db.chain import verify_live

            assert tenant is not None
            count = run(with_session(lambda session: verify_live(session, tenant)))
            click.echo(f"chain of {tenant} verifies: {count} records, every chained row as recorded")
    except Broken as broken:
        raise click.ClickException(str(broken)) from None
