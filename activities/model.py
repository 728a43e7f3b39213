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

import openai
from openai.types.chat import ChatCompletion
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeats
from activities.store import summary_input, summary_message
from countersign.core.bounds import storable
from countersign.core.envelopes import (
    AppendMessages,
    StoredMessage,
    Summarized,
    SummaryRequest,
    estimate_tokens,
)
from countersign.core.messages import (
    ChatMessage,
    ModelReply,
    ModelRequest,
    ToolCall,
    Usage,
    capped_reply,
    numbered,
)
from countersign.db.messages import ConversationStore
from countersign.observability.usage import elapsed_ms, model_call_row
from countersign.runtime.circuit import CircuitBreaker, CircuitOpen
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
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError):
        return ApplicationError(f"model endpoint unreachable: {exc}", type="ModelUnreachable")
    return ApplicationError(f"model answered something unusable: {exc}", type="ModelBadResponse")


def encodable(text: str) -> str:
    """JSON from a model may carry lone surrogates (`\\ud800`) that no payload can encode, and NUL
    that PostgreSQL cannot store (the reply is stored); both become U+FFFD, so the reply travels and
    its calls are refused and audited, instead of failing the model call on every retry."""
    return storable(text)


def to_reply(completion: ChatCompletion) -> ModelReply:
    # The client does not validate bodies: JSON of another shape (`[]`, `null`, a choice without a
    # message) arrives here as is, and must fail as a bad response, not as an AttributeError.
    if not isinstance(completion, ChatCompletion) or not completion.choices:
        raise ValueError("completion has no choices")
    choice = completion.choices[0]
    if choice.message is None:
        raise ValueError("completion choice has no message")
    calls = [
        ToolCall.capped(c.id, encodable(c.function.name), encodable(c.function.arguments or "{}"))
        for c in choice.message.tool_calls or []
        if c.type == "function"
    ]
    usage = completion.usage
    return ModelReply(
        message=ChatMessage(
            role="assistant",
            content=capped_reply(encodable(choice.message.content))
            if choice.message.content is not None
            else None,
            tool_calls=calls,
        ),
        usage=Usage(
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            model_calls=1,
        ),
        finish_reason=choice.finish_reason,
        model=completion.model,
    )


def endpoint_failed(exc: Exception) -> bool:
    """Whether an error says the endpoint is unhealthy (as opposed to this request being wrong)."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return True


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
        self._store = store
        self._client = openai.AsyncOpenAI(
            base_url=settings.llm_base_url, api_key=settings.llm_api_key, max_retries=0, timeout=110.0
        )
        self.breaker = breaker or CircuitBreaker("model", failure_threshold=5, cool_down=30.0)

    @activity.defn(name="call_model")
    @heartbeats
    async def call_model(self, request: ModelRequest) -> ModelReply:
        started = time.perf_counter()
        stored = request.stored
        if stored is None:
            return await self._complete(request.messages, request.tools, request.max_tokens, request.agent)
        store = self._stored()
        found = await store.model_input(stored)
        if found.earlier is not None:  # a retry after the reply was stored: the model answered once
            return found.earlier
        messages = found.messages
        tools = [native_tool(REGISTRY[n]) for n in stored.tool_names if n in REGISTRY]
        tools += stored.mcp_tools
        reply = await self._complete(messages, tools, request.max_tokens, request.agent)
        reply.message = numbered(reply.message, stored.call_seq)
        batch = AppendMessages(
            workflow_id=stored.workflow_id,
            tenant_id=stored.tenant_id,
            messages=[StoredMessage(seq=stored.reply_seq, message=reply.message)],
        )
        row = model_call_row(request.caller, reply, elapsed_ms(started)) if request.caller else None
        await store.append(batch, reply.usage, row)
        return reply

    @activity.defn(name="summarize_conversation")
    @heartbeats
    async def summarize_conversation(self, request: SummaryRequest) -> Summarized:
        """Fold messages that fell out of the window (and the previous summary) into a new summary,
        stored at `request.seq` as a system message the transcript shows."""
        store = self._stored()
        await store.check_tenant_budget(request.tenant_id)
        previous = await store.load(request.workflow_id, [request.previous]) if request.previous else []
        folded = await store.load(request.workflow_id, request.seqs)
        reply = await self._complete(summary_input(previous, folded), [], None, request.agent)
        summary = summary_message(reply.message.content or "")
        batch = AppendMessages(
            workflow_id=request.workflow_id,
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
        self, messages: list[ChatMessage], tools: list[dict[str, Any]], max_tokens: int | None, agent: str
    ) -> ModelReply:
        # The request is built as plain JSON (the same shape the scripted model and any
        # OpenAI-compatible server read) rather than the client's TypedDicts.
        body: dict[str, Any] = {"model": self._model, "messages": [m.to_openai() for m in messages]}
        if tools:
            body |= {"tools": tools, "parallel_tool_calls": True}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if agent:
            body["extra_headers"] = {AGENT_HEADER: agent}
        try:
            self.breaker.allow()
        except CircuitOpen as exc:
            raise ApplicationError(
                str(exc), type="ModelCircuitOpen", next_retry_delay=timedelta(seconds=exc.retry_after)
            ) from exc
        try:
            reply = to_reply(await self._client.chat.completions.create(**body))
        except (openai.OpenAIError, ValueError) as exc:
            (self.breaker.failure if endpoint_failed(exc) else self.breaker.success)()
            raise classify(exc) from exc
        except BaseException:  # cancelled: no verdict on the endpoint
            self.breaker.abandon()
            raise
        self.breaker.success()
        return reply
