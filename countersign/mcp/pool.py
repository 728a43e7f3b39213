"""The worker's MCP connections: one per server, reused across calls, behind a circuit breaker.

Uses the official `mcp` SDK v2 client (`mcp.Client` over stdio or streamable HTTP). Chosen over
`temporalio-mcp`: that package registers servers as fixed factories when the worker is built and
returns raw results into workflow history, while Countersign's servers are rows an operator adds at
run time, and every result must be validated, redacted, truncated and audited inside the activity
before history sees it. Its connection handling is the model for this one: an SDK client is an
async context whose scopes must be entered and left by one task, so each connection has an owner
task that holds it open until the pool retires it.

Failures are sorted in two: a JSON-RPC error *answer* (unknown tool, invalid params) proves the
connection works and becomes `McpRefused`; anything else (spawn failure, refused connection,
timeout, closed stream, a missing secret) retires the connection, counts against the server's
breaker, and becomes `McpUnavailable` (`McpOutcomeUnknown` once a call was sent: it may have run).
An answer the SDK cannot read (it drops it, and the call would wait out its timeout) or more than
MAX_NOTIFICATIONS_PER_CALL notifications fail the calls in flight at once. Nothing is retried
here: the activity turns each into an error envelope, so a server that is down never holds a turn
for longer than one timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, UNSUPPORTED_PROTOCOL_VERSION

from countersign.mcp.catalog import CallOutcome, ListedTool
from countersign.mcp.servers import SecretMissing, ServerConfig, executable
from countersign.runtime.circuit import CircuitBreaker, CircuitOpen

T = TypeVar("T")
UNUSABLE = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT, UNSUPPORTED_PROTOCOL_VERSION})
MAX_PAGES = 20  # of a tools/list answer
MAX_NOTIFICATIONS_PER_CALL = 1_000  # progress and log messages; a server past it is flooding


class McpUnavailable(Exception):
    """The server cannot be used now: down, unreachable, too slow, misconfigured, or its circuit is open."""


class McpRefused(Exception):
    """The server answered with a JSON-RPC error (an unknown tool, invalid params, ...)."""


class McpOutcomeUnknown(McpUnavailable):
    """A call was sent and no usable answer came (unreadable, flooded out, timed out, the
    connection lost): the server may have run it."""


class McpDropped(Exception):
    """The connection received what the SDK cannot read (its answer is dropped, and the call would
    wait out its timeout), or more notifications than a call may bring."""


def leaf(err: BaseException) -> BaseException:
    """The first real error inside the task groups' ExceptionGroups, which say nothing themselves."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def reason(err: Exception) -> str:
    cause = leaf(err)
    if isinstance(cause, MCPError):
        return cause.error.message
    return "timed out" if isinstance(cause, TimeoutError) else f"{type(cause).__name__}: {cause}"


class _Connection:
    """One open `mcp.Client`, entered and exited by its own owner task."""

    def __init__(self, server: ServerConfig, environ: Mapping[str, str], read_timeout_s: float) -> None:
        self.fingerprint = server.fingerprint()
        self._calls: set[asyncio.Future[None]] = set()  # failed at once when the connection drops one
        self._notices = 0  # notifications since the calls in flight began
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._owner = asyncio.create_task(self._own(server, environ, read_timeout_s))

    async def _own(self, server: ServerConfig, environ: Mapping[str, str], read_timeout_s: float) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                target: Any
                if server.transport == "http":
                    assert server.url is not None
                    headers = server.resolved(environ, server.headers)
                    http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
                    target = streamable_http_client(server.url, http_client=http)
                else:
                    assert server.command
                    env = server.resolved(environ, server.env)
                    target = StdioServerParameters(
                        command=executable(server.command[0]) or server.command[0],
                        args=server.command[1:],
                        env=env or None,
                    )
                client = Client(
                    target, read_timeout_seconds=read_timeout_s, cache=None, message_handler=self._received
                )
                self._ready.set_result(await stack.enter_async_context(client))
                await self._stop.wait()
        except BaseException as err:  # reported to whoever waits for the connection
            if not self._ready.done():
                self._ready.set_exception(err)

    async def _received(self, message: Exception | object) -> None:
        """The SDK's hook for notifications and for what it could not read: a message it could not
        read may be a call's answer, which it drops; so every call in flight fails now."""
        if isinstance(message, Exception):
            self._abort(McpDropped(f"its answer could not be read ({reason(message).splitlines()[0][:200]})"))
            return
        self._notices += 1
        if self._calls and self._notices > MAX_NOTIFICATIONS_PER_CALL * len(self._calls):
            self._abort(
                McpDropped(f"it sent more than {MAX_NOTIFICATIONS_PER_CALL} notifications for one call")
            )

    def _abort(self, error: McpDropped) -> None:
        for call in self._calls:
            if not call.done():
                call.set_exception(error)

    async def guarded(self, op: Awaitable[T], timeout_s: float) -> T:
        """`op`'s result, or McpDropped as soon as the connection drops a message or floods."""
        if not self._calls:
            self._notices = 0
        dropped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._calls.add(dropped)
        task = asyncio.ensure_future(op)
        try:
            racing: set[asyncio.Future[Any]] = {task, dropped}
            done, _ = await asyncio.wait(racing, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            if dropped in done:
                dropped.result()  # raises McpDropped
            raise TimeoutError
        finally:
            self._calls.discard(dropped)
            if not dropped.done():
                dropped.cancel()
            elif not dropped.cancelled():
                dropped.exception()  # retrieved
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def client(self, timeout_s: float) -> Client:
        return await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)

    async def close(self) -> None:
        self._stop.set()
        if not self._ready.done():
            self._owner.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._owner, 10)
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # retrieved: no "never retrieved" warning


