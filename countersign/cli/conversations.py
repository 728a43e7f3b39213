"""Commands that drive conversations: start, send, status, transcript."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from countersign.cli.app import cli, print_json, run
from countersign.cli.door import door_as, reading_door
from countersign.cli.session import signed_hint, signed_mode
from countersign.cli.ux import EXIT_WAITING, command, reason, relative, temporal_settings
from countersign.cli.waiting import SignedHint, ctrl_c, follow, waiting_lines
from countersign.client.ended import (
    conversation_status,
    full_transcript,
    has_ended,
    roll_back_ended,
    tokens_today,
)
from countersign.client.handles import (
    render_message,
    render_transcript,
    roll_back,
    send_keyed,
    start_conversation,
    wait_reply,
)
from countersign.client.temporal_client import connect
from countersign.core.approvals import APPROVER_ROLES, FOUR_EYES
from countersign.core.contract import (
    WORKFLOW_TYPE,
    EndConversation,
    Limits,
    StartConversation,
    StatusView,
    SubmitMessage,
    TurnResult,
)
from countersign.core.envelopes import describe_policy
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackRequest, SagaEntry
from countersign.core.summaries import usage_line
from countersign.db import events
from countersign.db.engine import create_engine
from countersign.db.schema import RollbackRecord, UserRole
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


async def wait_turn(handle: WorkflowHandle[Any, Any], turn: int) -> TurnResult | None:
    """Block until `turn` finishes, through the `wait_turn` update (no polling)."""
    result: TurnResult | None = await handle.execute_update("wait_turn", turn, result_type=TurnResult | None)  # type: ignore[arg-type]
    return result


async def query_status(handle: WorkflowHandle[Any, Any]) -> StatusView:
    status: StatusView = await handle.query("status", result_type=StatusView)
    return status


async def query_transcript(handle: WorkflowHandle[Any, Any]) -> list[ChatMessage]:
    messages: list[ChatMessage] = await handle.query("transcript", result_type=list[ChatMessage])
    return messages


async def events_seen(settings: Settings, workflow_id: str) -> int:
    """The conversation's latest event id (0 without a database): a reply is followed after it."""
    return await events.last_id(settings.database_url, workflow_id) if settings.database_url else 0


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

    async def through_door() -> None:
        door = door_as(user, tenant)
        workflow_id, _ = await door.start(agent, message, conversation.limits, single_turn)
        if not as_json:
            click.echo(workflow_id)
        outcome = await door.reply(workflow_id, turn=1) if wait else None
        await finish(workflow_id, outcome, {"workflow_id": workflow_id})

    async def finish(
        workflow_id: str,
        outcome: TurnResult | StatusView | None,
        out: dict[str, Any],
        client: Client | None = None,
        settings: Settings | None = None,
    ) -> None:
        if as_json:
            if isinstance(outcome, TurnResult):
                out["turn"] = outcome.model_dump(mode="json")
            elif isinstance(outcome, StatusView):
                out["waiting"] = outcome.model_dump(mode="json")
            print_json(out)
        elif wait:
            shown = settings or load_settings()

            async def transcript() -> list[ChatMessage]:
                if client is None:  # signed mode: through the server
                    return await door_as(user).transcript(workflow_id)
                return await full_transcript(client, shown, workflow_id)

            await show_outcome(workflow_id, outcome, user, transcript, shown, client is None)
        if isinstance(outcome, StatusView):
            raise SystemExit(EXIT_WAITING)

    async def body() -> None:
        if signed_mode():  # the server starts it, with a proof that this person asked
            return await through_door()
        client, settings = await connected()
        handle = await start_conversation(client, settings, conversation)
        with ctrl_c() as interrupted:
            if not as_json:
                click.echo(handle.id)  # at once: the turn may take a while, or wait for a person
            try:
                reply = wait_turn(handle, 1)
                outcome = await follow(handle, reply, interrupted, settings.database_url) if wait else None
            except Exception:
                await handle.result()  # a conversation that failed to start says why (unknown user, ...)
                raise
        out = {
            "workflow_id": handle.id,
            "run_id": handle.result_run_id,
            "ui_url": settings.workflow_url(handle.id),
        }
        await finish(handle.id, outcome, out, client, settings)

    run(body())


