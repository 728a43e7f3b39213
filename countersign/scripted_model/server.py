"""The scripted model over real HTTP: an OpenAI-compatible `/v1/chat/completions` the official `openai`
client talks to unchanged, so the demo and the tests exercise the same model path as production.

Replies come from the scenario (`choose_reply`); every text the server writes says `[scripted model]`.
Faults can be queued (`inject`) to provoke the failures a real endpoint has: rate limits, 5xx, slow
answers, broken JSON, a stream cut short.

`"stream": true` is answered as a real OpenAI server does: server-sent `chat.completion.chunk`s (the
text a few words at a time, each tool call's arguments split across chunks), a usage chunk with an
empty choice list when `stream_options.include_usage` asks for it, then `data: [DONE]`.
`chunk_delay_s` spaces the chunks, so that a reader can watch a reply arrive in parts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from countersign.runtime.config import AGENT_HEADER, SCRIPTED_LABEL, SCRIPTED_MODEL_NAME
from countersign.scripted_model.scenario import Reply, Scenario, choose_reply, scenario_for, text_of

NO_MATCH = f"{SCRIPTED_LABEL} no rule matched"
ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
MAX_BODY_BYTES = 32 * 1024 * 1024  # long conversations with many tool schemas outgrow aiohttp's 1 MiB

# One counter per process: ids stay unique across servers, like a real endpoint's.
_ids: Iterator[int] = itertools.count(1)


@dataclass(frozen=True)
class Fault:
    """A one-shot misbehaviour, consumed by the next well-formed chat request.

    `delay_s` waits first (to provoke client timeouts); then `raw_body` is sent verbatim with `status`
    (default 200), or else an OpenAI-style error with `status` (and `Retry-After` when `retry_after`
    is set). A fault with only a delay answers normally after it.
    """

    status: int | None = None
    retry_after: float | None = None
    delay_s: float = 0.0
    raw_body: str | None = None
    message: str = "injected fault"
    cut_after_chunks: int | None = None  # a streamed answer: close the connection after this many chunks

    def __post_init__(self) -> None:
        if self.raw_body is None and self.status is not None and not 400 <= self.status <= 599:
            raise ValueError(f"an error fault needs a 4xx/5xx status, not {self.status}")


class ChatRequest(BaseModel):
    """The part of an OpenAI chat-completions body the server uses; other fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: list[Any] | None = None

    @field_validator("messages")
    @classmethod
    def _have_roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, message in enumerate(messages):
            if not isinstance(message.get("role"), str):
                raise ValueError(f"message {i} has no string `role`")
        return messages


class RequestError(Exception):
    """A request the server refuses; becomes an OpenAI-style 400."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ScriptedModelServer:
    """The server in-process: `async with ScriptedModelServer(scenario) as server: server.base_url`.

    `requests` records the JSON body of every well-formed chat request, in order, for tests to assert on.
    """

    def __init__(
        self,
        scenario: Scenario | Sequence[Scenario],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        chunk_delay_s: float = 0.0,
    ) -> None:
        self.host = host
        self.chunk_delay_s = chunk_delay_s
        self.requests: list[dict[str, Any]] = []
        self._scenarios = [scenario] if isinstance(scenario, Scenario) else list(scenario)
        self._port = port
        self._faults: deque[Fault] = deque()
        self._runner: web.AppRunner | None = None

    @property
    def scenario(self) -> Scenario:
        return self._scenarios[0]

    def set_scenario(self, scenario: Scenario) -> None:
        """Swap the script; the next request is answered by the new one."""
        self._scenarios = [scenario]

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each is consumed by one chat request, in order."""
        self._faults.extend(faults)

    @property
    def port(self) -> int:
        if self._runner is None:
            raise RuntimeError("the scripted model server is not started")
        return self._port

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_openai_errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", _models)
        return app

    async def start(self) -> None:
        # handler_cancellation: a client that gives up (timeout) cancels a delayed answer, and a short
        # shutdown_timeout keeps stop() from waiting on one.
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._port = int(runner.addresses[0][1])  # the real one when port was 0
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedModelServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        chat, body = parse_request(await request.read())
        self.requests.append(body)
        include_usage = bool((chat.stream_options or {}).get("include_usage"))
        fault = self._faults.popleft() if self._faults else None
        if fault is not None:
            if fault.raw_body is not None and chat.stream and (fault.status or 200) == 200:
                await asyncio.sleep(fault.delay_s)
                return await self._stream(
                    request, raw_stream(fault.raw_body, include_usage), fault.cut_after_chunks
                )
            faulty = await _apply(fault)
            if faulty is not None:
                return faulty
        agent = request.headers.get(AGENT_HEADER)
        scenario = scenario_for(self._scenarios, agent)
        if scenario is None:
            known = ", ".join(sorted(s.agent or "" for s in self._scenarios))
            reply: Reply | None = Reply(content=f"no scenario for agent {agent!r} (scripted agents: {known})")
        else:
            reply = choose_reply(scenario, chat.messages)
        answer = completion(reply, chat.model, chat.messages, chat.tools)
        if not chat.stream:
            # a model writes a whole reply as long as it streams it: the chunks' time, all at once
            await asyncio.sleep(self.chunk_delay_s * (len(chunks_of(answer, False)) - 1))
            return web.json_response(answer)
        chunks = [json.dumps(c, ensure_ascii=False) for c in chunks_of(answer, include_usage)]
        return await self._stream(request, chunks, fault.cut_after_chunks if fault is not None else None)

    async def _stream(
        self, request: web.Request, chunks: list[str], cut_after: int | None
    ) -> web.StreamResponse:
        """Send `chunks` as server-sent `data:` lines, then `[DONE]`; with `cut_after`, the
        connection is closed after that many chunks instead (no `[DONE]`), as when it is lost."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for i, chunk in enumerate(chunks):
            if cut_after is not None and i >= cut_after:
                if request.transport is not None:
                    request.transport.close()
                return response
            if i and self.chunk_delay_s > 0:
                await asyncio.sleep(self.chunk_delay_s)
            await response.write(f"data: {chunk}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def raw_stream(raw: str, include_usage: bool) -> list[str]:
    """A `raw_body` fault for a streaming request: a completion body is streamed as its chunks
    would be; anything else (broken JSON, another shape) is sent as one `data:` line, verbatim."""
    try:
        return [json.dumps(c, ensure_ascii=False) for c in chunks_of(json.loads(raw), include_usage)]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return [raw.replace("\n", " ")]


def parse_request(raw: bytes) -> tuple[ChatRequest, dict[str, Any]]:
    """The validated request and its JSON body, or a RequestError saying what is wrong."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}", "invalid_json") from exc
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", "invalid_json")
    try:
        chat = ChatRequest.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise RequestError(f"invalid request: {where}: {error['msg']}", "invalid_request") from exc
    return chat, body


