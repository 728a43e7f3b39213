"""The reviewer's client: find pending approvals, decide them, answer questions.

A decision goes through the conversation client (countersign.cli.conversation_client): in names
mode the `decide` update, so a refused decision (not allowed, already decided, expired, unknown
call) exits non-zero with the workflow's reason; in signed mode the server, which proves who decided.
"""

from __future__ import annotations

import json
from typing import Any

import click
from pydantic import ValidationError
from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.client import Client

from countersign.cli.app import cli, print_json, run
from countersign.cli.conversation_client import ConversationClient, conversation_client
from countersign.cli.conversations import connected
from countersign.cli.stack_client import query_status
from countersign.cli.ux import relative, with_session
from countersign.core.approvals import Approval, Decision
from countersign.core.bounds import DuplicateKey, loads_strict
from countersign.core.effects import Effect, effect_shown, effect_text, effect_warnings
from countersign.core.grants import MAX_GRANT_MINUTES, MAX_GRANT_USES, GrantTerms
from countersign.core.shown import Folded, argument_text, argument_warnings, folded
from countersign.db.quorum import quorums_said
from countersign.db.schema import ApprovalRequest


async def pending_approvals(client: Client, tenant: str | None) -> list[dict[str, Any]]:
    """Pending approvals across conversations, found through the AgentStatus search attribute."""
    query = "AgentStatus = 'awaiting_approval' AND ExecutionStatus = 'Running'"
    if tenant:
        query += f" AND TenantId = '{tenant}'"
    rows = []
    async for execution in client.list_workflows(query):
        status = await query_status(client.get_workflow_handle(execution.id))
        rows += [
            {
                "workflow_id": execution.id,
                "tenant_id": status.tenant_id,
                "agent": status.agent,
                **p.model_dump(),
            }
            for p in status.pending_approvals
        ]
    return rows


Recorded = tuple[Effect, str]  # an effect and its digest, as approval_requests holds them


async def recorded_effects(rows: list[dict[str, Any]]) -> dict[tuple[str, str], Recorded]:
    """The effects the worker recorded for these pending calls (approval_requests), by (workflow id,
    call id); a request from before effects has none."""
    if not rows:
        return {}

    async def read(session: AsyncSession) -> dict[tuple[str, str], Recorded]:
        keys = [(r["workflow_id"], r["call_id"]) for r in rows]
        found = await session.execute(
            select(
                ApprovalRequest.workflow_id,
                ApprovalRequest.call_id,
                ApprovalRequest.effect,
                ApprovalRequest.effect_sha256,
            )
            .where(
                tuple_(ApprovalRequest.workflow_id, ApprovalRequest.call_id).in_(keys),
                ApprovalRequest.state == "pending",
                ApprovalRequest.effect.is_not(None),
            )
            .order_by(ApprovalRequest.requested_at)  # the latest instance's request last, and kept
        )
        return {
            (wf, call): (Effect.model_validate(effect), digest or "") for wf, call, effect, digest in found
        }

    return await with_session(read)


