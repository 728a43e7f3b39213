"""The root of the starter CLI. Each sub-module adds its commands to `cli`; COMMANDS says which."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import click

from countersign.cli.ux import reason

T = TypeVar("T")

# Each top-level command, and the modules of `countersign.cli` that define it and its subcommands.
# tests/cli/test_cli_text.py checks this against what the modules register.
COMMANDS: dict[str, tuple[str, ...]] = {
    "answer": ("approvals",),
    "approvals": ("approvals",),
    "approve": ("approvals",),
    "audit": ("records", "evidence"),
    "channels": ("channels",),
    "chat": ("chat",),
    "conversations": ("conversations",),
    "db": ("db",),
    "demo": ("demo",),
    "dev": ("dev",),
    "drafts": ("leads",),
    "end": ("conversations",),
    "grants": ("grants",),
    "health": ("health",),
    "healthcheck": ("health",),
    "inbox": ("inbox",),
    "leads": ("leads",),
    "login": ("inbox",),
    "logout": ("inbox",),
    "mail": ("mail",),
    "mcp": ("mcp",),
    "model": ("model",),
    "notifications": ("notifications",),
    "permissions": ("records", "catalog"),
    "policy": ("policies",),
    "rate-limits": ("users",),
    "reject": ("approvals",),
    "rollback": ("conversations",),
    "send": ("conversations",),
    "server": ("inbox",),
    "start": ("conversations",),
    "stats": ("stats",),
    "status": ("conversations",),
    "tokens": ("tokens",),
    "transcript": ("conversations",),
    "users": ("users",),
}


class LazyGroup(click.Group):
    """Imports a command's modules when that command runs.

    Importing every command's dependencies (Temporal's client, SQLAlchemy, the server, Alembic) cost
    about a second of CPU per command, paid again by each process `dev up` starts (the scripted model
    and the mail catcher are CLI commands) and by every line of a script that calls the CLI.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module in COMMANDS.get(cmd_name, ()):
            importlib.import_module(f"countersign.cli.{module}")
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Countersign: durable AI agents acting on business data through tools, safely.

    Run `.venv/bin/countersign dev up` first (or set TEMPORAL_ADDRESS / DATABASE_URL / LLM_BASE_URL).
    """


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run an async command body; any exception becomes a one-line reason on stderr and exit 1."""
    try:
        return asyncio.run(coro)
    except click.ClickException:
        raise
    except KeyboardInterrupt:
        raise click.Abort() from None
    except BrokenPipeError:
        reader_left()
    except Exception as exc:  # the CLI's contract: one line, non-zero exit
        raise click.ClickException(reason(exc)) from exc


def reader_left() -> NoReturn:
    """The reader stopped reading (`conversations list | head -1`): what it wanted was printed, so
    exit 0, and send what is still buffered nowhere instead of failing on it at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
