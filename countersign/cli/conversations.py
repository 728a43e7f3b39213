"""Commands that drive conversations: start, send, status, transcript."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.client import Client

from countersign.cli.app import cli, print_json, run
from countersign.cli.conversation_client import ConversationClient, conversation_client
from countersign.cli.session import signed_hint
from countersign.cli.ux import EXIT_STOPPED, EXIT_WAITING, command, relative, temporal_settings, with_session
from countersign.cli.waiting import SignedHint, ctrl_c, waiting_lines
from countersign.client.handles import render_message, render_transcript
from countersign.client.temporal_client import connect
from countersign.core.contract import (
    WORKFLOW_TYPE,
    Limits,
    StartConversation,
    StatusView,
    SubmitMessage,
    TurnResult,
)
from countersign.core.envelopes import describe_policy
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackRequest, undo_why
from countersign.core.summaries import usage_line
from countersign.db.engine import create_engine
from countersign.db.messages import first_message
from countersign.db.schema import Conversation, RollbackRecord
from countersign.runtime.config import Settings, load_settings
from countersign.runtime.search_attributes import AGENT_NAME, AGENT_STATUS, TENANT_ID

END_WAIT_S = 10.0  # `end` waits this long for the conversation to close before saying it is closing

T = TypeVar("T")


def checked(build: Callable[[], T]) -> T:
    """A payload built from options, or a usage error naming what is out of bounds."""
    try:
        return build()
    except ValidationError as err:
        first = err.errors()[0]
        raise click.BadParameter(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from err


def parse_limits(text: str | None) -> Limits:
    if not text:
        return Limits()
    try:
        return Limits.model_validate_json(text)
    except ValidationError as err:
        raise click.BadParameter(
            f"invalid --limits: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}"
        ) from err


async def connected() -> tuple[Client, Settings]:
    settings = temporal_settings()
    return await connect(settings), settings


@cli.command()
@click.option("--tenant", required=True, help="Tenant slug, e.g. acme.")
@click.option("--user", required=True, help="The user the agent acts for, e.g. alice.")
@click.option("--agent", required=True, help="Agent name, e.g. lead-qualifier.")
@click.option("--message", required=True, help="The first user message.")
@click.option("--limits", "limits_json", help="Limits as JSON, e.g. '{\"max_iterations\": 4}'.")
@click.option("--single-turn", is_flag=True, help="End the conversation after the first turn.")
@click.option(
    "--wait",
    is_flag=True,
    help="Wait for the first turn and print the reply; exit 3 when it waits for an approval or an answer.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def start(
    tenant: str,
    user: str,
    agent: str,
    message: str,
    limits_json: str | None,
    single_turn: bool,
    wait: bool,
    as_json: bool,
) -> None:
    """Start a conversation; prints its workflow id.

    With --wait, also the reply; a turn that waits for a person prints the pending call and the
    command that decides it, and exits with status 3 (Ctrl-C: 130; the conversation goes on).
    """
    conversation = checked(
        lambda: StartConversation(
            tenant_id=tenant,
            user_id=user,
            agent=agent,
            message=message,
            single_turn=single_turn,
            limits=parse_limits(limits_json),
        )
    )

    async def body() -> None:
        client = conversation_client(user, tenant)  # signed: the server starts it, proving who asked
        started = await client.start(conversation)
        with ctrl_c() as interrupted:
            if not as_json:
                click.echo(started.workflow_id)  # at once: the turn may take a while, or wait for a person
            outcome = await client.follow(started, interrupted) if wait else None
        if as_json:
            out = dict(started.shown)
            if isinstance(outcome, TurnResult):
                out["turn"] = outcome.model_dump(mode="json")
            elif isinstance(outcome, StatusView):
                out["waiting"] = outcome.model_dump(mode="json")
            print_json(out)
        elif wait:
            await show_outcome(started.workflow_id, outcome, user, client)
        turn_exit(outcome)

    run(body())


def turn_exit(outcome: TurnResult | StatusView | None) -> None:
    """Exit EXIT_WAITING when the turn waits for a person, EXIT_STOPPED when it stopped short of a
    reply (a limit, an error); return (exit 0) when it completed or was not followed."""
    if isinstance(outcome, StatusView):
        raise SystemExit(EXIT_WAITING)
    if isinstance(outcome, TurnResult) and outcome.stop != "completed":
        raise SystemExit(EXIT_STOPPED)


async def show_outcome(
    workflow_id: str, outcome: TurnResult | StatusView | None, user: str, client: ConversationClient
) -> None:
    """The turn's tool calls with a summary of each result, then the reply, or what the turn waits
    for, who may decide it (by name, where the client can tell) and the commands that let it go on."""
    if outcome is None:
        raise click.ClickException(f"conversation {workflow_id} ended before replying")
    for line in turn_calls(await client.transcript(workflow_id)):
        click.echo(line)
    if isinstance(outcome, StatusView):
        names = await client.deciders(outcome)
        settings = load_settings()
        signed = (
            SignedHint(settings.inbox_url, outcome.tenant_id) if settings.approver_auth == "signed" else None
        )
        for line in waiting_lines(workflow_id, outcome, user, lambda a: names.get(a.call_id, ()), signed):
            click.echo(line)
        awaited = "decision" if outcome.pending_approvals else "answer"
        click.echo(f"the reply follows the {awaited}: `{command()} transcript {workflow_id}` shows it")
    else:
        click.echo(outcome.reply or "(no reply)")


def turn_calls(messages: list[ChatMessage]) -> list[str]:
    """The latest turn's tool calls and result summaries, as the transcript shows them."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    turn = messages[last_user + 1 :]
    answered = {m.tool_call_id for m in turn if m.role == "tool"}  # a pending call is shown as waiting
    lines = []
    for message in turn:
        if message.role == "assistant":
            lines += [f"  → {c.name}({c.arguments}) [{c.id}]" for c in message.tool_calls if c.id in answered]
        elif message.role == "tool":
            lines.append(render_message(message) or "")
    return lines


