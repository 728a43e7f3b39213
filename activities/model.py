"""The model call: one chat completion through the `openai` client against any compatible endpoint.

The client's own retries are off (`max_retries=0`) so Temporal's retry policy is the only one, and
HTTP failures are mapped to what retrying can fix: 408/409/429/5xx and connection errors retry
(honouring `retry-after`), other 4xx are the request's fault and fail at once with a clear message.

The endpoint sits behind a circuit breaker, like the SMTP server (countersign/runtime/circuit.py): after
`failure_threshold` consecutive failures (connection errors, timeouts, 408/409/429/5xx, unusable
bodies) model calls fail fast with a retryable "ModelCircuitOpen" whose `next_retry_delay` is the
rest of the cool-down, instead of each conversation hammering an endpoint that is down. A 4xx that
is the request's fault means the endpoint answered: it counts as healthy.
"""

from __future__ import annotations

import functools
import math
import time
from datetime import timedelta
from typing import Any

import httpx
import openai
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import Choice, ChoiceDelta
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeats
from countersign.core.activity_refs import CALL_MODEL, SUMMARIZE_CONVERSATION
from countersign.core.bounds import storable
from countersign.core.direct import DIRECT_NOTE, marker, wants_tools
from countersign.core.envelopes import (
    AppendMessages,
    StoredMessage,
    Summarized,
    SummaryRequest,
    estimate_tokens,
    summary_input,
    summary_message,
)
from countersign.core.messages import (
    ChatMessage,
    ModelReply,
    ModelRequest,
    StoredInput,
    ToolCall,
    Usage,
    capped_reply,
    numbered,
)
from countersign.db.events import EventLog
from countersign.db.messages import ConversationStore
from countersign.observability.usage import elapsed_ms, model_call_row
from countersign.runtime.circuit import CircuitBreaker
from countersign.runtime.config import AGENT_HEADER, Settings
from tools.registry import REGISTRY, Tool

RETRYABLE_STATUS = frozenset({408, 409, 429})


def retry_after(exc: openai.APIStatusError) -> timedelta | None:
    """The delay the server asked for (`retry-after-ms`, else `retry-after` in seconds), if usable.

    A negative, infinite or unparsable value is ignored: Temporal's own backoff applies instead.
    """
    headers = exc.response.headers
    for name, unit_s in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            seconds = float(headers[name]) * unit_s
        except (KeyError, ValueError):
            continue
        if 0 <= seconds < math.inf:
            return timedelta(seconds=seconds)
    return None


