"""`grants list | revoke`: the grants reviewers made with their approvals (countersign.core.grants).

`list` reads the tenant's grants from PostgreSQL (an operator's view, like `tokens list`). `revoke`
is a person's act, for an admin of the grant's tenant or the approver who made it: through the
conversation client (signed: the server, with the session `login` keeps; names: the name given,
checked against the database).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.records import table
from countersign.cli.ux import with_session
from countersign.db.grants import grant_view, grants_of


@cli.group()
def grants() -> None:
    """Grants: an approval's "the same again, for a while", listed and revoked."""


@grants.command("list")
@click.option("--tenant", required=True, help="The tenant whose grants to list.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_grants(tenant: str, as_json: bool) -> None:
    """List the tenant's grants, newest first: what each covers, who granted it, what is left."""

    async def work(session: AsyncSession) -> list[dict[str, Any]]:
        now = datetime.now(UTC)
        return [grant_view(g, now) for g in await grants_of(session, tenant)]

    rows = run(with_session(work))
    if as_json:
        print_json(rows)
        return
    header = ("id", "tool", "requester", "agent", "approver", "uses left", "expires", "state", "arguments")
    cells = [
        (str(r["id"]), r["tool"], r["requester"], r["agent"], r["approver"], f"{r['uses_left']}/{r['uses']}",
         r["expires_at"][:19], r["state"], r["args"])
        for r in rows
    ]  # fmt: skip
    click.echo(table([header, *cells]) if cells else "no grants")


@grants.command()
@click.argument("grant_id", type=int)
@click.option("--as", "revoker", required=True, help="Who revokes: an admin of its tenant, or its approver.")
def revoke(grant_id: int, revoker: str) -> None:
    """Revoke a grant: it covers nothing from now on (calls it would have covered are asked)."""
    from countersign.cli.conversation_client import conversation_client  # Temporal's client: only here

    grant = run(conversation_client(revoker).revoke_grant(grant_id, revoker))
    covered = f"{grant['tool']} for {grant['requester']}"
    click.echo(f"revoked grant {grant['id']} ({covered}) by {grant['revoked_by']}")
