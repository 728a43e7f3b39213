"""`start --wait` and `send`: follow a turn until it replies, or until it waits for a person.

A turn that pauses for an approval or a question can wait for hours; rather than hang, the command
prints what the turn waits for and the exact command that lets it go on, and exits with
`EXIT_WAITING`. Ctrl-C only stops the display: the conversation is a workflow and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import click
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from countersign.cli.ux import EXIT_INTERRUPTED, command, reason, relative
from countersign.core.approvals import APPROVER_ROLES, FOUR_EYES
from countersign.core.contract import PendingApproval, PendingQuestion, StatusView, TurnResult
from countersign.db import events

POLL_S = 0.5  # without the database: how often the status is looked at while the reply is awaited
T = TypeVar("T")


@dataclass(frozen=True)
class Started:
    """A conversation just started; its first turn is the one followed."""

    workflow_id: str
    shown: dict[str, Any]  # what `start --json` prints of it (the server knows no run id, no Web UI)


@dataclass(frozen=True)
class Sent:
    """A message delivered; its turn is the one followed: by the message's id (None: the keyed
    conversation's first turn), after `after`, the conversation's latest event before it."""

    workflow_id: str
    message_id: str | None
    after: int = 0


def who_can_decide(approval: PendingApproval, deciders: Sequence[str] = ()) -> str:
    """`a user with role admin or reviewer other than alice (bob, carol)`: who the workflow will
    accept a decision from; `deciders` names them when the caller looked them up."""
    roles = " or ".join(sorted(APPROVER_ROLES[approval.risk]))
    other = f" other than {approval.requested_by}" if approval.risk in FOUR_EYES else ""
    named = f" ({', '.join(deciders)})" if deciders else ""
    return f"a user with role {roles}{other}{named}"


def approval_lines(
    workflow_id: str,
    approval: PendingApproval,
    deciders: Sequence[str] = (),
    signed: SignedHint | None = None,
) -> list[str]:
    """A pending call and the commands that decide it (in signed mode: log in, then decide)."""
    cli = command()
    user = deciders[0] if deciders else "USER"
    lines = [
        f"waiting for approval: {approval.call_id} {approval.tool} {approval.args}",
        f"  risk {approval.risk} · requested by {approval.requested_by}"
        f" · expires {relative(approval.expires_at)}",
        f"  {who_can_decide(approval, deciders)} decides:",
    ]
    if signed is not None:
        lines += [
            f"    in the inbox: {signed.inbox_url} (APPROVER_AUTH=signed), or from the CLI:",
            f"    {cli} login --tenant {signed.tenant} --as {user}",
        ]
    lines.append(f"    {cli} approve {workflow_id} {approval.call_id} --as {user}")
    lines.append(f'    {cli} reject {workflow_id} {approval.call_id} --as {user} --reason "…"')
    return lines


def question_lines(workflow_id: str, question: PendingQuestion, user: str) -> list[str]:
    return [
        f"waiting for an answer: {question.call_id} {question.question}",
        f'  {command()} answer {workflow_id} {question.call_id} "…" --as {user}',
    ]


@dataclass(frozen=True)
class SignedHint:
    """APPROVER_AUTH=signed: where reviewers decide and which tenant they log in to."""

    inbox_url: str
    tenant: str


def waiting_lines(
    workflow_id: str,
    status: StatusView,
    user: str,
    deciders: Callable[[PendingApproval], Sequence[str]] = lambda _: (),
    signed: SignedHint | None = None,
) -> list[str]:
    lines = [
        line for a in status.pending_approvals for line in approval_lines(workflow_id, a, deciders(a), signed)
    ]
    lines += [line for q in status.pending_questions for line in question_lines(workflow_id, q, user)]
    return lines


async def explain_closed(handle: WorkflowHandle[Any, Any]) -> None:
    """When a wait failed because the conversation closed, say why it closed (its own failure)."""
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        return
    try:
        await handle.result()
    except Exception as failed:
        raise click.ClickException(f"conversation {handle.id} stopped: {reason(failed)}") from failed


@contextlib.contextmanager
def ctrl_c() -> Iterator[asyncio.Event]:
    """Ctrl-C sets the event instead of interrupting. Installed before the id is printed, so a
    person who presses it once they see the id always gets `follow`'s answer."""
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        yield interrupted
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def follow(
    handle: WorkflowHandle[Any, Any],
    reply: Awaitable[TurnResult | None],
    interrupted: asyncio.Event,
    database_url: str | None = None,
    after: int = 0,
) -> TurnResult | StatusView | None:
    """The turn's result (None: the conversation ended first), or its status once it waits for a
    person. Ctrl-C (`interrupted`) says what still runs and exits with EXIT_INTERRUPTED.

    With the database, the conversation's events (after `after`) are read as they are written:
    the model's text is shown as it arrives (on stderr, when it is a terminal: stdout keeps the
    reply alone, for scripts),
    and the status is asked only when an event says that a call waits for a person. Without it,
    the status is looked at every POLL_S."""
    waiting = asyncio.ensure_future(reply)
    watched = asyncio.ensure_future(watch(database_url, handle.id, after)) if database_url else None
    try:
        while True:
            stop = asyncio.ensure_future(interrupted.wait())
            tasks = {waiting, stop} | ({watched} if watched else set())
            timeout = None if watched else POLL_S
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if interrupted.is_set():
                leave(handle.id)
            if waiting.done():
                if waiting.exception() is not None:
                    await explain_closed(handle)
                return waiting.result()
            status: StatusView = await handle.query("status", result_type=StatusView)
            if status.pending_approvals or status.pending_questions:
                return status
            if watched is not None and database_url is not None:  # not waiting after all: read on
                watched = asyncio.ensure_future(watch(database_url, handle.id, watched.result()))
    finally:
        for task in (waiting, watched):
            if task is not None:
                task.cancel()  # only our wait: the workflow does not notice
                with contextlib.suppress(BaseException):
                    await task