def completion(
    reply: Reply | None, model: str, messages: list[dict[str, Any]], tools: list[Any] | None = None
) -> dict[str, Any]:
    """A `chat.completion` object answering with `reply` (None: the no-match message). Its prompt
    tokens count the tools' definitions too, as a real model's do."""
    if reply is None:
        content: str | None = NO_MATCH
        calls: list[dict[str, Any]] = []
    else:
        content = labelled(reply.content) if reply.content is not None else None
        calls = [_wire_call(call.name, call.arguments) for call in reply.tool_calls]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    tool_words = len(json.dumps(tools).split()) if tools else 0
    prompt_tokens = sum(_message_words(m) for m in messages) + tool_words
    completion_tokens = _message_words(message)
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def chunks_of(answer: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The `chat.completion.chunk`s a streaming OpenAI server sends for `answer`: the role, the text
    a few words at a time, each tool call's id and name, then its arguments in pieces (so a reader
    must join them by index), the finish reason, and the usage (with no choices) when asked for."""
    choice = answer["choices"][0]
    message = choice["message"]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"]}
    head["model"] = answer["model"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in pieces(message["content"] or "", words=2)]
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        opening = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk({"tool_calls": [opening | {"function": {"name": function["name"], "arguments": ""}}]})
        )
        for piece in pieces(function["arguments"], words=1):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": answer["usage"]})
    return chunks


def pieces(text: str, words: int) -> list[str]:
    """`text` cut after every `words` spaces, each piece keeping its spaces: joined, they are `text`."""
    parts = text.split(" ")
    return (
        [
            " ".join(parts[i : i + words]) + (" " if i + words < len(parts) else "")
            for i in range(0, len(parts), words)
        ]
        if text
        else []
    )


def labelled(text: str) -> str:
    """The text marked as the scripted model's, once."""
    return text if SCRIPTED_LABEL in text else f"{SCRIPTED_LABEL} {text}"


def _wire_call(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _message_words(message: Mapping[str, Any]) -> int:
    """Token stand-in: words of the text plus words of any tool call arguments."""
    words = len(text_of(message).split())
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, Mapping) else None
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        words += len(arguments.split()) if isinstance(arguments, str) else 0
    return words


async def _apply(fault: Fault) -> web.Response | None:
    """The faulty response, or None when the fault is only a delay."""
    if fault.delay_s > 0:
        await asyncio.sleep(fault.delay_s)
    headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else None
    if fault.raw_body is not None:
        return web.Response(
            text=fault.raw_body, status=fault.status or 200, content_type="application/json", headers=headers
        )
    if fault.status is not None:
        return error_response(fault.status, fault.message, "injected_fault", headers)
    return None


async def _models(request: web.Request) -> web.Response:
    model = {"id": SCRIPTED_MODEL_NAME, "object": "model", "created": 0, "owned_by": "countersign"}
    return web.json_response({"object": "list", "data": [model]})


def error_response(
    status: int, message: str, code: str | None, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An error body shaped like OpenAI's, so the `openai` client raises its usual typed exceptions."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    error = {"message": labelled(message), "type": ERROR_TYPES.get(status, kind), "param": None, "code": code}
    return web.json_response({"error": error}, status=status, headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refusals and aiohttp's own 404/405/413 as OpenAI-style JSON errors."""
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(400, str(exc), exc.code)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, f"{exc.reason}: {request.method} {request.path}", None)
