"""`starter.py chat`: talk to an agent interactively and watch it work.

Each line you type is a message; while the turn runs, the chat reads the conversation's events as
they are written (countersign.db.events): the model's text as it streams, and at each other event
what is new in the `transcript` and `status` queries: tool calls with their arguments, results,
approvals and questions, which you can answer inline (without a database: it looks every POLL_S).
The reply itself arrives through the `wait_reply` (or `wait_turn`) update, awaited alongside.
Ctrl-C or a closed stdin only detach the display: the conversation is a workflow and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, run
from countersign.cli.approvals import effect_block, recorded_effects
from countersign.cli.conversation_client import ConversationClient, conversation_client
from countersign.cli.conversations import parse_limits
from countersign.cli.ux import command, relative, with_session
from countersign.cli.waiting import who_can_decide
from countersign.client.handles import (
    render_message,
    render_status,
    render_transcript,
)
from countersign.core.approvals import (
    Decision,
    DecisionKind,
    approver_refusal,
    decision_note,
)
from countersign.core.contract import (
    PendingApproval,
    PendingQuestion,
    StartConversation,
    StatusView,
    SubmitMessage,
    TurnResult,
)
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackRequest, undo_why
from countersign.core.summaries import usage_line
from countersign.db import events, schema
from countersign.db.instances import current_instance
from countersign.runtime.config import SCRIPTED_LABEL, load_settings

POLL_S = 0.25  # without a database: how often a running turn is looked at
LAST_EVENTS_S = 2.0  # how long a turn that has ended is given for its last events to be read
HELP = """\
Type a message to send it. While the agent works you see its tool calls, results, approvals and questions.
  /status                    state, usage, pending approvals and questions
  /transcript                everything said so far
  /approve CALL_ID [reason]  approve a pending call (as you)
  /reject CALL_ID [reason]   reject a pending call (as you)
  /rollback [turn|conversation|call CALL_ID]  undo what the agent changed (default: the last turn)
  /end                       end the conversation and leave
  /quit                      leave; the conversation goes on (Ctrl-D too)
  /help                      this text
