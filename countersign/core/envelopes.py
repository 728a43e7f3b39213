"""The conversation store's pure side: what workflow history carries of a message, and which
messages the model sees.

Message bodies live in PostgreSQL (`conversation_messages`, by sequence number); the workflow keeps
an `Envelope` per message (sequence number, role, ids, tool name, error code, estimated tokens)
and decides from envelopes alone which sequence numbers a model call gets, so replaying a
conversation needs no database. Continue-as-new carries a `Cursor`, never a transcript.

Window rule: the system prompt (seq 0) and the running summary always; then the newest messages
that fit the agent's `WindowPolicy` (messages and estimated tokens), taken in units that never
separate a tool result from the assistant message that called it; the newest unit always.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from countersign.core.calls import StoredResult, ToolInvocation, ToolResult, queued_emails, result_for_model
from countersign.core.conversation_ref import ConversationRef
from countersign.core.messages import ChatMessage, Role, Usage

PROMPT_SEQ = 0  # the system prompt, stored when the conversation starts
# Without a policy row the model sees at most this many messages (what continue-as-new used to carry).
DEFAULT_WINDOW_MESSAGES = 200
CHARS_PER_TOKEN = 4  # the usual estimate for English text; the model's own count comes back in usage
ANSWERED_KEPT = 200  # message ids remembered across continue-as-new (the store refuses older ones)
SUMMARY_NAME = "summary"  # `name` of the running summary's system message


class WindowPolicy(BaseModel):
    """An agent's row of `context_policies` (countersign.db.schema.ContextPolicy): the window the
    model sees and the conversation's token budget; None: no bound."""

    window_messages: int | None = Field(None, ge=1)
    window_tokens: int | None = Field(None, ge=1)
    summarize: bool = False
    conversation_tokens: int | None = Field(None, ge=1)  # prompt + completion, all turns


class Envelope(BaseModel):
    """What the workflow keeps of one stored message: never its body."""

    seq: int
    role: Role
    tokens: int = 0  # estimated from the body when it was stored
    call_ids: list[str] = Field(default_factory=list)  # assistant: the tool calls it made
    tool_call_id: str | None = None  # tool: the call it answers
    name: str | None = None  # tool: the tool; user: the user id
    error: str | None = None  # tool: the error code of a failed result


class Cursor(BaseModel):
    """What a conversation carries into its next run instead of its transcript."""

    next_seq: int
    recent: list[Envelope] = Field(default_factory=list)  # the current window
    summary_seq: int | None = None
    answered: dict[str, int] = Field(default_factory=dict)  # message id -> the turn that answered it


class StoredMessage(BaseModel):
    """One message to append, as an activity receives it (never in workflow history: the activity
    that appends user and tool messages is local, and local activity inputs are not recorded)."""

    seq: int
    message: ChatMessage
    message_id: str | None = None


class AppendMessages(ConversationRef):
    messages: list[StoredMessage]


class RepliedTurn(BaseModel):
    """Which turn answered a user message in an earlier run (`Cursor.answered`): its reply is
    read back from the store."""

    workflow_id: str
    conversation_id: str = ""  # the conversation instance (countersign.db.schema.Conversation)
    message_id: str
    turn: int


class SummaryRequest(ConversationRef):
    """Fold the messages `seqs` (and the previous summary, if any) into a new summary at `seq`."""

    seq: int
    previous: int | None
    seqs: list[int]
    agent: str = ""  # sent as the scripted model's agent header, like a turn's model calls


def estimate_tokens(message: ChatMessage) -> int:
    chars = len(message.content or "") + sum(len(c.name) + len(c.arguments) for c in message.tool_calls)
    return chars // CHARS_PER_TOKEN + 1


def message_envelope(seq: int, message: ChatMessage, error: str | None = None) -> Envelope:
    return Envelope(
        seq=seq,
        role=message.role,
        tokens=estimate_tokens(message),
        call_ids=[c.id for c in message.tool_calls],
        tool_call_id=message.tool_call_id,
        name=message.name,
        error=error,
    )


