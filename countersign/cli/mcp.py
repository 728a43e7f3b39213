"""`mcp add | list | remove`: the MCP servers whose tools some agents get (CONTRACT.md, "MCP servers")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.cli.app import cli, print_json, run
from countersign.cli.records import table
from countersign.cli.ux import shown_path, with_session
from countersign.db.schema import AgentProfile, McpServer, Tenant
from countersign.mcp.catalog import ListedTool
from countersign.mcp.servers import ServerConfig, clashes, executable, remember_listing


@cli.group()
def mcp() -> None:
    """MCP servers: their tools join agents' catalogs as mcp__NAME__TOOL, tier needs_approval by default."""


@mcp.command("add")
@click.argument("name")
@click.option("--command", help='A stdio server\'s command line, e.g. "uvx mcp-server-time".')
@click.option("--url", help="A streamable HTTP server's endpoint, e.g. http://host:8000/mcp.")
@click.option("--agent", "agents", multiple=True, required=True, help="An agent that gets its tools.")
@click.option("--tenant", help="Only in this tenant's conversations (default: every tenant).")
@click.option("--env", "env", multiple=True, help="KEY=env:VAR: the stdio server's KEY is the worker's $VAR.")
@click.option(
    "--header", "headers", multiple=True, help="Name=env:VAR: an HTTP header from the worker's $VAR."
)
def add(
    name: str,
    command: str | None,
    url: str | None,
    agents: tuple[str, ...],
    tenant: str | None,
    env: tuple[str, ...],
    headers: tuple[str, ...],
) -> None:
    """Register (or re-register) an MCP server for agents after listing its tools once as a check;
    refused when one of its tools' names would be another tool's too."""
    try:
        server = ServerConfig.of_command_line(name, command, url, agents, tenant, env, headers)
    except ValidationError as err:
        raise click.ClickException("; ".join(e["msg"] for e in err.errors())) from None
    except ValueError as err:
        raise click.ClickException(str(err)) from None

    if server.command and executable(server.command[0]) is None:
        here = Path(sys.executable).parent
        raise click.ClickException(
            f"{server.command[0]}: no such command in the project's environment ({shown_path(here)}) "
            f"or on PATH, so no worker could start it: install it there (`{shown_path(here / 'pip')} install "
            f"{server.command[0]}`), or give the command's full path; nothing was registered"
        )
    listed = run(check(server))

    async def register(session: AsyncSession) -> None:
        for agent in server.agents:
            if await session.get(AgentProfile, agent) is None:
                raise click.ClickException(f"no agent named {agent!r}")
        if server.tenant_id and await session.get(Tenant, server.tenant_id) is None:
            raise click.ClickException(f"no tenant named {server.tenant_id!r}")
        if not isinstance(listed, str):
            await refuse_clashes(session, server, listed)
        values = server.model_dump()
        await session.execute(
            insert(McpServer)
            .values(**values)
            .on_conflict_do_update(index_elements=["name"], set_={**values, "tools": None})
        )

    run(with_session(register))
    click.echo(
        f"registered MCP server {name} ({server.transport}: {server.target()}) for {', '.join(agents)}"
    )
    if isinstance(listed, str):
        click.echo(
            f"warning: could not list its tools from here ({listed}); workers try again at each "
            "conversation start (their environment may differ): `mcp list` shows what they found"
        )
        return
    run(with_session(lambda session: remember_listing(session, name, listed)))
    for tool in listed:
        click.echo(f"  mcp__{name}__{tool.name}")
    click.echo("tier needs_approval for each until `permissions set AGENT mcp__NAME__TOOL TIER`")


async def refuse_clashes(session: AsyncSession, server: ServerConfig, listed: list[ListedTool]) -> None:
    """Refuse a server whose tools would share a flat name with each other or with a tool of
    another server the same agents get (from its last listing): one name, two tools, is a
    name whose tier, card and execution could each pick a different tool."""
    others = await session.scalars(select(McpServer).where(McpServer.name != server.name))
    tools = [(server.name, t.name) for t in listed] + [
        (row.name, str(t.get("name")))
        for row in others
        if set(row.agents) & set(server.agents)
        and (row.tenant_id is None or server.tenant_id is None or row.tenant_id == server.tenant_id)
        for t in row.tools or []
    ]
    shared = clashes(tools)
    if shared:
        raise click.ClickException(
            "refused: tool names would be shared, so none could be offered: "
            + "; ".join(
                f"{name} ({', '.join(f'{s}/{t}' for s, t in owners)})" for name, owners in shared.items()
            )
        )


async def check(server: ServerConfig) -> list[ListedTool] | str:
    """List the server's tools with this process's environment (a worker's may differ)."""
    from countersign.mcp.pool import McpPool, McpRefused, McpUnavailable

    pool = McpPool(failure_threshold=1)
    try:
        return await pool.list_tools(server)
    except (McpUnavailable, McpRefused) as err:
        return str(err)
    finally:
        await pool.close()


@mcp.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_servers(as_json: bool) -> None:
    """Registered servers: transport, command or URL, agents, tenant, tools last listed."""

    async def rows(session: AsyncSession) -> list[dict[str, Any]]:
        found = (await session.scalars(select(McpServer).order_by(McpServer.name))).all()
        return [
            {
                **ServerConfig.of_row(r).model_dump(),
                "tools": [t["name"] for t in r.tools or []],
                "created_at": r.created_at,
            }
            for r in found
        ]

    found = run(with_session(rows))
    if as_json:
        print_json(found)
    elif not found:
        click.echo("no MCP servers registered")
    else:
        cells = [("name", "transport", "target", "agents", "tenant", "tools")] + [
            (
                r["name"],
                r["transport"],
                ServerConfig.model_validate(r).target(),
                ",".join(r["agents"]),
                r["tenant_id"] or "*",
                str(len(r["tools"])),
            )
            for r in found
        ]
        click.echo(table(cells))


@mcp.command("remove")
@click.argument("name")
def remove(name: str) -> None:
    """Unregister a server: new conversations lose its tools; running ones get a refusal per call."""

    async def drop(session: AsyncSession) -> int:
        return len(
            (
                await session.execute(
                    delete(McpServer).where(McpServer.name == name).returning(McpServer.name)
                )
            ).all()
        )

    if not run(with_session(drop)):
        raise click.ClickException(f"no MCP server named {name!r}")
    click.echo(f"removed MCP server {name}")
