"""Pure rules of the conversation: labels, how a failure reads, which write failed.

Plain functions over plain values (no workflow calls), tested without a server
(tests/workflows/test_workflow_rules.py).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from countersign.core.approvals import Approval
    from countersign.core.bounds import loads_bounded, storable
    from countersign.core.calls import StoredResult, ToolSpec
    from countersign.core.contract import AgentState, ConversationContext, PendingQuestion, TurnStop
    from countersign.core.markdown import escape_markdown
    from countersign.core.messages import ToolCall, Usage
    from countersign.core.summaries import usage_line

# A write whose result carries one of these failed for good (not a refusal, a question or a limit).
FAILED_WRITE_CODES = frozenset({"INTERNAL_ERROR", "CONFLICT", "NOT_FOUND"})


def call_summary(tool: str, arguments: str) -> str:
    """A one-line label for the Web UI: `get_lead jane.doe@example.com`. Never raises: the
    arguments come from the model (bounded parsing, countersign.core.bounds)."""
    args, refusal = loads_bounded(arguments)
    if refusal is not None:
        values = "(invalid JSON arguments)"
    else:
        values = (
            " ".join(str(v)[:200] for v in args.values() if v is not None) if isinstance(args, dict) else ""
        )
    # encodable: a lone surrogate from the model's `"\\ud800"` would fail every workflow task
    return storable(f"{tool} {escape_markdown(values[:200])}"[:400].strip())


def error_text(err: ActivityError) -> str:
    """What an activity that failed for good says: its application error's message, else its cause."""
    return err.cause.message if isinstance(err.cause, ApplicationError) else str(err.cause or err)


def turn_failure(what: str, err: ActivityError) -> tuple[TurnStop, str]:
    """How an activity that failed for good ends the turn (never the workflow)."""
    if isinstance(err.cause, TemporalTimeoutError):
        return "limit_reached", f"LIMIT_REACHED: the {what} did not finish within turn_timeout_s."
    if isinstance(err.cause, ApplicationError) and err.cause.type == "LimitReached":  # a budget
        return "limit_reached", f"{err.cause.message}."
    return "error", f"The turn stopped: the {what} failed ({error_text(err)})."


def execution_failure(err: ActivityError) -> str:
    """Why a tool call's activity failed for good, without internals: an unreachable database (after
    its retries), a timeout, or a statement the database refused (activities/failures.py; its
    transaction, effect included, rolled back)."""
    if isinstance(err.cause, TemporalTimeoutError):
        return "timed out"
    if isinstance(err.cause, ApplicationError) and err.cause.type == "DatabaseRefused":
        return "was refused by the database"
    return "could not reach the database"


def failed_write(
    tools: dict[str, ToolSpec], calls: list[ToolCall], results: list[StoredResult]
) -> str | None:
    """The first write of this batch that failed for good (not a refusal or a question), if any."""
    for call, result in zip(calls, results, strict=True):
        spec = tools.get(call.name)
        if spec is not None and spec.category != "read" and result.code in FAILED_WRITE_CODES:
            return f"{call.id} {call.name}"
    return None


def call_details(tool: str, arguments: str) -> str:
    """A pending call's arguments for the Web UI's details, each named and apart:
    `update_lead_status` · lead: jane.doe@example.com · new_status: qualified. Never raises."""
    args, refusal = loads_bounded(arguments)
    if refusal is not None or not isinstance(args, dict):
        return f"`{tool}` (arguments not a JSON object)"
    named = [
        f"{escape_markdown(str(k)[:60])}: {escape_markdown(str(v)[:120])}" for k, v in list(args.items())[:12]
    ]
    return " · ".join([f"`{tool}`", *named])[:800]


def status_details(
    state: AgentState,
    turn: int,
    context: ConversationContext | None,
    usage: Usage,
    approvals: list[Approval],
    questions: list[PendingQuestion],
) -> str:
    """The Web UI's details of a conversation: state, who, usage, then what waits for people."""
    who = f"{context.tenant_id}/{context.user_id} · agent {context.agent.name}" if context else ""
    head = (
        f"**{state}** · turn {turn} · {who}\n\n"
        f"usage: {usage_line(usage.model_calls, usage.tool_calls, usage.total_tokens)}"
    )
    waiting = [
        f"- awaiting approval: `{a.call_id}` {call_details(a.tool, a.args)} "
        f"(risk {a.risk}, expires {a.expires_at:%Y-%m-%d %H:%M} UTC)" + (f" · {a.hints}" if a.hints else "")
        for a in approvals
        if a.state == "pending"
    ]
    waiting += [f"- awaiting answer: `{q.call_id}` {escape_markdown(q.question)}" for q in questions]
    return head + ("\n\n" + "\n".join(waiting) if waiting else "")


def turn_wait_refusal(turn: int, started: int, queued: int) -> str | None:
    """Why `wait_turn(turn)` is refused (its validator), if it is: a turn is waited for only once
    it has been asked for (`started` turns begun, `queued` messages waiting or being checked) or
    is the next one, so that every accepted wait ends with a turn, an end or a continue-as-new:
    none is left in flight for a turn nobody asked for."""
    if turn < 1:
        return f"turns count from 1, not {turn}"
    if turn > started + queued + 1:
        return f"turn {turn} has not been asked for ({started} begun, {queued} waiting)"
    return None
