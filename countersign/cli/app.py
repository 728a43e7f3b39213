"""The root of the starter CLI. Each sub-module adds its commands to `cli`."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

T = TypeVar("T")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Countersign: durable AI agents acting on business data through tools, safely.

    Run `python starter.py dev up` first (or set TEMPORAL_ADDRESS / DATABASE_URL / LLM_BASE_URL).
    """


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run an async command body; any exception becomes a one-line reason on stderr and exit 1."""
    try:
        return asyncio.run(coro)
    except click.ClickException:
        raise
    except KeyboardInterrupt:
        raise click.Abort() from None
    except Exception as exc:  # the CLI's contract: one line, non-zero exit
        raise click.ClickException(one_line(exc)) from exc


def one_line(exc: BaseException) -> str:
    """The innermost reason of a Temporal error ("Workflow failed" → "no user 'x' in tenant 'acme'")."""
    while getattr(exc, "cause", None) is not None:
        exc = exc.cause  # type: ignore[attr-defined]
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