def classify(exc: Exception) -> ApplicationError:
    """Turn an `openai` exception into a Temporal error that retries only when retrying can help."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in RETRYABLE_STATUS or status >= 500
        return ApplicationError(
            f"model endpoint answered HTTP {status}: {exc.message}",
            type=f"ModelHTTP{status}",
            non_retryable=not retryable,
            next_retry_delay=retry_after(exc) if retryable else None,
        )
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError | httpx.HTTPError):
        return ApplicationError(f"model endpoint unreachable: {exc}", type="ModelUnreachable")
    return ApplicationError(f"model answered something unusable: {exc}", type="ModelBadResponse")


def encodable(text: str) -> str:
    """JSON from a model may carry lone surrogates (`\\ud800`) that no payload can encode, and NUL
    that PostgreSQL cannot store (the reply is stored); both become U+FFFD, so the reply travels and
    its calls are refused and audited, instead of failing the model call on every retry."""
    return storable(text)


class Streamed:
    """A streamed completion put together chunk by chunk, as a real server may send it: the text in
    pieces, each tool call's id and name first and its arguments in pieces (joined by `index`), the
    finish reason, and usage in a last chunk whose choice list is empty (or no usage at all). The
    client does not validate chunks: anything of another shape is read defensively, and a stream
    that never carried a choice fails as a bad response."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.model = ""
        self.usage: CompletionUsage | None = None
        self.choices_seen = False

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Take one chunk in; the text it adds (for the readers)."""
        if not isinstance(chunk, ChatCompletionChunk):
            raise ValueError(f"stream chunk is not a completion chunk: {type(chunk).__name__}")
        self.model = chunk.model if isinstance(chunk.model, str) else self.model
        if isinstance(chunk.usage, CompletionUsage):
            self.usage = chunk.usage
        added = ""
        for choice in chunk.choices if isinstance(chunk.choices, list) else []:
            if getattr(choice, "index", 0) != 0:
                continue  # n > 1 was never asked for: only the first choice is the reply
            self.choices_seen = True
            self.finish_reason = choice.finish_reason or self.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            if isinstance(delta.content, str):
                added += delta.content
            for call in delta.tool_calls or []:
                slot = self.calls.setdefault(
                    call.index, {"id": "", "type": "function", "name": "", "arguments": ""}
                )
                slot["id"] = call.id or slot["id"]
                slot["type"] = call.type or slot["type"]
                if call.function is not None:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
        self.text.append(added)
        return added

    def reply(self) -> ModelReply:
        if not self.choices_seen:
            raise ValueError("completion has no choices")
        content = "".join(self.text)
        calls = [
            ToolCall.capped(c["id"], encodable(c["name"]), encodable(c["arguments"] or "{}"))
            for _, c in sorted(self.calls.items())
            if c["type"] == "function"
        ]
        has_text = content != "" or not calls
        usage = self.usage
        return bounded(
            ModelReply(
                message=ChatMessage(
                    role="assistant",
                    content=capped_reply(encodable(content)) if has_text else None,
                    tool_calls=calls,
                ),
                usage=Usage(
                    prompt_tokens=usage.prompt_tokens if usage else 0,
                    completion_tokens=usage.completion_tokens if usage else 0,
                    model_calls=1,
                ),
                finish_reason=self.finish_reason,
                model=self.model,
            )
        )


def as_chunk(completion: object) -> ChatCompletionChunk:
    """A whole completion as the single chunk that carries all of it (its message as the delta).
    The client does not validate bodies: another shape (`[]`, `null`, a choice without a message)
    fails here as a bad response, not as an AttributeError."""
    if not isinstance(completion, ChatCompletion) or not completion.choices:
        raise ValueError("completion has no choices")
    choices = []
    for choice in completion.choices:
        if choice.message is None:
            raise ValueError("completion choice has no message")
        message = choice.message
        calls = [
            {"index": i, "id": c.id, "type": c.type, "function": c.function.model_dump()}
            for i, c in enumerate(message.tool_calls or [])
            if c.type == "function"
        ]
        delta = ChoiceDelta.model_validate(
            {"role": "assistant", "content": message.content, "tool_calls": calls or None}
        )
        choices.append(
            Choice.model_construct(index=choice.index, delta=delta, finish_reason=choice.finish_reason)
        )
    return ChatCompletionChunk.model_construct(
        id=completion.id, object="chat.completion.chunk", created=completion.created, model=completion.model,
        choices=choices, usage=completion.usage,
    )  # fmt: skip


class DeltaPublisher:
    """Publishes a model call's text to the conversation's readers as it streams, a few chunks at a
    time (at most one event per `FLUSH_S`), tagged with the model call (`seq`, where its reply is
    stored) and the attempt. A retried attempt first says `reset`: what earlier attempts showed is
    void. Nothing here may fail the model call: a delta that cannot be written is dropped (the reply
    itself is stored, and the turn's events carry it)."""

    FLUSH_S = 0.05

    def __init__(self, events: EventLog, stored: StoredInput, attempt: int) -> None:
        self._events, self._stored = events, stored
        self._tag = {"seq": stored.reply_seq, "attempt": attempt}
        self._pending = ""
        self._last = 0.0

    async def start(self) -> None:
        if self._tag["attempt"] > 1:
            await self._write({"text": "", "reset": True, **self._tag})

    async def void(self) -> None:
        """Readers drop what this call showed (a reset, as for a retried attempt)."""
        self._pending = ""
        await self._write({"text": "", "reset": True, **self._tag})

    async def add(self, text: str) -> None:
        self._pending += text
        if self._pending and time.monotonic() - self._last >= self.FLUSH_S:
            await self.flush()

    async def flush(self) -> None:
        if self._pending:
            text, self._pending = self._pending, ""
            await self._write({"text": text, **self._tag})
        self._last = time.monotonic()

    async def _write(self, data: dict[str, Any]) -> None:
        try:
            stored = self._stored
            await self._events.publish(
                stored.workflow_id, stored.conversation_id, stored.tenant_id, "delta", data
            )
        except Exception:  # the database briefly unreachable: readers get the whole reply at the end
            activity.logger.warning(
                "a text delta of %s was not published", self._stored.workflow_id, exc_info=True
            )


# What one reply may weigh in workflow history: the server refuses a payload over MAX_PAYLOAD_BYTES
# (1 MiB, countersign.core.bounds; TMPRL1103) and fails the workflow task, and with it the turn, its
# usage uncounted. The rest leaves room for the activity's envelope.
MAX_REPLY_BYTES = 1_000_000
REPLY_TOO_LARGE = "reply_too_large"


def bounded(reply: ModelReply) -> ModelReply:
    """`reply`, or, when it weighs more than MAX_REPLY_BYTES (many tool calls of capped arguments,
    a capped content of 4-byte characters), a reply that says so and calls nothing, with the same
    usage: the turn ends with the reason, and the tokens the model spent are counted."""
    size = len(reply.message.model_dump_json().encode("utf-8", "replace"))
    if size <= MAX_REPLY_BYTES:
        return reply
    said = (
        f"[error: the model replied {size} bytes ({len(reply.message.tool_calls or [])} tool calls), "
        f"over the {MAX_REPLY_BYTES}-byte bound; none of it was used and this turn ends]"
    )
    return reply.model_copy(
        update={
            "message": ChatMessage(role="assistant", content=said, tool_calls=[]),
            "finish_reason": REPLY_TOO_LARGE,
        }
    )


def endpoint_failed(exc: Exception) -> bool:
    """Whether an error says the endpoint is unhealthy (as opposed to this request being wrong)."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return True


def with_direct_note(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The messages with direct mode's note at the end of the system prompt (the user's message
    stays the last one, where a model looks for what to answer)."""
    if messages and messages[0].role == "system":
        prompt = messages[0].model_copy(update={"content": f"{messages[0].content or ''}\n\n{DIRECT_NOTE}"})
        return [prompt, *messages[1:]]
    return [ChatMessage(role="system", content=DIRECT_NOTE), *messages]


@functools.cache
def native_tool(tool: Tool) -> dict[str, Any]:
    """The OpenAI definition of a registered tool, built once per tool: every stored model call
    offers its tools by name, and building a `ToolSpec` validated the schema again each time.
    Shared: do not mutate it (the client only reads it)."""
    return tool.spec().openai_tool()


class ModelActivities:
    """`store`: where conversations since the message store keep their messages (None: only
    requests that carry their messages are served)."""

    def __init__(
        self,
        settings: Settings,
        store: ConversationStore | None = None,
        *,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        if not settings.llm_base_url and settings.scripted_model:
            raise RuntimeError(
                "no model configured: set LLM_BASE_URL (and LLM_MODEL), or run `starter.py dev up`"
            )
        self._model = settings.llm_model
        self._stream = settings.llm_stream
        self._store = store
        self._client = openai.AsyncOpenAI(
            base_url=settings.llm_base_url, api_key=settings.llm_api_key, max_retries=0, timeout=110.0
        )
        self.breaker = breaker or CircuitBreaker(
            "model", failure_threshold=5, cool_down=settings.breaker_cool_down_s
        )

    @activity.defn(name=CALL_MODEL.name)
    @heartbeats
    async def call_model(self, request: ModelRequest) -> ModelReply:
        started = time.perf_counter()
        stored = request.stored
        if stored is None:
            return await self._complete(request.messages, request.tools, request.max_tokens, request.agent)
        store = self._stored()
        deltas = DeltaPublisher(EventLog(store.sessions), stored, activity.info().attempt)
        await deltas.start()
        found = await store.model_input(stored)
        if found.earlier is not None:  # a retry after the reply was stored: the model answered once
            await deltas.add(found.earlier.message.content or "")
            await deltas.flush()
            return found.earlier
        messages = found.messages
        if stored.direct:  # small talk: no schemas
            messages = with_direct_note(messages)
            reply = await self._complete(messages, [], request.max_tokens, request.agent, deltas)
            if wants_tools(reply.message):  # stored as the marker: the turn asks again with tools
                reply.message = marker()
                await deltas.void()  # readers drop the marker's streamed text
        else:
            tools = [native_tool(REGISTRY[n]) for n in stored.tool_names if n in REGISTRY]
            tools += stored.mcp_tools
            reply = await self._complete(messages, tools, request.max_tokens, request.agent, deltas)
        reply.message = numbered(reply.message, stored.call_seq)
        batch = AppendMessages(
            workflow_id=stored.workflow_id,
            conversation_id=stored.conversation_id,
            tenant_id=stored.tenant_id,
            messages=[StoredMessage(seq=stored.reply_seq, message=reply.message)],
        )
        row = model_call_row(request.caller, reply, elapsed_ms(started)) if request.caller else None
        await store.append(batch, reply.usage, row)
        return reply

    @activity.defn(name=SUMMARIZE_CONVERSATION.name)
    @heartbeats
    async def summarize_conversation(self, request: SummaryRequest) -> Summarized:
        """Fold messages that fell out of the window (and the previous summary) into a new summary,
        stored at `request.seq` as a system message the transcript shows."""
        store = self._stored()
        await store.check_tenant_budget(request.tenant_id)
        instance = request.workflow_id, request.conversation_id
        previous = await store.load(*instance, [request.previous]) if request.previous else []
        folded = await store.load(*instance, request.seqs)
        reply = await self._complete(summary_input(previous, folded), [], None, request.agent)
        summary = summary_message(reply.message.content or "")
        batch = AppendMessages(
            workflow_id=request.workflow_id,
            conversation_id=request.conversation_id,
            tenant_id=request.tenant_id,
            messages=[StoredMessage(seq=request.seq, message=summary)],
        )
        await store.append(batch, reply.usage)
        return Summarized(usage=reply.usage, tokens=estimate_tokens(summary))

    def _stored(self) -> ConversationStore:
        if self._store is None:
            raise ApplicationError(
                "this worker has no conversation store", type="NoStore", non_retryable=True
            )
        return self._store

    async def _complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        max_tokens: int | None,
        agent: str,
        deltas: DeltaPublisher | None = None,
    ) -> ModelReply:
        # The request is built as plain JSON (the same shape the scripted model and any
        # OpenAI-compatible server read) rather than the client's TypedDicts.
        body: dict[str, Any] = {"model": self._model, "messages": [m.to_openai() for m in messages]}
        if self._stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        if tools:
            body |= {"tools": tools, "parallel_tool_calls": True}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        headers = {AGENT_HEADER: agent} if agent else {}
        self.breaker.allow_or_retry("ModelCircuitOpen")
        try:
            reply = await (
                self._streamed(body, headers, deltas) if self._stream else self._whole(body, headers)
            )
        except (openai.OpenAIError, httpx.HTTPError, ValueError) as exc:
            (self.breaker.failure if endpoint_failed(exc) else self.breaker.success)()
            raise classify(exc) from exc
        except BaseException:  # cancelled: no verdict on the endpoint
            self.breaker.abandon()
            raise
        self.breaker.success()
        return reply

    async def _post(self, body: dict[str, Any], headers: dict[str, str], *, stream: bool) -> Any:
        """`POST /chat/completions` through the client's own request path (its retries, timeouts,
        authentication, errors and response types), without `chat.completions.create`'s request
        transform: that walks the whole body against the client's TypedDicts on every call (6.8 % of
        the worker's samples in issue 36's profile), to convert fields this body, plain JSON built
        above, does not have. `client.post` is the client's documented way to send a body as it is."""
        return await self._client.post(
            "/chat/completions",
            body=body,
            options={"headers": headers},
            cast_to=ChatCompletion,
            stream=stream,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )

    async def _whole(self, body: dict[str, Any], headers: dict[str, str]) -> ModelReply:
        """The reply in one response (LLM_STREAM=false): read as the one chunk of a stream."""
        completion: ChatCompletion = await self._post(body, headers, stream=False)
        streamed = Streamed()
        streamed.add(as_chunk(completion))
        return streamed.reply()

    async def _streamed(
        self, body: dict[str, Any], headers: dict[str, str], deltas: DeltaPublisher | None
    ) -> ModelReply:
        """The streamed reply, its text published as it arrives; heartbeats come from @heartbeats."""
        streamed = Streamed()
        stream: openai.AsyncStream[ChatCompletionChunk] = await self._post(body, headers, stream=True)
        async with stream:
            async for chunk in stream:
                text = streamed.add(chunk)
                if deltas is not None and text:
                    await deltas.add(text)
        if deltas is not None:
            await deltas.flush()
        return streamed.reply()
