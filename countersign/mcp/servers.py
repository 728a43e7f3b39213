"""Registered MCP servers: how one is named, reached and given its secrets.

A server is a row of `mcp_servers`: a stdio command or a streamable HTTP URL, the agents that use
it, optionally one tenant. Secrets come by reference only: `env` and `headers` map a name to
`env:VARIABLE`, a variable of the *worker's* environment read when it connects. The values never
reach PostgreSQL, workflow history or the audit; a literal value is refused at registration.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field, field_validator, model_validator
from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.db.schema import McpServer


def executable(name: str) -> str | None:
    """Where a stdio server's command is, the way a person expects it to be found: a path as
    given; a bare name in the project's environment first (the directory of the Python running
    this, e.g. `.venv/bin`, where `pip install` put `mcp-server-time`), then on PATH. None: nowhere.

    The worker resolves it so too (its own environment, at connection time), so a server installed
    into the project's virtualenv runs without that directory being on anybody's PATH.
    """
    if os.sep in name:
        return name if os.access(name, os.X_OK) and Path(name).is_file() else None
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


PREFIX = "mcp__"
SEPARATOR = "__"
# A server name is part of every tool name the model sees (OpenAI: [a-zA-Z0-9_-]{1,64}); no "__",
# which separates it from the tool's own name.
SERVER_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]|_(?!_)){0,30}$")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ENV_REFERENCE = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]{0,127})$")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,128}$")


class Shown(Protocol):
    def shown(self) -> dict[str, Any]: ...


class SecretMissing(Exception):
    """The worker's environment lacks a variable a server's configuration refers to."""


def tool_name(server: str, tool: str) -> str | None:
    """`mcp__SERVER__TOOL`, or None when that is no valid function name (too long, odd characters)."""
    name = f"{PREFIX}{server}{SEPARATOR}{tool}"
    return name if TOOL_NAME.match(name) else None


def clashes(tools: Sequence[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """The flat names two or more of `tools` ((server, tool) pairs) would share, with who shares
    each: such a name means no one tool, so it is never offered (and `mcp add` refuses it)."""
    by_name: dict[str, list[tuple[str, str]]] = {}
    for server, tool in tools:
        by_name.setdefault(f"{PREFIX}{server}{SEPARATOR}{tool}", []).append((server, tool))
    return {name: owners for name, owners in by_name.items() if len(owners) > 1}


def server_of(name: str) -> str | None:
    """The server part of an `mcp__SERVER__TOOL` name, else None."""
    if not name.startswith(PREFIX):
        return None
    server, sep, tool = name[len(PREFIX) :].partition(SEPARATOR)
    return server if sep and tool and SERVER_NAME.match(server) else None


def env_references(pairs: tuple[str, ...], what: str, key: re.Pattern[str]) -> dict[str, str]:
    """Parse `NAME=env:VARIABLE` options into {NAME: VARIABLE}; refuse anything else."""
    refs: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        ref = ENV_REFERENCE.match(value.strip())
        if not sep or not key.match(name.strip()):
            raise ValueError(f"{what} {pair.split('=')[0]!r}: expected NAME=env:VARIABLE")
        if ref is None:
            raise ValueError(
                f"{what} {name.strip()}: give a reference, env:VARIABLE (a variable of the worker's "
                "environment), never the secret itself"
            )
        refs[name.strip()] = ref.group(1)
    return refs


class ServerConfig(BaseModel):
    """A registered server as the worker and the CLI see it (validated on the way in and out)."""

    name: str
    transport: Literal["stdio", "http"]
    command: list[str] | None = None
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict)  # KEY -> worker env variable name
    headers: dict[str, str] = Field(default_factory=dict)  # header -> worker env variable name
    agents: list[str]
    tenant_id: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not SERVER_NAME.match(name):
            raise ValueError("a server name is 1-31 of a-z, 0-9, '-' and single '_'")
        return name

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^https?://[^\s@]+$", url):
            raise ValueError("the URL must be http(s):// without credentials (use --header)")
        return url

    @model_validator(mode="after")
    def _target(self) -> ServerConfig:
        if (self.transport == "stdio") != bool(self.command) or (self.transport == "http") != bool(self.url):
            raise ValueError("a stdio server has a command, an http server a URL, not both")
        if self.headers and self.transport != "http":
            raise ValueError("headers are for http servers")
        if not self.agents:
            raise ValueError("name at least one agent")
        return self

    @classmethod
    def of_command_line(
        cls,
        name: str,
        command: str | None,
        url: str | None,
        agents: tuple[str, ...],
        tenant: str | None,
        env: tuple[str, ...],
        headers: tuple[str, ...],
    ) -> ServerConfig:
        if (command is None) == (url is None):
            raise ValueError("give exactly one of --command and --url")
        if name.endswith("_"):
            raise ValueError(
                f"a server name may not end with '_': {PREFIX}{name}{SEPARATOR}foo would also be "
                f"server {name[:-1]!r}'s tool '_foo' (one name, two tools)"
            )
        return cls(
            name=name,
            transport="stdio" if command else "http",
            command=shlex.split(command) if command else None,
            url=url,
            env=env_references(env, "--env", ENV_KEY),
            headers=env_references(headers, "--header", HEADER_NAME),
            agents=sorted(set(agents)),
            tenant_id=tenant,
        )

    @classmethod
    def of_row(cls, row: McpServer) -> ServerConfig:
        return cls(
            name=row.name,
            transport=row.transport,
            command=row.command,
            url=row.url,
            env=row.env,
            headers=row.headers,
            agents=row.agents,
            tenant_id=row.tenant_id,
        )

    def fingerprint(self) -> str:
        """Changes when the server is registered anew differently: the pool then reconnects."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def target(self) -> str:
        """What `mcp list` prints: the command line or the URL (references, never secrets)."""
        return shlex.join(self.command) if self.command else str(self.url)

    def resolved(self, environ: Mapping[str, str], refs: Mapping[str, str]) -> dict[str, str]:
        """Look up secret references in the worker's environment (done in the worker only)."""
        missing = sorted(var for var in refs.values() if var not in environ)
        if missing:
            raise SecretMissing(
                f"MCP server {self.name!r} needs {', '.join(missing)} in the worker's environment"
            )
        return {key: environ[var] for key, var in refs.items()}


async def servers_for(session: AsyncSession, agent: str, tenant_id: str) -> list[ServerConfig]:
    """The servers of `agent` in `tenant_id` (those of every tenant included), by name."""
    rows = await session.scalars(
        select(McpServer)
        .where(or_(McpServer.tenant_id.is_(None), McpServer.tenant_id == tenant_id))
        .order_by(McpServer.name)
    )
    return [ServerConfig.of_row(r) for r in rows if agent in r.agents]


async def remember_listing(session: AsyncSession, server: str, listed: Sequence[Shown]) -> None:
    """Keep a server's latest tool listing (names, descriptions, annotations, input schemas) for
    `permissions show` and for checking the policies that name its tools."""
    shown = [t.shown() for t in listed]
    await session.execute(update(McpServer).where(McpServer.name == server).values(tools=shown))


def listing_hash(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