async def show_outcome(
    workflow_id: str,
    outcome: TurnResult | StatusView | None,
    user: str,
    transcript: Callable[[], Awaitable[list[ChatMessage]]],
    settings: Settings,
    through_server: bool = False,
) -> None:
    """The turn's tool calls with a summary of each result, then the reply, or what the turn waits
    for, who may decide it (by name, from the database, unless the CLI goes through the server) and
    the commands that let it go on."""
    if outcome is None:
        raise click.ClickException(f"conversation {workflow_id} ended before replying")
    for line in turn_calls(await transcript()):
        click.echo(line)
    if isinstance(outcome, StatusView):
        names = {} if through_server else await deciders(settings, outcome)
        signed = (
            SignedHint(settings.inbox_url, outcome.tenant_id) if settings.approver_auth == "signed" else None
        )
        for line in waiting_lines(workflow_id, outcome, user, lambda a: names.get(a.call_id, ()), signed):
            click.echo(line)
        click.echo(f"the reply follows the decision: `{command()} transcript {workflow_id}` shows it")
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


async def deciders(settings: Settings, status: StatusView) -> dict[str, list[str]]:
    """Per pending call, the users of the tenant whose decision the workflow would accept (by role
    and the four-eyes rule); empty when the database is not reachable (the roles still say who)."""
    if not settings.database_url or not status.pending_approvals:
        return {}
    engine = create_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(UserRole.user_id, UserRole.role)
                    .where(UserRole.tenant_id == status.tenant_id)
                    .order_by(UserRole.user_id)
                )
            ).all()
    except (OSError, SQLAlchemyError):
        return {}
    finally:
        await engine.dispose()
    return {
        a.call_id: list(
            dict.fromkeys(
                user
                for user, role in rows
                if role in APPROVER_ROLES[a.risk] and not (a.risk in FOUR_EYES and user == a.requested_by)
            )
        )
        for a in status.pending_approvals
    }


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

    async def through_door() -> None:
        door = door_as(user, tenant)
        if key is not None:
            assert agent is not None
            target_id, message_id = await door.start(agent, message.text, key=key)
        else:
            assert workflow_id is not None
            target_id, message_id = (
                workflow_id,
                await door.send(workflow_id, message.text, message.message_id),
            )
        click.echo(f"conversation {target_id}", err=True)
        if no_wait:
            return
        outcome = await door.reply(target_id, message_id=message_id)
        await show_outcome(
            target_id, outcome, user, lambda: door.transcript(target_id), load_settings(), True
        )
        if isinstance(outcome, StatusView):
            raise SystemExit(EXIT_WAITING)

    async def body() -> None:
        if signed_mode():  # the server delivers it, with a proof that this person wrote it
            return await through_door()
        client, settings = await connected()
        if key is not None:
            assert tenant and agent
            start = checked(lambda: StartConversation(tenant_id=tenant, user_id=user, agent=agent))
            handle = await send_keyed(client, settings, start, key, message)
            target_id = handle.id
            seen = await events_seen(settings, target_id)  # this turn's first text may precede it
        else:
            assert workflow_id is not None
            target_id = workflow_id
            current = await query_status(client.get_workflow_handle(workflow_id))
            if current.state == "ended":
                raise click.ClickException(f"conversation {workflow_id} has ended")
            if current.user_id and current.user_id != user:
                raise click.ClickException(
                    f"conversation {workflow_id} is {current.user_id}'s: {user} may not write to it"
                )
            seen = await events_seen(settings, workflow_id)
            await client.get_workflow_handle(workflow_id).signal("submit_message", message)
        with ctrl_c() as interrupted:
            click.echo(f"conversation {target_id}", err=True)
            if no_wait:
                return
            reply = wait_reply(client, target_id, message.message_id or "")
            try:
                outcome = await follow(
                    client.get_workflow_handle(target_id), reply, interrupted, settings.database_url, seen
                )
            except WorkflowUpdateFailedError as err:  # refused (another user's conversation, a full inbox)
                raise click.ClickException(reason(err)) from err
        await show_outcome(
            target_id, outcome, user, lambda: full_transcript(client, settings, target_id), settings
        )
        if isinstance(outcome, StatusView):
            raise SystemExit(EXIT_WAITING)

    run(body())