@cli.command()
@click.argument("target", nargs=-1, required=True)
@click.option("--user", required=True, help="The conversation's user (others are refused).")
@click.option("--tenant", help="With --conversation: the tenant.")
@click.option("--agent", help="With --conversation: the agent that answers a new conversation.")
@click.option(
    "--conversation", "key", help="Address the conversation by a caller's key (starts it if none runs)."
)
@click.option("--no-wait", is_flag=True, help="Send and return without waiting for the reply.")
def send(
    target: tuple[str, ...], user: str, tenant: str | None, agent: str | None, key: str | None, no_wait: bool
) -> None:
    """Send a message and print the agent's reply (exit 3 when the turn waits for a person).

    \b
    send WF TEXT --user U
    send --tenant T --user U --agent A --conversation KEY TEXT
    """
    if key is not None:
        if len(target) != 1 or not tenant or not agent:
            raise click.UsageError("with --conversation give --tenant, --agent and one TEXT")
        workflow_id, text = None, target[0]
    elif len(target) == 2:
        workflow_id, text = target
    else:
        raise click.UsageError("give WF TEXT, or --conversation KEY with TEXT")
    message = checked(lambda: SubmitMessage(user_id=user, text=text, message_id=uuid.uuid4().hex))

    async def body() -> None:
        client = conversation_client(user, tenant)  # signed: the server delivers it, proving who wrote it
        if key is not None:
            assert tenant and agent
            keyed = checked(lambda: StartConversation(tenant_id=tenant, user_id=user, agent=agent))
            sent = await client.send_keyed(keyed, key, message)
        else:
            assert workflow_id is not None
            sent = await client.send(workflow_id, message)
        with ctrl_c() as interrupted:
            click.echo(f"conversation {sent.workflow_id}", err=True)
            if no_wait:
                return
            outcome = await client.follow(sent, interrupted)
        await show_outcome(sent.workflow_id, outcome, user, client)
        turn_exit(outcome)

    run(body())