async def recorded_quorums(rows: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """How far each of these pending calls' quorum is (countersign.db.quorum.quorum_said: who
    approved so far, why, how many more), by (workflow id, call id); a call one approver decides
    is missing."""
    keys = [(r["workflow_id"], r["call_id"]) for r in rows]

    async def read(session: AsyncSession) -> dict[tuple[str, str], str]:
        requests = list(
            await session.scalars(
                select(ApprovalRequest)
                .where(
                    tuple_(ApprovalRequest.workflow_id, ApprovalRequest.call_id).in_(keys),
                    ApprovalRequest.state == "pending",
                )
                .order_by(ApprovalRequest.requested_at)  # the latest instance's request last, and kept
            )
        )
        said = await quorums_said(session, requests)
        return {
            (r.workflow_id, r.call_id): said[(r.conversation_id, r.call_id)]
            for r in requests
            if (r.conversation_id, r.call_id) in said
        }

    return await with_session(read) if keys else {}


def shown_pending(row: dict[str, Any], effect: Effect | None, quorum: str = "") -> str:
    """One pending call as `approvals list` prints it: what it will do first, then its arguments;
    a long line folded, with the command that prints it whole (`approvals show`)."""
    shown = effect_shown(effect) if effect else Folded(lines=[])
    args = folded(argument_text(row["args"]))
    return (
        f"{row['workflow_id']}  {row['call_id']}  {row['tool']}\n"
        + described(shown.lines, args.lines, effect, row["args"])
        + (folded_hint(row["workflow_id"], row["call_id"]) if shown.folds or args.folds else "")
        + f"    risk {row['risk']} · requested by {row['requested_by']} {relative(row['requested_at'])}"
        f" · expires {relative(row['expires_at'])}"
        + (f"\n    {quorum}" if quorum else "")
        + (f"\n    {row['hints']}" if row.get("hints") else "")
    )


def folded_hint(workflow_id: str, call_id: str) -> str:
    return f"    folded lines: `approvals show {workflow_id} {call_id}` prints them whole\n"


def effect_block(effect: Effect, workflow_id: str, call_id: str) -> str:
    """What a pending call will do, as `chat` prints it under the call: its lines (long ones folded,
    with the command that prints them whole) and what to check in it."""
    shown = effect_shown(effect)
    return (
        "".join(f"    {line}\n" for line in shown.lines)
        + "".join(f"    ⚠ {w}\n" for w in effect_warnings(effect))
        + (folded_hint(workflow_id, call_id) if shown.folds else "")
    )


def described(does: list[str], args: list[str], effect: Effect | None, arguments: str) -> str:
    """A call's lines as the CLI prints them: what it will do, its arguments, what to check."""
    found = (effect_warnings(effect) if effect else []) + argument_warnings(arguments)
    return (
        "".join(f"    {line}\n" for line in does)
        + ("    arguments:\n" if does else "")
        + "".join(f"    {'  ' if does else ''}{line}\n" for line in args)
        + "".join(f"    ⚠ {w}\n" for w in found)
    )


def shown_whole(row: ApprovalRequest, effect: Effect | None) -> str:
    """One recorded approval request as `approvals show` prints it: every line whole, and each
    message's HTML source after its lines."""
    sources = "".join(
        f"    HTML source of the {m.channel} to {', '.join(m.to)}:\n"
        + "".join(f"      {line}\n" for line in m.html.split("\n"))
        for m in (effect.messages if effect else [])
        if m.html is not None
    )
    return (
        f"{row.workflow_id}  {row.call_id}  {row.tool}  ({row.state})\n"
        + described(effect_text(effect) if effect else [], argument_text(row.args), effect, row.args)
        + sources
        + f"    risk {row.risk} · requested by {row.requested_by} at {row.requested_at.isoformat()}"
    )


def parse_args(text: str | None) -> dict[str, object] | None:
    if text is None:
        return None
    try:
        value = loads_strict(text)
    except DuplicateKey as err:
        raise click.BadParameter(f"--args: {err}") from err
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"--args is not JSON: {err.msg}") from err
    if not isinstance(value, dict):
        raise click.BadParameter("--args must be a JSON object")
    return value


@cli.group()
def approvals() -> None:
    """Pending approvals across conversations."""


def grant_terms(minutes: int | None, uses: int | None) -> GrantTerms | None:
    """The grant `--grant-minutes` and `--grant-uses` ask for: both or neither, within the bounds."""
    if minutes is None and uses is None:
        return None
    if minutes is None or uses is None:
        raise click.UsageError("a grant needs both --grant-minutes and --grant-uses")
    try:
        return GrantTerms(minutes=minutes, uses=uses)
    except ValidationError:
        raise click.UsageError(
            f"a grant lasts 1 to {MAX_GRANT_MINUTES} minutes and 1 to {MAX_GRANT_USES} uses"
        ) from None


