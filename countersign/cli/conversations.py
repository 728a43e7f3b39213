"""Commands that drive conversations: start, send, status, transcript."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from countersign.cli.app import cli, print_json, run
from countersign.cli.door import door_as, reading_door
from countersign.cli.inbox import signed_mode
from countersign.cli.ux import EXIT_WAITING, command, reason, temporal_settings
from countersign.cli.waiting import ctrl_c, follow, waiting_lines
from countersign.client.ended import (
    conversation_status,
    full_transcript,
    has_ended,
    roll_back_ended,
    tokens_today,
)
from countersign.client.handles import (
    render_transcript,
    roll_back,
    send_keyed,
    start_conversation,
    wait_reply,
)
from countersign.client.temporal_client import connect
from countersign.core.contract import (
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
from countersign.runtime.config import Settings

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
        finish(workflow_id, outcome, {"workflow_id": workflow_id})

    def finish(workflow_id: str, outcome: TurnResult | StatusView | None, out: dict[str, Any]) -> None:
        if as_json:
            if isinstance(outcome, TurnResult):
                out["turn"] = outcome.model_dump(mode="json")
            elif isinstance(outcome, StatusView):
                out["waiting"] = outcome.model_dump(mode="json")
            print_json(out)
        elif wait:
            show_outcome(workflow_id, outcome, user)
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
                outcome = await follow(handle, wait_turn(handle, 1), interrupted) if wait else None
            except Exception:
                await handle.result()  # a conversation that failed to start says why (unknown user, ...)
                raise
        out = {
            "workflow_id": handle.id,
            "run_id": handle.result_run_id,
            "ui_url": settings.workflow_url(handle.id),
        }
        finish(handle.id, outcome, out)

    run(body())


def show_outcome(workflow_id: str, outcome: TurnResult | StatusView | None, user: str) -> None:
    """The reply, or what the turn waits for and the commands that let it go on."""
    if outcome is None:
        raise click.ClickException(f"conversation {workflow_id} ended before replying")
    if isinstance(outcome, StatusView):
        for line in waiting_lines(workflow_id, outcome, user):
            click.echo(line)
        click.echo(f"the reply follows the decision: `{command()} transcript {workflow_id}` shows it")
    else:
        click.echo(outcome.reply or "(no reply)")


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
        show_outcome(target_id, outcome, user)
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
            await client.get_workflow_handle(workflow_id).signal("submit_message", message)
        with ctrl_c() as interrupted:
            click.echo(f"conversation {target_id}", err=True)
            if no_wait:
                return
            reply = wait_reply(client, target_id, message.message_id or "")
            try:
                outcome = await follow(client.get_workflow_handle(target_id), reply, interrupted)
            except WorkflowUpdateFailedError as err:  # refused (another user's conversation, a full inbox)
                raise click.ClickException(reason(err)) from err
        show_outcome(target_id, outcome, user)
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
        click.echo(f"usage: {u.total_tokens} tokens, {u.model_calls} model calls, {u.tool_calls} tool calls")
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
        return await roll_back(client.get_workflow_handle(workflow_id), request)

    run(body())


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