@cli.command()
@click.argument("workflow_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(workflow_id: str, as_json: bool) -> None:
    """Show a conversation's state, turn, pending approvals, usage and limits."""

    async def body() -> None:
        used, budget = 0, None
        if door := reading_door():
            view = await door.status(workflow_id)
        else:
            client, settings = await connected()
            view = await conversation_status(client, settings, workflow_id)
            if settings.database_url:
                used, budget = await tokens_today(settings, view.tenant_id)
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
        if door := reading_door():
            messages, scripted = await door.transcript(workflow_id), False
        else:
            client, settings = await connected()
            messages, scripted = await full_transcript(client, settings, workflow_id), settings.scripted_model
        if as_json:
            json.dump([m.model_dump(mode="json") for m in messages], sys.stdout, indent=2)
            sys.stdout.write("\n")
            return
        click.echo(render_transcript(messages, scripted=scripted))

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

    async def through_door() -> list[SagaEntry] | None:
        """The server sends it with a proof for this person and scope (or, the conversation
        having ended, runs it); a running conversation undoes it between turns."""
        door = door_as(requested_by)
        entries = await door.rollback(workflow_id, scope, call_id, reason)
        if entries is None:
            click.echo(
                f"rollback ({scope}) of {workflow_id} sent: it runs between turns; "
                f"`{command()} audit --workflow {workflow_id}` shows what was undone"
            )
        return entries

    async def body() -> None:
        if signed_mode():
            entries = await through_door()
            if entries is None:
                return
        else:
            entries = await directly()
        if not entries:
            click.echo("nothing to undo in that scope")
        for e in entries:
            click.echo(f"{e.call_id} {e.tool}: {e.state}{f' ({e.error})' if e.error else ''}")

    async def directly() -> list[SagaEntry]:
        client, settings = await connected()
        if await has_ended(client, workflow_id):  # takes no signal: a short workflow undoes it
            outcome = await roll_back_ended(client, settings, workflow_id, request)
            if outcome.refused:
                raise click.ClickException(f"rollback refused: {outcome.refused}")
            return outcome.entries
        try:
            return await roll_back(client.get_workflow_handle(workflow_id), request)
        except TimeoutError as err:
            raise click.ClickException(await rollback_refusal(settings, workflow_id) or str(err)) from err

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

    async def through_door() -> None:
        door = door_as(requested_by)
        await door.end(workflow_id)
        for _ in range(int(END_WAIT_S / 0.2)):
            if (await door.status(workflow_id)).state == "ended":
                click.echo(f"ended conversation {workflow_id}")
                return
            await asyncio.sleep(0.2)
        click.echo(f"ending {workflow_id}: it finishes its current turn first (`status` shows it)")

    async def body() -> None:
        if signed_mode():  # the server sends it with a proof that this person ended it
            return await through_door()
        client, _ = await connected()
        handle = client.get_workflow_handle(workflow_id)
        if (await query_status(handle)).state == "ended":
            raise click.ClickException(f"conversation {workflow_id} has already ended")
        await handle.signal("end", EndConversation(requested_by=requested_by))
        try:
            await asyncio.wait_for(handle.result(), END_WAIT_S)
        except TimeoutError:
            click.echo(f"ending {workflow_id}: it finishes its current turn first (`status` shows it)")
            return
        click.echo(f"ended conversation {workflow_id}")

    run(body())


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
    """List conversations, newest first: id, agent state, agent, when started."""

    async def body() -> None:
        client, _ = await connected()
        clauses = [f"WorkflowType = '{WORKFLOW_TYPE}'"]
        clauses += [] if include_closed else ["ExecutionStatus = 'Running'"]
        clauses += [f"TenantId = '{tenant}'"] if tenant else []
        clauses += [f"AgentName = '{agent}'"] if agent else []
        rows: list[dict[str, Any]] = []
        async for execution in client.list_workflows(" AND ".join(clauses), limit=limit):
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
            )

    run(body())
