"""`policy apply`, `policy show`, `policy test`: a tenant's Cedar policy set (countersign/db/policies.py).

`policy apply` acts for a tenant admin: named with `--as` on a machine with DATABASE_URL, like
`permissions set --tenant` (checked against the database's roles), or, without `--as`, the
admin `login` signed in, through the server (`PUT /api/policies`, which checks the same). Every
attempt is recorded in the tenant's audit chain.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.session import InboxSession, inbox_request, login_hint, session_file
from countersign.cli.ux import with_session
from countersign.core.cedar_policy import PolicySetError
from countersign.db import schema
from countersign.db.policies import apply_policies, checked_policies, replay, tenant_policies
from tools.policies import tenant_tools


@cli.group()
def policy() -> None:
    """A tenant's Cedar policies: forbid, permit, @approvals("N") quorums, history-aware limits.
    With no policy matching a call, the tiers decide."""


def read_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise click.ClickException(f"cannot read {path}: {err}") from None


def signed_in(tenant: str) -> InboxSession:
    """The CLI's server session (`login`), which must be in `tenant`: the server decides whether
    its person is an admin there."""
    try:
        session = InboxSession.model_validate_json(session_file().read_text())
    except (FileNotFoundError, ValidationError):
        raise click.ClickException(
            f"log in as an admin of {tenant} first ({login_hint(tenant, 'ADMIN')}), or name one with "
            "--as on a machine with DATABASE_URL"
        ) from None
    if session.tenant_id != tenant:
        raise click.ClickException(f"logged in to {session.tenant_id}, not {tenant}")
    return session


async def require_tenant(session: AsyncSession, tenant: str) -> None:
    if await session.get(schema.Tenant, tenant) is None:
        raise click.ClickException(f"no tenant named {tenant!r}")


@policy.command("apply")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--tenant", required=True)
@click.option(
    "--as",
    "changed_by",
    help="The admin of the tenant applying it, straight to the database (audited). Without it: "
    "through the server, as the admin `login` signed in.",
)
@click.option("--shadow", is_flag=True, help="Evaluate it beside the enforced set, changing nothing.")
def apply(file: str, tenant: str, changed_by: str | None, shadow: bool) -> None:
    """Validate FILE against the tenant's tools and install it (an empty FILE removes the set).

    Every call checked or run afterwards is decided by it, in every conversation however old
    (activities/rules.py)."""
    text = read_file(file)
    kind = "shadow" if shadow else "enforced"
    if changed_by is None:  # the person `login` signed in, through the server (which checks)
        session = signed_in(tenant)
        applied = run(inbox_request(session, "PUT", "/api/policies", {"text": text, "shadow": shadow}))
        click.echo(f"{tenant}: {kind} policy set version {applied['version']} applied by {session.user_id}")
        return

    async def attempt(session: AsyncSession) -> schema.PolicyChange:
        await require_tenant(session, tenant)
        return await apply_policies(
            session,
            tenant_id=tenant,
            text=text,
            shadow=shadow,
            changed_by=changed_by,
            via="cli",
            tools=await tenant_tools(session, tenant),
        )

    change = run(with_session(attempt))
    if not change.accepted:
        raise click.ClickException(f"refused (recorded): {change.reason}")
    click.echo(f"{tenant}: {kind} policy set version {change.version} applied by {changed_by}")


@policy.command("show")
@click.option("--tenant", required=True)
@click.option("--json", "as_json", is_flag=True)
def show(tenant: str, as_json: bool) -> None:
    """The tenant's enforced and shadow sets: version, who applied them, when, and the text."""

    async def read(session: AsyncSession) -> dict[str, Any]:
        await require_tenant(session, tenant)
        sets = await tenant_policies(session, tenant)
        return {
            mode: {
                "version": row.version,
                "applied_by": row.applied_by,
                "applied_at": row.applied_at.isoformat(),
                "sha256": row.sha256,
                "text": row.text,
            }
            for mode, row in sets.items()
        }

    sets = run(with_session(read))
    if as_json:
        print_json({"tenant": tenant, **sets})
        return
    if not sets:
        click.echo(f"{tenant}: no policies (the tiers decide every call)")
    for mode, shown in sets.items():
        click.echo(
            f"{mode}: version {shown['version']}, applied by {shown['applied_by']} at {shown['applied_at']}"
        )
        click.echo(shown["text"].rstrip())


@policy.command("test")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--tenant", required=True)
@click.option("--since-days", type=click.IntRange(1, 90), default=7, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def test(file: str, tenant: str, since_days: int, as_json: bool) -> None:
    """Replay the tenant's recorded calls of the last days, and those waiting for an approval,
    against FILE (changing nothing) and print each call whose decision would differ from the
    enforced set's (or the tiers'). Each call is replayed with its requester's roles as recorded at
    the call (those recorded before roles were, and the waiting ones, with today's)."""
    text = read_file(file)

    async def replayed(session: AsyncSession) -> dict[str, Any]:
        await require_tenant(session, tenant)
        tools = await tenant_tools(session, tenant)
        try:
            candidate = await checked_policies(text, tools)
        except PolicySetError as err:
            raise click.ClickException(f"not valid: {err}") from None
        since = datetime.now(UTC) - timedelta(days=since_days)
        return await replay(session, tenant_id=tenant, candidate=candidate, tools=tools, since=since)

    report = run(with_session(replayed))
    if as_json:
        print_json(report)
        return
    changed = report["changed"]
    click.echo(f"{report['replayed']} recorded calls replayed; {len(changed)} would be decided otherwise")
    if report["with_roles_today"]:
        click.echo(
            f"{report['with_roles_today']} of them recorded before roles were: replayed with their "
            "requester's roles today (the others with the roles recorded at the call)"
        )
    for c in changed:
        roles = f"roles {', '.join(c['roles']) or 'none'} {c['roles_as']}"
        click.echo(
            f"  {c['at']} {c['tool']} by {c['requested_by']} ({roles}; {c['workflow_id']} {c['call_id']}, "
            f"was {c['outcome']}): {described(c['enforced'])} -> {described(c['candidate'])}"
        )


def described(decision: dict[str, Any]) -> str:
    """A decision in a few words: "forbid by no-competitors", "2 approvers by two-for-refunds"."""
    outcome = decision["outcome"]
    if outcome == "no_match":
        return "tiers"
    what = {"forbid": "forbid", "permit_run": "run"}.get(outcome) or f"{decision['approvals']} approvers"
    return f"{what} by {decision.get('policy')}"