def tool_message(invocation: ToolInvocation, result: ToolResult) -> tuple[StoredMessage, StoredResult]:
    """The tool message a call's result becomes (at `invocation.store_seq`) and the envelope the
    workflow keeps of it. The same pure function for the activity that stores a result it produced
    and for the workflow's own refusals, so both count tokens and queued emails alike."""
    seq = invocation.store_seq if invocation.store_seq is not None else -1
    answer = result_for_model(invocation, result)
    message = ChatMessage(
        role="tool", tool_call_id=invocation.call_id, name=invocation.tool, content=answer.to_content()
    )
    data = result.data if result.ok and isinstance(result.data, dict) else {}
    stored = StoredResult(
        seq=seq,
        call_id=invocation.call_id,
        tool=invocation.tool,
        ok=result.ok,
        code=result.code,
        needs=sorted(result.needs) if result.needs is not None else None,
        tokens=estimate_tokens(message),
        outbox=queued_emails(invocation.tool, data),
    )
    return StoredMessage(seq=seq, message=message), stored


def stored_envelope(result: StoredResult) -> Envelope:
    """The window's envelope of a stored tool result (as `message_envelope` its message would be)."""
    return Envelope(
        seq=result.seq,
        role="tool",
        tokens=result.tokens,
        tool_call_id=result.call_id,
        name=result.tool,
        error=result.code,
    )


def units(log: list[Envelope]) -> list[list[Envelope]]:
    """The log in units the window keeps or drops whole: an assistant message with the tool results
    answering its calls, or any other single message."""
    groups: list[list[Envelope]] = []
    open_calls: set[str] = set()
    for envelope in log:
        if envelope.role == "tool" and envelope.tool_call_id in open_calls and groups:
            groups[-1].append(envelope)
            continue
        groups.append([envelope])
        open_calls = set(envelope.call_ids)
    return groups


def select_window(log: list[Envelope], policy: WindowPolicy, fold: bool = False) -> list[Envelope]:
    """The newest messages of `log` the policy lets the model see (the newest unit always).

    `fold`: messages are about to be folded into the summary: keep half the window, so that the
    next summary is due only after half a window of new messages, not at every model call."""
    share = 2 if fold else 1
    max_messages = (policy.window_messages or DEFAULT_WINDOW_MESSAGES) // share or 1
    max_tokens = policy.window_tokens // share or 1 if policy.window_tokens is not None else None
    kept: list[Envelope] = []
    tokens = 0
    for unit in reversed(units(log)):
        unit_tokens = sum(e.tokens for e in unit)
        over_messages = len(kept) + len(unit) > max_messages
        over_tokens = max_tokens is not None and tokens + unit_tokens > max_tokens
        if kept and (over_messages or over_tokens):
            break
        kept[:0] = unit
        tokens += unit_tokens
    return kept


def budget_refusal(policy: WindowPolicy, used_tokens: int) -> str | None:
    """Why the conversation may not call the model again, or None when it may."""
    if policy.conversation_tokens is not None and used_tokens >= policy.conversation_tokens:
        return (
            f"the conversation used {used_tokens} tokens, its budget is {policy.conversation_tokens} "
            "(context_policies.conversation_tokens)"
        )
    return None


def remember_answer(answered: dict[str, int], message_id: str, turn: int) -> None:
    """Remember that `turn` answered `message_id`, forgetting the oldest beyond ANSWERED_KEPT."""
    answered[message_id] = turn
    while len(answered) > ANSWERED_KEPT:
        del answered[next(iter(answered))]


class Summarized(BaseModel):
    """The summarizing call's outcome: its usage and the summary's estimated tokens (not its text)."""

    usage: Usage
    tokens: int


def describe_policy(policy: WindowPolicy | None) -> str:
    """One line for `permissions show` and `status`."""
    if policy is None:
        return f"context: last {DEFAULT_WINDOW_MESSAGES} messages (no context_policies row)"
    window = f"last {policy.window_messages or DEFAULT_WINDOW_MESSAGES} messages"
    window += f", at most {policy.window_tokens} tokens" if policy.window_tokens else ""
    summary = ", running summary of what falls out" if policy.summarize else ""
    budget = policy.conversation_tokens
    return f"context: {window}{summary}; budget per conversation: {f'{budget} tokens' if budget else 'none'}"
