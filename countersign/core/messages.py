"""The chat messages the workflow keeps and the model activity's input and output.

They mirror the OpenAI chat-completions wire format closely enough to convert one-to-one, but are
pydantic models so they travel through Temporal payloads typed and validated.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from countersign.core.conversation_ref import ConversationRef

Role = Literal["system", "user", "assistant", "tool"]


# What one model reply may put into a conversation. Whatever a workflow carries travels in payloads
# of at most 2 MB (the server's limit): a model that sends megabytes must get an error envelope,
# not a conversation stuck on a payload that can never be written.
MAX_TOOL_NAME_CHARS = 64  # OpenAI's own limit on function names
MAX_ARGUMENTS_CHARS = 64_000  # the largest real arguments (an email body) are about 20 000
MAX_REPLY_CHARS = 256_000
KEPT_CHARS = 1_000  # of oversized arguments, kept for the transcript and the audit


class ToolCall(BaseModel):
    """One tool call the model asked for. `arguments` is the raw JSON text: it may be invalid."""

    id: str
    name: str
    arguments: str = "{}"
    # Set when the model sent more than MAX_ARGUMENTS_CHARS: how many it sent (`arguments` then
    # keeps the first KEPT_CHARS only, and the call is refused with VALIDATION_ERROR).
    arguments_chars: int | None = None

    @classmethod
    def capped(cls, id: str, name: str, arguments: str) -> ToolCall:
        """The call as a model sent it, with its name and arguments cut to what a payload holds."""
        if len(name) > MAX_TOOL_NAME_CHARS:
            name = f"{name[:MAX_TOOL_NAME_CHARS]}...({len(name)} characters)"
        if len(arguments) <= MAX_ARGUMENTS_CHARS:
            return cls(id=id, name=name, arguments=arguments)
        return cls(id=id, name=name, arguments=arguments[:KEPT_CHARS], arguments_chars=len(arguments))


def capped_reply(content: str) -> str:
    if len(content) <= MAX_REPLY_CHARS:
        return content
    return f"{content[:MAX_REPLY_CHARS]}\n[truncated: the model replied {len(content)} characters]"


class ChatMessage(BaseModel):
    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None  # role == "tool": the call this message answers
    name: str | None = None  # role == "tool": the tool's name; role == "user": the user id

    def to_openai(self) -> dict[str, Any]:
        """The message as the OpenAI API expects it."""
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.role == "tool":
            msg["tool_call_id"] = self.tool_call_id
        return msg


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def plus(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            model_calls=self.model_calls + other.model_calls,
            tool_calls=self.tool_calls + other.tool_calls,
        )


class ModelCaller(BaseModel):
    """Whose turn a model call serves: the usage audit (`model_calls`) and the token metrics by
    agent are keyed on it. Never sent to the model."""

    tenant_id: str
    agent: str
    turn: int


class StoredInput(ConversationRef):
    """A model call whose messages the activity loads from the conversation store: the sequence
    numbers the workflow chose, where to store the reply, and the tools offered by name."""

    seqs: list[int]
    reply_seq: int
    call_seq: int = 0  # the reply's tool calls are stored numbered from c{call_seq + 1} (see numbered)
    tool_names: list[str] = Field(default_factory=list)  # native tools: the worker has their schemas
    # MCP tools' definitions as offered: their schemas come from the snapshot, not from this worker
    mcp_tools: list[dict[str, Any]] = Field(default_factory=list)
    # Direct mode (countersign.core.direct): no tools, and the model told how to ask for them
    direct: bool = False


def numbered(message: ChatMessage, after: int) -> ChatMessage:
    """`message` with its tool calls given conversation-wide ids `c{after+1}`, `c{after+2}`, …:
    reviewers type these, the audit and idempotency keys use them, and a model's own ids may
    repeat across turns."""
    calls = [c.model_copy(update={"id": f"c{after + i}"}) for i, c in enumerate(message.tool_calls, 1)]
    return message.model_copy(update={"tool_calls": calls})


class ModelRequest(BaseModel):
    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)  # OpenAI "tools" entries
    max_tokens: int | None = None
    caller: ModelCaller | None = None  # None in histories recorded before the usage audit
    # The agent asking, sent as a header the scripted model picks its script by (empty in older histories).
    agent: str = ""
    stored: StoredInput | None = None  # conversations since the message store: `messages` stays empty


class ModelReply(BaseModel):
    message: ChatMessage  # always role == "assistant"
    usage: Usage
    finish_reason: str | None = None
    model: str = ""