Ctrl-C while the agent works detaches the display; the conversation goes on."""
APPROVE_WORDS: dict[str, DecisionKind] = {"y": "approve", "yes": "approve", "n": "reject", "no": "reject"}


class Detached(Exception):
    """The person left while a turn was running (stdin closed)."""


class Lines:
    """Lines from stdin for an asyncio program.

    The descriptor is read when the event loop says it is readable: no thread stays blocked in a
    read at exit, and the terminal (shared with stdout) is not switched to non-blocking mode. A
    stdin that cannot be watched (a regular file, an in-memory stream) is read whole at once.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._partial = b""
        self._fd: int | None = None
        self._echo = not sys.stdin.isatty()  # piped input: show it, so the output reads as a chat

    def open(self) -> None:
        try:
            fd = sys.stdin.fileno()
            asyncio.get_running_loop().add_reader(fd, self._readable, fd)
            self._fd = fd
        except (OSError, ValueError):  # io.UnsupportedOperation is both; epoll refuses regular files
            self._feed(sys.stdin.buffer.read())
            self._feed(b"")

    def close(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            self._fd = None

    def _readable(self, fd: int) -> None:
        data = os.read(fd, 65536)
        if not data:
            self.close()
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Queue the complete lines in `data`; empty `data` is the end of input (None)."""
        if not data:
            if self._partial:
                self._queue.put_nowait(self._partial.decode(errors="replace"))
            self._queue.put_nowait(None)
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._queue.put_nowait(line.decode(errors="replace").rstrip("\r"))

    async def ask(self, prompt: str) -> str | None:
        """The next line after showing `prompt`, or None once input has ended."""
        click.echo(prompt, nl=False)
        line = await self._queue.get()
        if line is None:
            self._queue.put_nowait(None)  # the end stays the end for later reads
        if line is None or self._echo:
            click.echo(line or "")
        return line


def unseen(messages: list[ChatMessage], last: ChatMessage | None) -> list[ChatMessage]:
    """The messages after `last`, the latest one shown. Found by content from the end, not by
    count: a conversation that continued-as-new carries a trimmed transcript."""
    if last is None:
        return messages
    for i in range(len(messages) - 1, -1, -1):
        if messages[i] == last:
            return messages[i + 1 :]
    return messages


def conversation_user(messages: list[ChatMessage]) -> str | None:
    """Who the conversation is with: only its user's messages are accepted, so any user message says."""
    return next((m.name for m in messages if m.role == "user" and m.name), None)


def reattach(workflow_id: str) -> str:
    return f"Re-attach: {command()} chat --workflow {workflow_id}"


def turn_footer(turn: TurnResult) -> str:
    u = turn.usage
    stopped = f"turn stopped: {turn.stop} · " if turn.stop != "completed" else ""
    return f"  ({stopped}{usage_line(u.model_calls, u.tool_calls, u.total_tokens)})"


async def roles_of(tenant_id: str, user: str) -> list[str] | None:
    """The user's roles in the tenant (None: not a user there), as the decision check reads them."""

    async def read(session: AsyncSession) -> list[str] | None:
        if await session.get(schema.User, (tenant_id, user)) is None:
            return None
        query = select(schema.UserRole.role).where(
            schema.UserRole.tenant_id == tenant_id, schema.UserRole.user_id == user
        )
        return list((await session.scalars(query)).all())

    return await with_session(read)


async def decision_of(workflow_id: str, call_id: str) -> schema.ApprovalDecision | None:
    """The accepted decision on a call, from the audit."""

    async def read(session: AsyncSession) -> schema.ApprovalDecision | None:
        query = select(schema.ApprovalDecision).where(
            schema.ApprovalDecision.workflow_id == workflow_id,
            schema.ApprovalDecision.conversation_id == current_instance(workflow_id),
            schema.ApprovalDecision.call_id == call_id,
            schema.ApprovalDecision.accepted.is_(True),
        )
        return (await session.scalars(query.limit(1))).first()

    return await with_session(read)


class Chat:
    """One person's chat with one conversation (started by the first message, or re-attached)."""

    def __init__(
        self,
        port: ConversationClient,
        lines: Lines,
        user: str,
        start: StartConversation | None,
        database_url: str | None = None,
    ):
        self.port, self.lines, self.user, self.start = port, lines, user, start
        self.database_url = database_url  # where the conversation's events are read (None: polled)
        self.after = 0  # the latest conversation event read
        self.streaming: int | None = None  # the model call (its reply's seq) whose text is being shown
        self.streamed: dict[int, str] = {}  # the text each model call streamed
        self.conversation: str | None = None  # its workflow id, once started or attached
        self.last_shown: ChatMessage | None = None
        self.thinking_shown = False
        self.asked: set[str] = set()  # approvals and questions already put to the person
        self.pending: dict[str, PendingApproval] = {}  # approvals seen pending, until their decision is shown
        self.roles: list[str] | None = None  # the person's roles in the tenant, read when first needed
        self.ended = False

    @property
    def workflow_id(self) -> str:
        return self.conversation or "?"

    # --- the loop ---------------------------------------------------------------------------

    async def repl(self) -> None:
        commands: dict[str, Callable[[str], Awaitable[bool]]] = {
            "/status": self.show_status,
            "/transcript": self.show_transcript,
            "/approve": lambda rest: self.decide_command("approve", rest),
            "/reject": lambda rest: self.decide_command("reject", rest),
            "/rollback": self.rollback,
            "/end": self.end,
            "/quit": self.quit,
            "/help": self.help,
        }
        while not self.ended and (line := await self.lines.ask(f"{self.user}> ")) is not None:
            line = line.strip()
            name, _, rest = line.partition(" ")
            if not line:
                continue
            if not line.startswith("/"):
                await self.say(line)
            elif name not in commands:
                click.echo(f"unknown command {name}: /help lists them")
            elif not await commands[name](rest.strip()):
                return

    async def say(self, text: str) -> None:
        if self.conversation is None:
            assert self.start is not None
            started = await self.port.start(self.start.model_copy(update={"message": text}))
            self.conversation = started.workflow_id
            ui = self.port.ui_url(self.conversation)
            click.echo(f"conversation {self.conversation}" + (f" · Web UI {ui}" if ui else ""))
            await self.follow(self.port.reply(self.conversation, None, 1))
            return
        if (await self.port.status(self.conversation)).state == "ended":
            click.echo(f"conversation {self.workflow_id} has ended")
            self.ended = True
            return
        self.after = await self.events_seen(self.conversation)
        message = SubmitMessage(user_id=self.user, text=text, message_id=uuid.uuid4().hex)
        sent = await self.port.send(self.conversation, message)
        await self.follow(self.port.reply(self.conversation, sent.message_id, None))

    async def events_seen(self, workflow_id: str) -> int:
        """The conversation's latest event id: what follows it is this turn's."""
        return await events.last_id(self.database_url, workflow_id) if self.database_url else 0

    async def attach(self, workflow_id: str) -> None:
        """Show a running conversation so far, then follow the turn it is in, if any."""
        self.conversation = workflow_id
        messages, status = await asyncio.gather(
            self.port.transcript(workflow_id), self.port.status(workflow_id)
        )
        click.echo(render_transcript(messages, scripted=False))
        self.last_shown = messages[-1] if messages else None
        self.after = await self.events_seen(workflow_id)
        if status.state == "ended":
            click.echo(f"conversation {workflow_id} has ended")
            self.ended = True
        elif status.state != "idle":
            await self.follow(self.port.reply(workflow_id, None, status.turn))

    # --- following a turn -------------------------------------------------------------------

    async def follow(self, reply: Awaitable[TurnResult | None]) -> None:
        """Show the turn's progress until `reply` (the update that answers when it ends) returns."""
        waiting = asyncio.ensure_future(reply)
        try:
            if self.database_url:
                await self.show_progress()  # what already waits (a question, an approval) is asked now
                await self.follow_events(waiting, self.database_url)
            else:  # no database to read the events from: look at the status now and then
                while not waiting.done():
                    await self.show_progress()
                    await asyncio.wait({waiting}, timeout=POLL_S)
            self.end_streaming()
            await self.show_progress()
        finally:
            waiting.cancel()  # only our wait: the workflow does not notice
        turn = waiting.result()
        if turn is None:
            click.echo(f"conversation {self.workflow_id} has ended")
            self.ended = True
        else:
            click.echo(turn_footer(turn))

    async def follow_events(self, waiting: asyncio.Future[TurnResult | None], database_url: str) -> None:
        """Read the conversation's events as they are written: text is shown as it streams; any
        other event (a call, a result, an approval, a question) shows what is new and asks what
        is to be asked. Nothing is polled."""
        stream = events.follow(database_url, self.workflow_id, self.after)
        upcoming = asyncio.ensure_future(anext(stream))
        ended = False  # the latest event read ends the turn (or the conversation)
        try:
            while True:
                pending: set[asyncio.Future[Any]] = {upcoming} if waiting.done() else {waiting, upcoming}
                # once the turn has ended, its last events are already written: read them, briefly
                await asyncio.wait(pending, timeout=LAST_EVENTS_S if waiting.done() else None,
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if waiting.done() and (ended or not upcoming.done()):
                    return
                if not upcoming.done():
                    continue
                event = upcoming.result()
                self.after = event.id
                if event.kind == "delta":
                    self.show_delta(event.data)
                else:
                    self.end_streaming()
                    await self.show_progress()
                ended = event.kind in ("turn", "ended")
                upcoming = asyncio.ensure_future(anext(stream))
        finally:
            upcoming.cancel()
            with contextlib.suppress(BaseException):
                await upcoming
            await stream.aclose()

    def show_delta(self, data: dict[str, Any]) -> None:
        seq, text = int(data.get("seq", -1)), str(data.get("text", ""))
        if data.get("reset") and self.streaming is not None:
            click.echo("\n  (the model call was retried)")
            self.streaming = None
        if self.streaming != seq:
            self.end_streaming()
            click.echo("agent> ", nl=False)
            self.streaming, self.streamed[seq] = seq, ""
        click.echo(text, nl=False)
        self.streamed[seq] += text
        self.thinking_shown = False

    def end_streaming(self) -> None:
        if self.streaming is not None:
            click.echo("")
            self.streaming = None

    async def show_progress(self) -> None:
        assert self.conversation is not None
        # Status first, then the transcript: state only moves forward, so the transcript then holds
        # at least what led to the status (the call an approval is for is shown before its prompt).
        status = await self.port.status(self.conversation)
        messages = await self.port.live_transcript(self.conversation)
        await self.show_decided(status)  # before the results they let through
        shown = unseen(messages, self.last_shown)
        for message in shown:
            if message.role == "assistant" and message.content in self.streamed.values():
                message = message.model_copy(update={"content": None})  # shown as it streamed
            text = render_message(message) if message.role != "user" else None  # the person typed it
            if text:
                click.echo(text)
                self.thinking_shown = False
        self.last_shown = messages[-1] if messages else None
        self.show_thinking(status)
        for approval in status.pending_approvals:
            if approval.call_id not in self.asked:
                await self.ask_approval(approval, status.tenant_id)
        for question in status.pending_questions:
            if question.call_id not in self.asked:
                await self.ask_answer(question)

    def show_thinking(self, status: StatusView) -> None:
        last = self.last_shown
        if (
            status.state == "running"
            and last is not None
            and last.role in ("user", "tool")
            and not self.thinking_shown
        ):
            click.echo("  … model thinking")
            self.thinking_shown = True

    async def ask_inline(self, prompt: str) -> str:
        line = await self.lines.ask(prompt)
        if line is None:
            raise Detached()
        return line.strip()

    async def show_decided(self, status: StatusView) -> None:
        """Say how each approval that stopped pending was decided: here, or by someone elsewhere."""
        still = {a.call_id for a in status.pending_approvals}
        for call_id in [c for c in self.pending if c not in still]:
            approval = self.pending.pop(call_id)
            decision = await decision_of(self.workflow_id, call_id)
            if decision is None:
                click.echo(f"  ⌛ {call_id} {approval.tool}: no longer pending (expired)")
            else:
                past = "approved" if decision.decision == "approve" else "rejected"
                click.echo(f"  ✓ {past} {call_id}: {approval.tool} by {decision.approver}")
                if decision.reason or decision.changes:  # what they changed, and why
                    why = decision.approver, decision.decision, decision.reason, decision.changes
                    click.echo(f"    {decision_note(*why)}")

    async def may_decide(self, tenant_id: str, approval: PendingApproval) -> bool:
        """Whether the workflow would accept this person's approval (the same rule, from the database)."""
        if self.roles is None:
            self.roles = await roles_of(tenant_id, self.user)
        refusal = approver_refusal("approve", approval.risk, approval.requested_by, self.user, self.roles)
        return refusal is None

    async def ask_approval(self, approval: PendingApproval, tenant_id: str) -> None:
        self.asked.add(approval.call_id)
        self.pending[approval.call_id] = approval
        click.echo(
            f"  ⏸ {approval.call_id} {approval.tool} {approval.args} needs approval"
            f" (risk {approval.risk}, requested by {approval.requested_by},"
            f" expires {relative(approval.expires_at)})"
            + (f"\n    {approval.hints}" if approval.hints else "")
        )
        await self.show_effect(approval.call_id)
        if not await self.may_decide(tenant_id, approval):
            click.echo(f"  waiting for a decision: {self.who_can_decide(approval)}")
            return
        answer = await self.ask_inline(
            f"  approve {approval.call_id} as {self.user}? [y]es / [n]o [reason] / [enter] leave it: "
        )
        word, _, reason = answer.partition(" ")
        kind = APPROVE_WORDS.get(word.lower())
        if kind is None:
            click.echo(f"  waiting for a decision: {self.who_can_decide(approval)}")
            return
        await self.decide(kind, approval.call_id, reason.strip() or None, approval)

    async def show_effect(self, call_id: str) -> None:
        """What the call will do, as the worker recorded it for its reviewers (the card's lines);
        nothing when the request is not recorded yet or the database cannot be read."""
        workflow_id = self.conversation or ""
        try:
            found = await recorded_effects([{"workflow_id": workflow_id, "call_id": call_id}])
        except (OSError, SQLAlchemyError):
            return
        recorded = found.get((workflow_id, call_id))
        if recorded is not None:
            click.echo(effect_block(recorded[0], workflow_id, call_id), nl=False)

    async def ask_answer(self, question: PendingQuestion) -> None:
        assert self.conversation is not None
        self.asked.add(question.call_id)
        click.echo(f"  ? {question.call_id} the agent asks: {question.question}")
        text = ""
        while not text:
            text = await self.ask_inline("  your answer: ")
        await self.port.answer(self.conversation, self.user, question.call_id, text)

    # --- decisions --------------------------------------------------------------------------

    async def decide(
        self, kind: DecisionKind, call_id: str, reason: str | None, approval: PendingApproval | None
    ) -> None:
        """Decide as the chat's user; a refusal is shown with who could decide instead."""
        decision = Decision(call_id=call_id, decision=kind, approver=self.user, reason=reason)
        try:  # signed mode: through the server, which proves who decides
            recorded = await self.port.decide(self.workflow_id, decision)
        except click.ClickException as refused:
            click.echo(f"  ✗ {refused.message}")
            if approval is not None:
                click.echo(f"  still waiting: {self.who_can_decide(approval)}")
            return
        self.pending.pop(call_id, None)
        past = "approved" if kind == "approve" else "rejected"
        click.echo(f"  ✓ {past} {call_id}: {recorded.tool} by {recorded.decided_by}")

    def who_can_decide(self, approval: PendingApproval) -> str:
        line = f"{command()} approve {self.workflow_id} {approval.call_id} --as USER"
        return f"{who_can_decide(approval)} can run `{line}`"

    # --- commands (each answers whether the chat goes on) -----------------------------------

    def started(self) -> bool:
        if self.conversation is None:
            click.echo("no conversation yet: type a message to start one")
        return self.conversation is not None

    async def show_status(self, _: str) -> bool:
        if self.started():
            assert self.conversation is not None
            click.echo(render_status(self.conversation, await self.port.status(self.conversation)))
        return True

    async def show_transcript(self, _: str) -> bool:
        if self.started():
            assert self.conversation is not None
            messages = await self.port.transcript(self.conversation)
            click.echo(render_transcript(messages, scripted=self.port.scripted))
        return True

    async def decide_command(self, kind: DecisionKind, rest: str) -> bool:
        call_id, _, reason = rest.partition(" ")
        if not call_id:
            click.echo(f"usage: /{kind} CALL_ID [reason]")
        elif self.started():
            assert self.conversation is not None
            pending = {p.call_id: p for p in (await self.port.status(self.conversation)).pending_approvals}
            await self.decide(kind, call_id, reason.strip() or None, pending.get(call_id))
        return True

    async def rollback(self, rest: str) -> bool:
        words = rest.split()
        scope, call_id = (words[0] if words else "turn"), (words[1] if len(words) > 1 else None)
        if (
            not self.started()
            or scope not in ("turn", "conversation", "call")
            or (scope == "call") != bool(call_id)
        ):
            click.echo(
                "usage: /rollback [turn|conversation|call CALL_ID] (once the conversation has started)"
            )
            return True
        assert self.conversation is not None
        request = RollbackRequest.model_validate(
            {"requested_by": self.user, "scope": scope, "call_id": call_id}
        )
        try:
            entries = await self.port.rollback(self.conversation, request)
        except TimeoutError as err:
            click.echo(str(err))
            return True
        if entries is None:  # through the server: it runs between turns
            click.echo(f"rollback ({scope}) sent: it runs between turns")
            return True
        for e in entries:
            click.echo(f"↶ {e.call_id} {e.tool}: {e.state} ({undo_why(e.state, e.error)})")
        if not entries:
            click.echo("nothing to undo in that scope")
        return True

    async def end(self, _: str) -> bool:
        if self.started():
            assert self.conversation is not None
            await self.port.end(self.conversation, self.user)
            click.echo(f"ended conversation {self.conversation}")
        return False

    async def quit(self, _: str) -> bool:
        if self.conversation is not None:
            click.echo(f"left conversation {self.conversation}; it goes on. {reattach(self.conversation)}")
        return False

    async def help(self, _: str) -> bool:
        click.echo(HELP)
        return True


async def chat_session(start: StartConversation | None, workflow_id: str | None, user: str | None) -> None:
    database_url = load_settings().database_url  # the conversation's events are read there
    port = conversation_client(user, start.tenant_id if start else None)  # signed: as the person logged in
    lines = Lines()
    lines.open()
    if port.scripted:
        click.echo(f"{SCRIPTED_LABEL} (no real LLM configured: replies come from a scenario file)")
    if workflow_id is not None:
        user = user or port.person or conversation_user(await port.transcript(workflow_id))
        if user is None:
            raise click.ClickException(f"cannot tell whose conversation {workflow_id} is: give --user")
    assert user is not None
    session = Chat(port, lines, user, start, database_url)
    click.echo("type a message; /help lists the commands")
    try:
        if workflow_id is not None:
            await session.attach(workflow_id)
        await session.repl()
    except (Detached, asyncio.CancelledError) as left:
        if session.conversation is not None:
            click.echo(f"\ndetached; the conversation goes on. {reattach(session.workflow_id)}")
        if isinstance(left, asyncio.CancelledError):
            raise
    finally:
        lines.close()


@cli.command()
@click.option("--tenant", help="Tenant slug, e.g. acme.")
@click.option(
    "--user", help="Who you are, e.g. alice (with --workflow: taken from the conversation if not given)."
)
@click.option("--agent", help="Agent name, e.g. lead-qualifier.")
@click.option(
    "--workflow", "workflow_id", help="Re-attach to a running conversation instead of starting one."
)
@click.option(
    "--limits", "limits_json", help="Limits for a new conversation as JSON, e.g. '{\"max_iterations\": 4}'."
)
def chat(
    tenant: str | None, user: str | None, agent: str | None, workflow_id: str | None, limits_json: str | None
) -> None:
    """Chat with an agent: see its progress, decide approvals and answer its questions inline."""
    start = None
    if workflow_id is None:
        if not (tenant and user and agent):
            raise click.UsageError("give --tenant, --user and --agent, or --workflow WF to re-attach")
        start = StartConversation(
            tenant_id=tenant, user_id=user, agent=agent, limits=parse_limits(limits_json)
        )
    run(chat_session(start, workflow_id, user))
