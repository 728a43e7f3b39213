"""What the CLI tells a person: how to run it again, one-line reasons, whether the embedded stack is up.

Kept apart from the commands so every command words these the same way. Light to import (the
scripted model and the mail catcher are CLI commands too): Temporal's client, the stack and the
database engine are imported by the functions that need them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from countersign.runtime.config import DATA_DIR, Settings, load_settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

T = TypeVar("T")

# `start --wait` / `send` exit with this when the turn waits for a person (an approval or an answer):
# the conversation goes on, and the output names the command that lets it continue.
EXIT_WAITING = 3
# ... with this when the turn stopped short of a reply: a budget or limit reached, or an error (the
# reply says which). A script must not read "LIMIT_REACHED: …" as the agent's answer.
EXIT_STOPPED = 4
# Ctrl-C while following a turn: the conversation goes on without the display.
EXIT_INTERRUPTED = 130


def command() -> str:
    """The CLI as the person ran it, to print commands they can paste: `.venv/bin/countersign`,
    `countersign` (on PATH) or `.venv/bin/python starter.py`."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "starter.py":
        return f"{shown_path(Path(sys.executable))} {shown_path(argv0)}"
    found = shutil.which(argv0.name)
    if found and Path(found).resolve() == argv0.resolve():
        return argv0.name
    return shown_path(argv0)


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when it is inside it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def relative(iso: str, now: datetime | None = None) -> str:
    """An ISO time as a person reads it next to now: `in 23 h 59 min`, `4 min ago`, `in 12 s`."""
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = int((moment - (now or datetime.now(UTC))).total_seconds())
    left = abs(seconds)
    if left < 60:
        text = f"{left} s"
    elif left < 3600:
        text = f"{left // 60} min"
    elif left < 86400:
        text = f"{left // 3600} h {left % 3600 // 60} min" if left % 3600 >= 60 else f"{left // 3600} h"
    else:
        text = f"{left // 86400} d {left % 86400 // 3600} h"
    return f"in {text}" if seconds >= 0 else f"{text} ago"


def reason(exc: BaseException) -> str:
    """One line a person can act on, without the SDK's class names."""
    from temporalio.client import (
        WorkflowFailureError,
        WorkflowUpdateFailedError,
        WorkflowUpdateRPCTimeoutOrCancelledError,
    )
    from temporalio.exceptions import ActivityError, FailureError
    from temporalio.service import RPCError, RPCStatusCode

    if isinstance(exc, WorkflowFailureError):
        return reason(exc.cause) if exc.cause is not None else "the conversation failed"
    if isinstance(exc, WorkflowUpdateFailedError):
        return reason(exc.cause) if exc.cause is not None else "the conversation refused the request"
    if isinstance(exc, WorkflowUpdateRPCTimeoutOrCancelledError):
        return (
            "the conversation did not answer in time: is a worker running? "
            f"(`{command()} dev status` shows it)"
        )
    if isinstance(exc, RPCError):
        if exc.status == RPCStatusCode.NOT_FOUND and "already completed" in exc.message:
            return (
                "the conversation has ended (ended, cancelled or timed out; `status` says which): "
                "nothing was sent; `start` begins a new one"
            )
        if exc.status == RPCStatusCode.NOT_FOUND:
            return f"not found: {exc.message}"
        if exc.status == RPCStatusCode.UNAVAILABLE:
            return f"Temporal is unreachable ({exc.message}): `{command()} dev status` shows the stack"
        return exc.message
    if isinstance(exc, ActivityError) and exc.cause is not None:
        return reason(exc.cause)  # "Activity task failed" says nothing: what failed in it does
    if isinstance(exc, FailureError):
        return exc.message
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def stack_down(component: str, env_var: str) -> str | None:
    """Why `component` of the embedded stack cannot be used, when `env_var` does not point elsewhere.

    Without this, a client falling back to the default addresses would reach whatever else listens
    there (another Temporal dev server on 7233) and report "workflow not found".
    """
    if os.environ.get(env_var):
        return None
    from countersign.devstack import stack

    plan = stack.plan_from_env(os.environ, DATA_DIR)
    state = next(c for c in stack.status(plan) if c.name == component)
    if state.state in ("running", "external"):
        return None
    return (
        f"the embedded stack is not running ({component} is stopped): start it with "
        f"`{command()} dev up`, or set {env_var}"
    )


def database_url() -> str:
    """DATABASE_URL, or the embedded stack's when it runs; a one-line reason otherwise."""
    down = stack_down("postgres", "DATABASE_URL")
    url = load_settings().database_url
    if down or not url:
        raise click.ClickException(down or f"no DATABASE_URL: run `{command()} dev up` or set DATABASE_URL")
    return url


async def with_session(work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """`work` in one transaction on `database_url()`."""
    from countersign.db.engine import create_engine, session_factory

    engine = create_engine(database_url(), pool_size=1, max_overflow=0)
    try:
        async with session_factory(engine)() as session, session.begin():
            return await work(session)
    finally:
        await engine.dispose()


def temporal_settings() -> Settings:
    """The settings, once Temporal is known to be where they point (see `stack_down`)."""
    down = stack_down("temporal", "TEMPORAL_ADDRESS")
    if down:
        raise click.ClickException(down)
    return load_settings()