def leave(workflow_id: str) -> NoReturn:
    """Ctrl-C while a turn is followed: say what still runs, and exit with EXIT_INTERRUPTED."""
    click.echo(
        f"\ninterrupted: conversation {workflow_id} goes on without this display; "
        f"`{command()} status {workflow_id}` shows it",
        err=True,
    )
    raise SystemExit(EXIT_INTERRUPTED)


async def unless_interrupted(workflow_id: str, waiting: Awaitable[T], interrupted: asyncio.Event) -> T:
    """`waiting`'s result, unless Ctrl-C (`interrupted`) comes first: then as `follow` does."""
    task, stop = asyncio.ensure_future(waiting), asyncio.ensure_future(interrupted.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if interrupted.is_set():
            leave(workflow_id)
        return task.result()
    finally:
        for pending in (task, stop):
            pending.cancel()  # only our wait: the conversation goes on
            with contextlib.suppress(BaseException):
                await pending


async def watch(database_url: str | None, workflow_id: str, after: int) -> int:
    """Show the model's text as it streams, until an event says a person is waited for (an
    approval requested, a question): the id of that event."""
    assert database_url is not None
    streaming, shown = False, sys.stderr.isatty()  # a person's terminal; a script reads the reply alone
    async for event in events.follow(database_url, workflow_id, after):
        if event.kind == "delta" and not shown:
            continue
        if event.kind == "delta":
            if event.data.get("reset") and streaming:
                click.echo("\n(the model call was retried)", err=True)
            click.echo(str(event.data.get("text", "")), nl=False, err=True)
            streaming = streaming or bool(event.data.get("text"))
            continue
        if streaming:
            click.echo("", err=True)
            streaming = False
        if event.kind == "question" or (event.kind == "approval" and event.data.get("state") == "pending"):
            return int(event.id)
    return after