@cli.command()
@click.argument("workflow_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(workflow_id: str, as_json: bool) -> None:
    """Show a conversation's state, turn, pending approvals, usage and limits."""

    async def body() -> None:
        client = conversation_client()
        view = await client.status(workflow_id)
        used, budget = await client.tokens_today(view.tenant_id)
        if as_json:
            print_json(
                view.model_dump(mode="json") | {"tenant_tokens_today": used, "tenant_tokens_per_day": budget}
            )
            return
        u = view.usage
        click.echo(f"{workflow_id}: {view.state} · turn {view.turn} · {view.tenant_id} · agent {view.agent}")
        click.echo(f"usage: {usage_line(u.model_calls, u.tool_calls, u.total_tokens)}")
        if view.policy is not None:
            click.echo(describe_policy(view.policy))
        click.echo(
            f"tenant {view.tenant_id} today: {used} tokens of {budget if budget else 'no'} daily budget"
        )
        for p in view.pending_approvals:
            click.echo(
                f"pending approval {p.call_id}: {p.tool} {p.args} (risk {p.risk}, expires {p.expires_at})"
                + (f" · {p.hints}" if p.hints else "")
            )
        if view.last_error:
            click.echo(f"last error: {view.last_error}")

    run(body())


@cli.command()
@click.argument("workflow_id")
@click.option("--json", "as_json", is_flag=True, help="Print the messages as JSON.")
def transcript(workflow_id: str, as_json: bool) -> None:
    """Print what was said in a conversation, tool calls and results included."""

    async def body() -> None:
        client = conversation_client()
        messages = await client.transcript(workflow_id)
        if as_json:
            json.dump([m.model_dump(mode="json") for m in messages], sys.stdout, indent=2)
            sys.stdout.write("\n")
            return
        click.echo(render_transcript(messages, scripted=client.scripted))

    run(body())


@cli.command()
@click.argument("workflow_id")
@click.option(
    "--as", "requested_by", required=True, help="Who asks (the conversation's user or a tenant admin)."
)
@click.option(
    "--scope", type=click.Choice(["turn", "conversation", "call"]), default="turn", show_default=True
)
@click.option("--call", "call_id", help="With --scope call: the call to undo.")
@click.option("--reason", help="Why (kept in the audit).")
def rollback(
    workflow_id: str, requested_by: str, scope: str, call_id: str | None, reason: str | None
) -> None:
    """Undo what the agent changed: the latest turn, one call, or the whole conversation."""
    if (scope == "call") != bool(call_id):
        raise click.UsageError("--call goes with --scope call, and --scope call needs --call")
    request = RollbackRequest.model_validate(
        {"requested_by": requested_by, "scope": scope, "call_id": call_id, "reason": reason}
    )

    async def body() -> None:
        client = conversation_client(requested_by)  # signed: with a proof for this person and scope
        try:
            entries = await client.rollback(workflow_id, request)
        except TimeoutError as err:
            refusal = await rollback_refusal(load_settings(), workflow_id)
            raise click.ClickException(refusal or str(err)) from err
        if entries is None:  # sent to a running conversation: it undoes it between turns
            click.echo(
                f"rollback ({scope}) of {workflow_id} sent: it runs between turns; "
                f"`{command()} audit --workflow {workflow_id}` shows what was undone"
            )
            return
        if not entries:
            click.echo("nothing to undo in that scope")
        for e in entries:
            click.echo(f"{e.call_id} {e.tool}: {e.state} ({undo_why(e.state, e.error)})")

    run(body())


async def rollback_refusal(settings: Settings, workflow_id: str) -> str | None:
    """Why the conversation's latest rollback request was refused, as recorded, with how to fix a
    missing proof; None when the latest one was not refused (a turn is still running)."""
    if not settings.database_url:
        return None
    engine = create_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    select(RollbackRecord.accepted, RollbackRecord.reason, RollbackRecord.requested_by)
                    .where(RollbackRecord.workflow_id == workflow_id)
                    .order_by(RollbackRecord.id.desc())
                    .limit(1)
                )
            ).first()
    finally:
        await engine.dispose()
    if row is None or row.accepted:
        return None
    return "rollback refused: " + signed_hint(row.reason or "not allowed", row.requested_by, workflow_id)


