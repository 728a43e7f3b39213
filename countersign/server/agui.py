"""`POST /api/conversations/{workflow_id}/agui`: a conversation's runs as AG-UI 1.0 (ag-ui-protocol).

An AG-UI client posts a `RunAgentInput` whose `threadId` is the conversation's workflow id and
gets the run as AG-UI events over SSE. Nothing here runs a turn: a run is what the conversation API
already does, read back from the conversation's events (countersign.server.conversation_events,
the rows the activities write), translated one by one into AG-UI's events:

- a run with a new user message (the last of `messages`) sends it as `POST …/messages` does (the
  conversation's user, a proof minted here); one with `resume` entries decides through the inbox's
  own path (`Inbox.decide`: the signed-in person, their roles from PostgreSQL, never their own
  call, a proof minted here) or answers a question as `POST …/answers/{call_id}` does;
- the model's text streams as TEXT_MESSAGE_START/CONTENT/END, a tool call as TOOL_CALL_START/ARGS/
  END and its result as TOOL_CALL_RESULT, the conversation's state as STATE_SNAPSHOT (at the start
  and before the end) and STATE_DELTA (an approval's state), an approval's or rollback's details
  as CUSTOM events;
- the run ends when its turn replies (RUN_FINISHED, success; RUN_ERROR for a turn that failed),
  when the conversation waits for a person (RUN_FINISHED with AG-UI 1.0's interrupt outcome: one
  `Interrupt` per pending approval or question, its id the call's id), or when the conversation
  ends without a reply (the cancelled outcome).

AG-UI 1.0 has its own interrupt shape, and this is it: a client resumes with a new run whose
`resume` holds a `ResumeEntry` per interrupt. An approval's payload is `{"approved": bool,
"reason"?, "editedArgs"?}` (the convention the protocol's `approveWithEdits` capability names); a
question's is `{"text"}`. `status: "cancelled"` decides nothing: the call waits for another
reviewer (the inbox), and the run follows the conversation until it moves on.

The input is checked at the edge as the conversation API's bodies are: the package's model, then no
field it does not name (the package keeps unknown fields; the project's edges refuse them), `tools`
and `context` empty (the agent's tools and context are the server's), ids bounded. `state` and
`forwardedProps` are accepted and never read: the conversation's state is the server's, told to
the client, not taken from it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    CustomEvent,
    Interrupt,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio.service import RPCError

from countersign.core.bounds import Identifier, Reason, Text
from countersign.core.contract import StatusView
from countersign.db.events import Event
from countersign.db.messages import ConversationStore
from countersign.db.schema import Conversation
from countersign.server.conversation_events import woken_or_idle, workflow_closed
from countersign.server.door import EVENTS, REQUESTERS, admits_itself, liveness, on_conversation, recorded
from countersign.server.http import REVIEWER, SSE_HEADERS, HttpRefusal, invalid_request, parse
from countersign.server.inbox import DecisionRequest, Inbox
from countersign.server.inbox_routes import INBOX
from countersign.server.requesters import AnswerBody, Caller, MessageBody, Requesters

APPROVAL = "tool_approval"  # an interrupt's reason: a tool call waits for a reviewer
QUESTION = "question"  # an interrupt's reason: an `ask_human` call waits for the user's answer
MAX_RESUME = 100  # resume entries in one run (the inbox's batch decides at most as many)
ENCODER = EventEncoder()

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 2000},
        "editedArgs": {"type": "object", "description": "approve with these arguments instead"},
    },
    "required": ["approved"],
    "additionalProperties": False,
}
QUESTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


# --- what a client sends (checked at the edge: 422 otherwise) ---------------------------------------


class ApprovalAnswer(BaseModel):
    """A resume entry's payload for a tool approval."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    approved: bool
    reason: Reason | None = None
    edited_args: dict[str, Any] | None = Field(None, alias="editedArgs")


class QuestionAnswer(BaseModel):
    """A resume entry's payload for a question."""

    model_config = ConfigDict(extra="forbid")

    text: Text


