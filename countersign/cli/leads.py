"""`leads score` (a lead's score and its parts) and `drafts list|show|edit` (what draft_email saved),
for a person at the terminal. Sending a draft is the agent's `send_draft`, which waits for a
reviewer's approval and the undo window: there is no second way out, so no `drafts send` here."""

from __future__ import annotations

import sys
from typing import Any

import click
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.records import table
from countersign.cli.ux import with_session
from countersign.db.leads import current_score
from tools.drafts import (
    DraftDetail,
    DraftEditor,
    DraftState,
    UpdateDraftArgs,
    draft_of,
    drafts_of,
    edit_draft,
)
from tools.leads import lead_by_ref, score_view
from tools.registry import ToolFailure

TENANT = click.option("--tenant", required=True, help="The workspace (tenant id).")
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def failing(exc: ToolFailure) -> click.ClickException:
    return click.ClickException(f"{exc.code}: {exc}")


@cli.group()
def leads() -> None:
    """The workspace's leads: their scores and what makes them up."""


@leads.command("score")
@click.argument("lead")
@TENANT
@AS_JSON
def score(lead: str, tenant: str, as_json: bool) -> None:
    """LEAD's score (its email or id) and the parts it adds up from, as the qualifier agent sees them."""

    async def scored(session: AsyncSession) -> dict[str, Any]:
        try:
            found = await lead_by_ref(session, tenant, lead)
        except ToolFailure as exc:
            raise failing(exc) from exc
        return score_view(found, await current_score(session, found)).model_dump(mode="json")

    view = run(with_session(scored))
    if as_json:
        print_json(view)
        return
    click.echo(f"{view['email']} ({view['status']}): {view['score']}/100")
    click.echo(
        table([("part", "points", "why")] + [(p["name"], str(p["points"]), p["why"]) for p in view["parts"]])
    )


@cli.group()
def drafts() -> None:
    """Email drafts the agents saved: list, read and edit them; ask the agent to send one."""


@drafts.command("list")
@TENANT
@click.option("--state", type=click.Choice(["unsent", "sent", "all"]), default="unsent", show_default=True)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100))
@AS_JSON
def list_drafts(tenant: str, state: DraftState, limit: int, as_json: bool) -> None:
    """The workspace's drafts, newest first."""
    found = run(with_session(lambda s: drafts_of(s, tenant, state, limit))).model_dump(mode="json")["drafts"]
    if as_json:
        print_json(found)
    elif not found:
        click.echo(f"no {state} drafts" if state != "all" else "no drafts")
    else:
        rows = [("id", "to", "subject", "by", "updated", "sent as")] + [
            (str(d["draft_id"]), d["to"], d["subject"], d["created_by"], d["updated_at"][:19],
             str(d["sent_outbox_id"] or "-"))
            for d in found
        ]  # fmt: skip
        click.echo(table(rows))


def show_draft(view: dict[str, Any]) -> None:
    sent = f"sent as email {view['sent_outbox_id']}" if view["sent_outbox_id"] else "not sent"
    click.echo(
        f"draft {view['draft_id']} to {view['to']} ({sent})\nSubject: {view['subject']}\n\n{view['body']}"
    )
    if view["html_body"]:
        click.echo(f"\n[HTML]\n{view['html_body']}")


@drafts.command("show")
@click.argument("draft_id", type=int)
@TENANT
@AS_JSON
def show(draft_id: int, tenant: str, as_json: bool) -> None:
    """One draft in full."""

    async def read(session: AsyncSession) -> dict[str, Any]:
        try:
            draft = await draft_of(session, tenant, draft_id)
            return DraftDetail.model_validate(draft).model_dump(mode="json")
        except ToolFailure as exc:
            raise failing(exc) from exc

    view = run(with_session(read))
    if as_json:
        print_json(view)
    else:
        show_draft(view)


@drafts.command("edit")
@click.argument("draft_id", type=int)
@TENANT
@click.option("--to", "to_address", help="New recipient (a draft about a lead stays the lead's).")
@click.option("--subject", help="New subject (one line).")
@click.option("--body", help="New plain-text body ('-' reads it from stdin).")
@AS_JSON
def edit(
    draft_id: int, tenant: str, to_address: str | None, subject: str | None, body: str | None, as_json: bool
) -> None:
    """Change an unsent draft's recipient, subject or body (checked as draft_email checks them; refused
    while a call that sends it waits for a decision; recorded as the operator's edit)."""
    if body == "-":
        body = sys.stdin.read()
    given = {"to": to_address, "subject": subject, "body": body}
    # the tool's own arguments: the same checks (one-line subject, sizes, an address) and changes
    args = UpdateDraftArgs.model_validate({"draft": draft_id, **{k: v for k, v in given.items() if v}})

    async def change(session: AsyncSession) -> dict[str, Any]:
        try:
            draft = await draft_of(session, tenant, draft_id, lock=True)
            await edit_draft(session, draft, args, DraftEditor(None, "cli"))
        except ToolFailure as exc:
            raise failing(exc) from exc
        return DraftDetail.model_validate(draft).model_dump(mode="json")

    view = run(with_session(change))
    if as_json:
        print_json(view)
    else:
        show_draft(view)