@cli.command()
@click.argument("workflow_id")
@click.option("--as", "requested_by", required=True, help="Who ends it (kept in its result).")
def end(workflow_id: str, requested_by: str) -> None:
    """End a conversation. A turn in progress finishes first; what the agent did stays done."""

    async def body() -> None:
        client = conversation_client(requested_by)  # signed: with a proof that this person ended it
        await client.end(workflow_id, requested_by)
        if await client.ended(workflow_id, END_WAIT_S):
            click.echo(f"ended conversation {workflow_id}")
        else:
            click.echo(f"ending {workflow_id}: it finishes its current turn first (`status` shows it)")

    run(body())


def as_listed(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The `limit` newest, newest first, whatever order visibility returned them in; a closed run's
    state is `ended`, not the search attribute it stopped with (`idle` after a cancel)."""
    settled = [r if r["status"] in (None, "RUNNING") else {**r, "state": "ended"} for r in rows]
    return sorted(settled, key=lambda r: str(r["started_at"]), reverse=True)[:limit]


FIRST_WORDS = 40  # characters of a conversation's first message `conversations list` shows


def shown_words(text: str) -> str:
    """A conversation's first message as its list line ends: quoted, on one line, its first
    FIRST_WORDS characters (a longer one marked: `transcript` prints it whole)."""
    one_line = " ".join(text.split())
    return json.dumps(
        one_line if len(one_line) <= FIRST_WORDS else one_line[:FIRST_WORDS] + "…", ensure_ascii=False
    )


async def first_words(workflow_ids: list[str]) -> dict[str, str]:
    """The first message of each of these conversations (those stored so far), by workflow id: how
    `conversations list` tells them apart, as the chat page's list does."""
    if not workflow_ids:
        return {}

    async def read(session: AsyncSession) -> dict[str, str]:
        found = await session.execute(
            select(Conversation.workflow_id, first_message()).where(
                Conversation.workflow_id.in_(workflow_ids)
            )
        )
        return {workflow_id: text for workflow_id, text in found if text}

    return await with_session(read)


@cli.group()
def conversations() -> None:
    """Conversations across tenants (the Web UI's workflow list, from the terminal)."""


@conversations.command("list")
@click.option("--tenant", help="Only this tenant's conversations.")
@click.option("--agent", help="Only this agent's.")
@click.option("--all", "include_closed", is_flag=True, help="Ended ones too (default: running only).")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_conversations(
    tenant: str | None, agent: str | None, include_closed: bool, limit: int, as_json: bool
) -> None:
    """List conversations, newest first: id, agent state, agent, when started, its first words."""

    async def body() -> None:
        client, _ = await connected()
        clauses = [f"WorkflowType = '{WORKFLOW_TYPE}'"]
        clauses += [] if include_closed else ["ExecutionStatus = 'Running'"]
        clauses += [f"TenantId = '{tenant}'"] if tenant else []
        clauses += [f"AgentName = '{agent}'"] if agent else []
        rows: list[dict[str, Any]] = []
        # every match, not `limit` of them: visibility lists running runs first and closed ones by
        # close time, so its first N are not the N started last (issue 41: `--all --limit`)
        async for execution in client.list_workflows(" AND ".join(clauses)):
            attributes = execution.typed_search_attributes
            rows.append(
                {
                    "workflow_id": execution.id,
                    "tenant_id": attributes.get(TENANT_ID),
                    "agent": attributes.get(AGENT_NAME),
                    "state": attributes.get(AGENT_STATUS),
                    "status": execution.status.name if execution.status else None,
                    "started_at": execution.start_time.isoformat(),
                    "closed_at": execution.close_time.isoformat() if execution.close_time else None,
                }
            )
        rows = as_listed(rows, limit)
        said = await first_words([r["workflow_id"] for r in rows])
        rows = [{**r, "first_message": said.get(r["workflow_id"])} for r in rows]
        if as_json:
            print_json(rows)
            return
        if not rows:
            click.echo("no conversations" if include_closed else "none running (--all: ended too)")
        for r in rows:
            click.echo(
                f"{r['workflow_id']}  {r['state'] or '-'}  {r['agent'] or '-'}"
                f"  started {relative(r['started_at'])}"
                + ("" if r["status"] == "RUNNING" else f"  ({str(r['status']).lower()})")
                + (f"  {shown_words(r['first_message'])}" if r["first_message"] else "")
            )

    run(body())