@dataclass(frozen=True)
class Run:
    """A checked `RunAgentInput`: a new message to send, or resume entries to apply."""

    thread_id: str
    run_id: str
    message: MessageBody | None = None
    resume: tuple[ResumeEntry, ...] = ()


class Ids(BaseModel):
    """The ids a run names, bounded as every id at the edge is (200 characters, no control ones)."""

    run_id: Identifier
    interrupt_ids: list[Identifier] = Field(default_factory=list, max_length=MAX_RESUME)


def unknown_field(model: BaseModel) -> str | None:
    """Where the first field that no AG-UI model names is, as `where: name` (None: there is none).
    The package's models keep unknown fields (`extra="allow"`); an edge here refuses them."""
    stack: list[tuple[Any, str]] = [(model, "")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, BaseModel):
            if node.model_extra:
                return f"{at or 'body'}: {next(iter(node.model_extra))}"
            for name, info in type(node).model_fields.items():
                stack.append((getattr(node, name), f"{at}.{info.alias or name}".lstrip(".")))
        elif isinstance(node, list):
            stack.extend((value, f"{at}.{i}") for i, value in enumerate(node))
    return None


def run_of(body: RunAgentInput, workflow_id: str) -> Run:
    """What a run asks, or HttpRefusal 422 naming what is wrong with it."""
    if (where := unknown_field(body)) is not None:
        raise HttpRefusal(422, f"invalid request: unknown field {where}")
    if body.thread_id != workflow_id:
        raise HttpRefusal(422, f"invalid request: threadId is the conversation's id, {workflow_id}")
    if body.tools:
        raise HttpRefusal(422, "invalid request: tools: the agent's tools are the server's; send none")
    if body.context:
        raise HttpRefusal(422, "invalid request: context: the agent's context is the server's; send none")
    interrupt_ids = [entry.interrupt_id for entry in body.resume or []]
    try:
        run_id = Ids(run_id=body.run_id, interrupt_ids=interrupt_ids).run_id
    except ValidationError as err:
        raise invalid_request(err) from None
    if body.resume:
        if len(set(interrupt_ids)) != len(interrupt_ids):
            raise HttpRefusal(422, "invalid request: resume: one entry per interrupt")
        for entry in body.resume:  # every payload checked before anything is decided
            payload_of(entry)
        return Run(thread_id=workflow_id, run_id=run_id, resume=tuple(body.resume))
    last = body.messages[-1] if body.messages else None
    if not isinstance(last, UserMessage) or not isinstance(last.content, str):
        raise HttpRefusal(
            422, "invalid request: messages: a run without resume ends with the user's new text message"
        )
    try:
        message = MessageBody(text=last.content, message_id=last.id)
    except ValidationError as err:
        raise invalid_request(err) from None
    return Run(thread_id=workflow_id, run_id=run_id, message=message)


def payload_of(entry: ResumeEntry) -> ApprovalAnswer | QuestionAnswer | None:
    """A resolved entry's payload (an approval's or a question's answer); None when cancelled."""
    if entry.status == "cancelled":
        return None
    raw = entry.payload if isinstance(entry.payload, dict) else {}
    question = "text" in raw and "approved" not in raw  # which interrupt it answers is checked later
    model: type[ApprovalAnswer | QuestionAnswer] = QuestionAnswer if question else ApprovalAnswer
    try:
        answer = model.model_validate(entry.payload)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        raise HttpRefusal(
            422, f"invalid request: resume {entry.interrupt_id}: {where}: {first['msg']}"
        ) from None
    if isinstance(answer, ApprovalAnswer) and answer.edited_args is not None and not answer.approved:
        raise HttpRefusal(
            422, f"invalid request: resume {entry.interrupt_id}: editedArgs come with an approval"
        )
    return answer


# --- from the conversation's events to AG-UI's (pure) ------------------------------------------------