class McpPool:
    """Connections and breakers per server, for one worker process (one event loop)."""

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        connect_timeout_s: float = 10.0,
        call_timeout_s: float = 45.0,
        failure_threshold: int = 3,
        cool_down_s: float = 300.0,
    ) -> None:
        self._environ = os.environ if environ is None else environ
        self.connect_timeout_s = connect_timeout_s
        self.call_timeout_s = call_timeout_s
        self._failure_threshold = failure_threshold
        self._cool_down_s = cool_down_s
        self._connections: dict[str, _Connection] = {}
        self._breakers: dict[str, CircuitBreaker] = {}

    @property
    def breakers(self) -> list[CircuitBreaker]:
        """The breakers of the servers this pool has called so far (the metrics read them)."""
        return list(self._breakers.values())

    def breaker(self, server: str) -> CircuitBreaker:
        if server not in self._breakers:
            self._breakers[server] = CircuitBreaker(
                f"mcp:{server}", failure_threshold=self._failure_threshold, cool_down=self._cool_down_s
            )
        return self._breakers[server]

    async def list_tools(self, server: ServerConfig) -> list[ListedTool]:
        async def listing(client: Client) -> list[ListedTool]:
            tools: list[ListedTool] = []
            cursor: str | None = None
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools += [
                    ListedTool(
                        name=t.name,
                        description=t.description or "",
                        input_schema=t.input_schema,
                        annotations=t.annotations.model_dump(by_alias=True, exclude_none=True)
                        if t.annotations
                        else {},
                    )
                    for t in page.tools
                ]
                cursor = page.next_cursor
                if cursor is None:
                    break
            return tools

        # a listing is safe to repeat: a reused connection that turns out dead is replaced once
        return await self._use(server, listing, self.connect_timeout_s, retry_stale=True)

    async def call_tool(
        self, server: ServerConfig, tool: str, arguments: dict[str, Any], meta: dict[str, Any]
    ) -> CallOutcome:
        async def call(client: Client) -> CallOutcome:
            result = await client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]
            texts, other = [], []
            for part in result.content:
                if part.type == "text":
                    texts.append(part.text)
                else:
                    size = len(str(getattr(part, "data", "") or getattr(part, "resource", "")))
                    other.append(
                        {"type": part.type, "mime_type": getattr(part, "mime_type", None), "size": size}
                    )
            return CallOutcome(
                is_error=bool(result.is_error), structured=result.structured_content, texts=texts, other=other
            )

        return await self._use(server, call, self.call_timeout_s, effects=True)

    async def _use(
        self,
        server: ServerConfig,
        op: Callable[[Client], Awaitable[T]],
        timeout_s: float,
        *,
        retry_stale: bool = False,
        effects: bool = False,
    ) -> T:
        """`op` on the server's connection; with `effects` (a tool call), a failure once the call
        was sent is McpOutcomeUnknown: the server may have run it."""
        breaker = self.breaker(server.name)
        known = self._connections.get(server.name)
        reused = known is not None and known.fingerprint == server.fingerprint()
        try:
            breaker.allow()
        except CircuitOpen as err:
            raise McpUnavailable(f"MCP server {server.name!r} is unavailable ({err})") from err
        sent = False
        try:
            connection = await self._connection(server)
            client = await connection.client(self.connect_timeout_s)
            sent = True
            result = await connection.guarded(op(client), timeout_s + 5)  # the SDK's own timeout is first
        except MCPError as err:
            if err.code not in UNUSABLE:
                breaker.success()
                raise McpRefused(f"MCP server {server.name!r} answered: {err.error.message}") from err
            failure: Exception = err
        except asyncio.CancelledError:
            breaker.abandon()
            raise
        except SecretMissing as err:
            breaker.abandon()
            await self._retire(server.name)
            raise McpUnavailable(str(err)) from err
        except Exception as err:
            failure = err
        else:
            breaker.success()
            return result
        if reused and retry_stale:  # e.g. the server restarted since the last call
            breaker.abandon()
            await self._retire(server.name)
            return await self._use(server, op, timeout_s)
        await self._fail(server.name, breaker)
        if effects and sent:
            raise McpOutcomeUnknown(
                f"MCP server {server.name!r} gave no usable answer ({reason(failure)})"[:500]
            ) from failure
        raise McpUnavailable(
            f"MCP server {server.name!r} is unavailable ({reason(failure)})"[:500]
        ) from failure

    async def _connection(self, server: ServerConfig) -> _Connection:
        current = self._connections.get(server.name)
        if current is not None and current.fingerprint != server.fingerprint():
            await self._retire(server.name)  # registered anew with another command, URL or secrets
            current = None
        if current is None:
            current = self._connections[server.name] = _Connection(server, self._environ, self.call_timeout_s)
        return current

    async def _fail(self, name: str, breaker: CircuitBreaker) -> None:
        breaker.failure()
        await self._retire(name)

    async def _retire(self, name: str) -> None:
        connection = self._connections.pop(name, None)
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        for name in list(self._connections):
            await self._retire(name)
