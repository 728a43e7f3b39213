"""`start --wait` and `send`: follow a turn until it replies, or until it waits for a person.

A turn that pauses for an approval or a question can wait for hours; rather than hang, the command
prints what the turn waits for and the exact command that lets it go on, and exits with
`EXIT_WAITING`. Ctrl-C only stops the display: the conversation is a workflow and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Iterator
from typing import Any

import click
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from countersign.cli.ux import EXIT_INTERRUPTED, command, reason
from countersign.core.approvals import APPROVER_ROLES, FOUR_EYES
from countersign.core.contract import PendingApproval, PendingQuestion, StatusView, TurnResult

POLL_S = 0.5  # how often the status is looked at while the reply is awaited


def who_can_decide(approval: PendingApproval) -> str:
    """`a reviewer or admin other than alice`: who the workflow will accept a decision from."""
    roles = " or ".join(sorted(APPROVER_ROLES[approval.risk]))
    other = f" other than {approval.requested_by}" if approval.risk in FOUR_EYES else ""
    return f"a user with role {roles}{other}"


def approval_lines(workflow_id: str, approval: PendingApproval) -> list[str]:
    """A pending call and the commands that decide it."""
    cli = command()
    return [
        f"waiting for approval: {approval.call_id} {approval.tool} {approval.args}",
        f"  risk {approval.risk} · requested by {approval.requested_by} · expires {approval.expires_at}",
        f"  {who_can_decide(approval)} decides:",
        f"    {cli} approve {workflow_id} {approval.call_id} --as USER",
        f'    {cli} reject {workflow_id} {approval.call_id} --as USER --reason "…"',
    ]


def question_lines(workflow_id: str, question: PendingQuestion, user: str) -> list[str]:
    return [
        f"waiting for an answer: {question.call_id} {question.question}",
        f'  {command()} answer {workflow_id} {question.call_id} "…" --as {user}',
    ]


def waiting_lines(workflow_id: str, status: StatusView, user: str) -> list[str]:
    lines = [line for a in status.pending_approvals for line in approval_lines(workflow_id, a)]
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
    handle: WorkflowHandle[Any, Any], reply: Awaitable[TurnResult | None], interrupted: asyncio.Event
) -> TurnResult | StatusView | None:
    """The turn's result (None: the conversation ended first), or its status once it waits for a
    person. Ctrl-C (`interrupted`) says what still runs and exits with EXIT_INTERRUPTED."""
    waiting = asyncio.ensure_future(reply)
    try:
        while True:
            stop = asyncio.ensure_future(interrupted.wait())
            await asyncio.wait({waiting, stop}, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if interrupted.is_set():
                click.echo(
                    f"\ninterrupted: conversation {handle.id} goes on without this display; "
                    f"`{command()} status {handle.id}` shows it",
                    err=True,
                )
                raise SystemExit(EXIT_INTERRUPTED)
            if waiting.done():
                if waiting.exception() is not None:
                    await explain_closed(handle)
                return waiting.result()
            status: StatusView = await handle.query("status", result_type=StatusView)
            if status.pending_approvals or status.pending_questions:
                return status
    finally:
        waiting.cancel()  # only our wait: the workflow does not notice
        with contextlib.suppress(BaseException):
            await waiting