def pointer(key: str) -> str:
    """A key as a JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def state_of(status: StatusView) -> dict[str, Any]:
    """The run's AG-UI state: the conversation's, as its `status` query says."""
    return {
        "state": status.state,
        "turn": status.turn,
        "approvals": {p.call_id: "pending" for p in status.pending_approvals},
        "questions": {q.call_id: "pending" for q in status.pending_questions},
    }


@dataclass
class Translated:
    events: list[BaseEvent] = field(default_factory=list)
    asks: bool = False  # an approval or a question now waits: the run may have to stop
    turn: dict[str, Any] | None = None  # the turn that ended, which ends the run


@dataclass
class Translator:
    """The conversation's events as AG-UI events. The model's text of one model call (`seq`) is one
    text message; a retried call (a newer attempt, or a `reset`) voids what was shown, which AG-UI
    cannot take back: that message is closed and the new text is a message of its own."""

    open: dict[int, str] = field(default_factory=dict)  # seq -> the text message being streamed
    shown: dict[str, str] = field(default_factory=dict)  # message id -> its text so far
    latest: dict[int, str] = field(default_factory=dict)  # seq -> its latest message id
    attempt: dict[int, int] = field(default_factory=dict)

    def translate(self, event: Event) -> Translated:
        data, out = event.data, Translated()
        if event.kind == "delta":
            out.events = list(self._delta(data))
        elif event.kind == "tool_call":
            call_id, args = str(data["call_id"]), data.get("args")
            text = args if isinstance(args, str) else json.dumps(args)
            out.events = [
                *self._close(int(data["seq"])),
                ToolCallStartEvent(
                    tool_call_id=call_id, tool_call_name=str(data["tool"]),
                    parent_message_id=self.latest.get(int(data["seq"]), f"reply-{data['seq']}"),
                ),
                ToolCallArgsEvent(tool_call_id=call_id, delta=text),
                ToolCallEndEvent(tool_call_id=call_id),
            ]  # fmt: skip
        elif event.kind == "tool_result":
            call_id = str(data["call_id"])
            told = {"ok": data.get("ok"), "summary": data.get("summary")}
            out.events = [
                ToolCallResultEvent(
                    message_id=f"result-{call_id}", tool_call_id=call_id, role="tool",
                    content=str(data.get("result", "")), metadata={"countersign": told},
                )
            ]  # fmt: skip
        elif event.kind == "approval":
            change = {
                "op": "add",
                "path": f"/approvals/{pointer(str(data['call_id']))}",
                "value": data["state"],
            }
            out.events = [
                StateDeltaEvent(delta=[change]),
                CustomEvent(name="countersign.approval", value=data),
            ]
            out.asks = data.get("state") == "pending"
        elif event.kind == "question":
            change = {"op": "add", "path": f"/questions/{pointer(str(data['call_id']))}", "value": "pending"}
            out.events, out.asks = [StateDeltaEvent(delta=[change])], True
        elif event.kind == "rollback":
            out.events = [CustomEvent(name="countersign.rollback", value=data)]
        elif event.kind == "turn":
            out.events, out.turn = list(self._reply(data)), data
        return out  # the user's own message ("message") is the client's already

    def _delta(self, data: dict[str, Any]) -> Iterator[BaseEvent]:
        seq, tried, text = int(data["seq"]), int(data["attempt"]), str(data.get("text", ""))
        if tried < self.attempt.get(seq, 0):
            return  # a late delta of an attempt that was retried
        if tried > self.attempt.get(seq, 0) or data.get("reset"):
            yield from self._close(seq)
        self.attempt[seq] = tried
        if not text:
            return
        if seq not in self.open:
            number = sum(1 for m in self.shown if m == f"reply-{seq}" or m.startswith(f"reply-{seq}-"))
            message_id = f"reply-{seq}" if number == 0 else f"reply-{seq}-{number}"
            self.open[seq], self.latest[seq], self.shown[message_id] = message_id, message_id, ""
            yield TextMessageStartEvent(message_id=message_id, role="assistant")
        self.shown[self.open[seq]] += text
        yield TextMessageContentEvent(message_id=self.open[seq], delta=text)

    def _reply(self, data: dict[str, Any]) -> Iterator[BaseEvent]:
        """A turn's reply: what streamed of it closed, the rest of it told (all of it, when nothing
        of it streamed: a model that does not stream)."""
        seq, reply = int(data["seq"]), str(data.get("reply") or "")
        if seq not in self.latest and reply:
            message_id = self.latest[seq] = f"reply-{seq}"
            yield TextMessageStartEvent(message_id=message_id, role="assistant")
            yield TextMessageContentEvent(message_id=message_id, delta=reply)
            yield TextMessageEndEvent(message_id=message_id)
            return
        if seq in self.open:
            shown = self.shown[self.open[seq]]
            if reply.startswith(shown) and len(reply) > len(shown):
                yield TextMessageContentEvent(message_id=self.open[seq], delta=reply[len(shown) :])
        yield from self._close(seq)

    def _close(self, seq: int) -> Iterator[BaseEvent]:
        if seq in self.open:
            yield TextMessageEndEvent(message_id=self.open.pop(seq))

    def close_all(self) -> list[BaseEvent]:
        return [event for seq in list(self.open) for event in self._close(seq)]


# --- a run over HTTP ------------------------------------------------------------------------------


def answered(entries: tuple[ResumeEntry, ...], status: StatusView) -> None:
    """HttpRefusal 409 when an entry names no interrupt that is open now."""
    waiting = {p.call_id for p in status.pending_approvals} | {q.call_id for q in status.pending_questions}
    for entry in entries:
        if entry.interrupt_id not in waiting:
            raise HttpRefusal(
                409, f"no open interrupt {entry.interrupt_id}: it was decided or answered, or never asked"
            )


async def resume(
    request: web.Request, caller: Caller, row: Conversation, run: Run, status: StatusView
) -> None:
    """Apply the resume entries in order, each through the path its kind has everywhere else: a
    decision through the inbox's (`Inbox.decide`), an answer through the conversation API's. The
    first refused stops the rest (its refusal is the answer); those before it stand."""
    answered(run.resume, status)
    questions = {q.call_id for q in status.pending_questions}
    requesters, inbox = request.app[REQUESTERS], request.app[INBOX]
    for entry in run.resume:
        payload = payload_of(entry)
        if payload is None:
            continue  # cancelled: nothing decided here; the run follows the conversation
        call_id = entry.interrupt_id
        if entry.interrupt_id in questions:
            if not isinstance(payload, QuestionAnswer):
                raise HttpRefusal(
                    422, f'invalid request: resume {call_id}: a question\'s answer is {{"text"}}'
                )
            if not caller.may_act_for(row.user_id):
                raise HttpRefusal(403, f"only {row.user_id} answers the questions of this conversation")
            await requesters.answer(caller, row, call_id, AnswerBody(text=payload.text))
            continue
        if not isinstance(payload, ApprovalAnswer):
            raise HttpRefusal(
                422, f'invalid request: resume {call_id}: an approval\'s answer is {{"approved"}}'
            )
        reviewer = request.get(REVIEWER)
        if reviewer is None:
            raise HttpRefusal(403, "a decision is a signed-in person's: an API token does not decide")
        decision = DecisionRequest(
            decision="approve" if payload.approved else "reject",
            reason=payload.reason,
            args=payload.edited_args,
        )
        await inbox.decide(reviewer, row.workflow_id, call_id, decision)


async def interrupts_of(
    inbox: Inbox, row: Conversation, status: StatusView, left: set[str]
) -> list[Interrupt]:
    """One interrupt per call that waits for a person, but those the run's client left to others
    (`left`: its cancelled resume entries). An approval's says what the call will do (the plan the
    reviewer decides, as the inbox's card shows it), a question's asks it."""
    found: list[Interrupt] = []
    for waiting in status.pending_approvals:
        if waiting.call_id in left:
            continue
        item = await inbox.recorded(row.tenant_id, row.workflow_id, waiting.call_id)
        effect = item.effect if item is not None else None
        does = effect.summary if effect is not None else f"{waiting.tool} {waiting.args}"
        told = {
            "workflow_id": row.workflow_id, "tool": waiting.tool, "risk": waiting.risk,
            "requested_by": waiting.requested_by, "args": waiting.args, "quorum": waiting.quorum,
            "effect_lines": item.effect_lines if item is not None else [],
            # a long line is folded with a visible mark; the rest of it is here (as on the card)
            "effect_folds": [f.model_dump() for f in item.effect_folds] if item is not None else [],
        }  # fmt: skip
        quorum = f" ({waiting.quorum})" if waiting.quorum else ""
        found.append(
            Interrupt(
                id=waiting.call_id, reason=APPROVAL, tool_call_id=waiting.call_id,
                message=f"{waiting.tool} needs a reviewer's approval{quorum}: {does}",
                response_schema=APPROVAL_SCHEMA, expires_at=waiting.expires_at,
                metadata={"countersign": told},
            )
        )  # fmt: skip
    for asked in status.pending_questions:
        if asked.call_id not in left:
            found.append(
                Interrupt(
                    id=asked.call_id, reason=QUESTION, tool_call_id=asked.call_id, message=asked.question,
                    response_schema=QUESTION_SCHEMA, expires_at=asked.expires_at,
                )
            )  # fmt: skip
    return found


@dataclass
class Follow:
    """One run's stream: the conversation's events after `after`, as AG-UI events, until the run
    ends (or the caller's session does, or the reader goes away)."""

    response: web.StreamResponse
    requesters: Requesters
    inbox: Inbox
    row: Conversation
    run: Run
    live: Callable[[], Awaitable[bool]]
    gone: Callable[[], bool]
    translator: Translator = field(default_factory=Translator)

    async def send(self, *events: BaseEvent) -> None:
        for event in events:
            await self.response.write(ENCODER.encode(event).encode())

    async def run_through(self, after: int, check_open: bool) -> None:
        run = self.run
        await self.send(
            RunStartedEvent(thread_id=run.thread_id, run_id=run.run_id, protocol_version=PROTOCOL_VERSION)
        )
        try:
            await self.send(StateSnapshotEvent(snapshot=state_of(await self.requesters.status(self.row))))
            await self._follow(after, check_open)
        except RPCError as err:  # Temporal out of reach mid-run: the run says so, in AG-UI's terms
            await self.send(
                *self.translator.close_all(),
                RunErrorEvent(message=f"Temporal: {err.message}", code="UNAVAILABLE"),
            )
        except HttpRefusal as err:  # the conversation is gone (404)
            await self.send(
                *self.translator.close_all(), RunErrorEvent(message=str(err), code=str(err.status))
            )

    async def _follow(self, after: int, check_open: bool) -> None:
        """Read on while events come; when none is new, see whether the run must stop: a person is
        asked (after an approval or a question event, at once for a resume, and on every
        keep-alive), or the conversation ended (after a rollback, and on every keep-alive)."""
        left = {e.interrupt_id for e in self.run.resume if e.status == "cancelled"}
        events, wf, due = self.requesters.events, self.row.workflow_id, None
        async with events.feed.watch(wf) as woken:
            check_closed = False
            while await self.live():
                batch = await events.log.after(wf, after)
                for event in batch:
                    after = event.id
                    translated = self.translator.translate(event)
                    await self.send(*translated.events)
                    if translated.turn is not None and await self._ours():
                        return await self._replied(translated.turn)
                    check_open = check_open or translated.asks
                    check_closed = check_closed or event.kind == "rollback"
                if batch:  # read until nothing is new; what was due is asked again
                    check_open, due = check_open or due is not None, None
                    continue
                if due is not None:
                    return await self._interrupted(*due)
                if check_open:
                    status = await self.requesters.status(self.row)
                    if interrupts := await interrupts_of(self.inbox, self.row, status, left):
                        due = status, interrupts  # once what was written before it is read
                        continue
                    check_open = False
                if check_closed and await workflow_closed(self.requesters.client, wf):
                    return await self._finish(RunFinishedCancelledOutcome())
                check_closed = False
                if not await woken_or_idle(woken, self.gone):  # quiet: a lost NOTIFY delays, never hangs
                    await self.response.write(b": keep-alive\n\n")
                    check_open = check_closed = True
            await self.send(
                *self.translator.close_all(), RunErrorEvent(message="the session ended", code="401")
            )

    async def _ours(self) -> bool:
        """Whether the turn that just ended is the run's: a resumed run's is the one it resumed; a
        new message's is the one that answered it (a turn already running when the message came,
        streamed before it, is not)."""
        if self.run.message is None:
            return True
        store, wf = ConversationStore(self.requesters.sessions), self.row.workflow_id
        answered = self.run.message.message_id or ""
        return await store.finished_turn(wf, await store.latest_instance(wf), answered) is not None

    async def _replied(self, turn: dict[str, Any]) -> None:
        if turn.get("stop") == "error":
            await self.send(
                RunErrorEvent(message=str(turn.get("reply") or "the turn failed"), code="TURN_ERROR")
            )
            return
        result = {key: turn.get(key) for key in ("turn", "reply", "stop")}
        await self._finish(RunFinishedSuccessOutcome(), result)

    async def _interrupted(self, status: StatusView, interrupts: list[Interrupt]) -> None:
        await self.send(*self.translator.close_all(), StateSnapshotEvent(snapshot=state_of(status)))
        await self._finish(RunFinishedInterruptOutcome(interrupts=interrupts), snapshot=False)

    async def _finish(self, outcome: Any, result: Any = None, snapshot: bool = True) -> None:
        await self.send(*self.translator.close_all())
        if snapshot:
            await self.send(StateSnapshotEvent(snapshot=state_of(await self.requesters.status(self.row))))
        run = self.run
        await self.send(
            RunFinishedEvent(thread_id=run.thread_id, run_id=run.run_id, outcome=outcome, result=result)
        )


async def started(request: web.Request, caller: Caller, row: Conversation, run: Run) -> int:
    """Send the run's message or apply its resume entries; the id of the conversation's latest event
    before that, after which the run's stream begins."""
    requesters = request.app[REQUESTERS]
    status = await requesters.status(row)
    after = await requesters.events.log.latest_id(row.workflow_id)
    if run.resume:
        await resume(request, caller, row, run, status)
        return after
    assert run.message is not None
    waits = [p.call_id for p in status.pending_approvals] + [q.call_id for q in status.pending_questions]
    if waits:  # its turn would wait behind theirs: AG-UI resumes an interrupted run first
        raise HttpRefusal(
            409, f"conversation {row.workflow_id} waits for {', '.join(waits)}: resume those interrupts first"
        )
    await requesters.send(row, run.message)
    return after


@admits_itself
async def agui_run(request: web.Request) -> web.StreamResponse:
    """One AG-UI 1.0 run of the conversation (body: a `RunAgentInput`, `threadId` the workflow id):
    its new message sent, or its `resume` entries decided, and the run streamed as AG-UI events
    until it replies or waits for a person (an interrupt). Its place among the person's open
    streams is taken before anything is sent or decided: a run refused at that bound did nothing."""
    with contextlib.ExitStack() as place:
        async with recorded(request, "agui") as record:
            run = run_of(await parse(request, RunAgentInput), request.match_info["workflow_id"])
            requesters, caller, row = await on_conversation(
                request, "message" if run.message is not None else "transcript", record
            )
            place.enter_context(request.app[EVENTS].opened(caller.tenant_id, requesters.actor(caller, row)))
            after = await started(request, caller, row, run)
        follow = Follow(
            response=web.StreamResponse(headers={**SSE_HEADERS, "Content-Type": ENCODER.get_content_type()}),
            requesters=requesters, inbox=request.app[INBOX], row=row, run=run, live=liveness(request, row),
            gone=lambda: request.transport is None or request.transport.is_closing(),
        )  # fmt: skip
        await follow.response.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the reader went away
            await follow.run_through(after, check_open=bool(run.resume))
    return follow.response


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/conversations/{workflow_id}/agui", agui_run)