@approvals.command("list")
@click.option("--tenant", help="Only this tenant's conversations.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_approvals(tenant: str | None, as_json: bool) -> None:
    """List calls waiting for a decision: what each will do (its effect: records changed, before
    and after; messages as they will be sent), then tool, arguments, risk, requester, age, expiry."""

    async def body() -> None:
        client, _ = await connected()
        rows = await pending_approvals(client, tenant)
        effects, quorums = await recorded_effects(rows), await recorded_quorums(rows)
        if as_json:
            for r in rows:
                effect, digest = effects.get((r["workflow_id"], r["call_id"]), (None, ""))
                r["effect"] = effect.model_dump(mode="json") if effect else None
                r["effect_digest"] = digest
                r["quorum_said"] = quorums.get((r["workflow_id"], r["call_id"]), "")
            print_json(rows)
            return
        if not rows:
            click.echo("nothing pending")
        for r in rows:
            key = (r["workflow_id"], r["call_id"])
            click.echo(shown_pending(r, effects.get(key, (None, ""))[0], quorums.get(key, "")))

    run(body())


@approvals.command("show")
@click.argument("workflow_id")
@click.argument("call_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show_approval(workflow_id: str, call_id: str, as_json: bool) -> None:
    """Show one call's approval request whole: what it will do and its arguments, every line in
    full (`approvals list` folds long ones), and each message's HTML source."""

    async def read(session: AsyncSession) -> ApprovalRequest | None:
        return await session.scalar(
            select(ApprovalRequest)
            .where(ApprovalRequest.workflow_id == workflow_id, ApprovalRequest.call_id == call_id)
            .order_by(ApprovalRequest.requested_at.desc())  # the latest instance's request
            .limit(1)
        )

    row = run(with_session(read))
    if row is None:
        raise click.ClickException(f"no approval request for call {call_id} in {workflow_id}")
    effect = Effect.model_validate(row.effect) if row.effect is not None else None
    if as_json:
        print_json(
            {
                "workflow_id": row.workflow_id,
                "call_id": row.call_id,
                "tool": row.tool,
                "args": row.args,
                "state": row.state,
                "effect": effect.model_dump(mode="json") if effect else None,
                "effect_digest": row.effect_sha256 or "",
                "effect_lines": effect_text(effect) if effect else [],
                "arg_lines": argument_text(row.args),
            }
        )
        return
    click.echo(shown_whole(row, effect))


@cli.command()
@click.argument("workflow_id")
@click.argument("call_id", required=False)
@click.option("--all", "approve_all", is_flag=True, help="Approve every pending call of the conversation.")
@click.option("--as", "approver", required=True, help="Who approves (verified against the database).")
@click.option("--reason", help="Why.")
@click.option("--args", "args_json", help="Edited arguments as JSON (validated again).")
@click.option("--grant-minutes", type=int, help="Grant the same again for this long (with --grant-uses).")
@click.option("--grant-uses", type=int, help="…and at most this many calls (whichever ends first).")
def approve(
    workflow_id: str,
    call_id: str | None,
    approve_all: bool,
    approver: str,
    reason: str | None,
    args_json: str | None,
    grant_minutes: int | None,
    grant_uses: int | None,
) -> None:
    """Approve a pending call (or --all of them) and show what was recorded.

    With --grant-minutes M --grant-uses N, later calls of the same tool by the same requester in the
    same agent with the same arguments (the tool's free ones aside) run without asking, for M minutes
    or N calls, whichever ends first (at most 10080 minutes and 100 calls)."""
    if bool(call_id) == approve_all:
        raise click.UsageError("give a CALL_ID or --all")
    if approve_all and args_json:
        raise click.UsageError("--args edits one call: name its CALL_ID")
    if approve_all and (grant_minutes or grant_uses):
        raise click.UsageError("a grant comes with one approval: name its CALL_ID")
    edited = parse_args(args_json)
    grant = grant_terms(grant_minutes, grant_uses)

    async def body() -> None:
        client = conversation_client(approver, workflow_id=workflow_id)  # signed: the server proves who
        for cid in [call_id] if call_id else await client.approvable(workflow_id, approver):
            decision = Decision(
                call_id=cid, decision="approve", approver=approver, reason=reason, args=edited, grant=grant
            )
            approval = await client.decide(workflow_id, decision)
            granted = f", granted for {grant.minutes} min or {grant.uses} use(s)" if grant else ""
            click.echo(f"approved {cid}: {approval.tool} {decided(approval)}{proven(client)}{granted}")

    run(body())


def decided(approval: Approval) -> str:
    """ "by bob" once decided; a quorum's approval that is not the last says how far it is
    ("(1 of 2 approved (bob); 1 more approval needed)"), never "by None"."""
    return f"by {approval.decided_by}" if approval.decided_by else f"({approval.outcome()})"


@cli.command()
@click.argument("workflow_id")
@click.argument("call_id")
@click.option("--as", "approver", required=True, help="Who rejects.")
@click.option("--reason", help="Why (the agent is told).")
def reject(workflow_id: str, call_id: str, approver: str, reason: str | None) -> None:
    """Reject a pending call; the agent is told it was rejected, and why."""

    async def body() -> None:
        client = conversation_client(approver, workflow_id=workflow_id)
        decision = Decision(call_id=call_id, decision="reject", approver=approver, reason=reason)
        approval = await client.decide(workflow_id, decision)
        click.echo(f"rejected {call_id}: {approval.tool} {decided(approval)}{proven(client)}")

    run(body())


def proven(client: ConversationClient) -> str:
    return " (proven)" if client.proven else ""


@cli.command()
@click.argument("workflow_id")
@click.argument("call_id")
@click.argument("text")
@click.option("--as", "user", required=True, help="The conversation's user.")
def answer(workflow_id: str, call_id: str, text: str, user: str) -> None:
    """Answer a question the agent asked (ask_human)."""

    async def body() -> None:
        client = conversation_client(user)  # signed: the server sends it, proving who answered
        status = await client.status(workflow_id)
        if call_id not in {q.call_id for q in status.pending_questions}:
            raise click.ClickException(f"{workflow_id} has no open question {call_id}")
        await client.answer(workflow_id, call_id=call_id, user=user, text=text)
        click.echo(f"answered {call_id}")

    run(body())


approvals.add_command(approve)  # `approvals approve …` is `approve …`
