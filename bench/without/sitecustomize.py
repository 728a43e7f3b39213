"""`python -m bench.cost --without ...` only (issue 36): what each guarantee costs, measured by
switching it off in the Countersign worker process of the bench, and nowhere else.

Python imports `sitecustomize` at start-up from the path; bench.cost puts this directory on the
path of that one process, with COUNTERSIGN_BENCH_WITHOUT naming what to switch off. A process not
started as `worker.py`, or without the variable, is untouched. Never part of the product: every
switch below gives up what the product promises (see docs/benchmark.md, "what each guarantee costs").
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

WITHOUT = {w for w in os.environ.get("COUNTERSIGN_BENCH_WITHOUT", "").split(",") if w}


class PatchMissed(SystemExit):
    """A switch whose target is gone or is something else: the run would measure nothing.

    A SystemExit, because Python's `site` catches any Exception raised by sitecustomize, prints
    one line and starts the worker unswitched; this one stops the process with its message."""


def _patch(switch: str, owner: Any, name: str, replacement: Any) -> None:
    """Replace the function `owner.name`, which must be there under that name: `setattr` on a
    renamed one would only add an attribute nobody calls, and `--without switch` measure nothing."""
    where = f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type) else owner.__name__
    target = getattr(owner, name, None)
    if not callable(target) or getattr(target, "__name__", None) != name:
        raise PatchMissed(
            f"bench.cost --without {switch}: {where}.{name} is not the function to switch off"
            f" (found {target!r}); update bench/without/sitecustomize.py"
        )
    setattr(owner, name, replacement)


async def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


@contextlib.asynccontextmanager
async def _no_savepoint(*_args: Any) -> AsyncIterator[None]:
    yield None


def _switch_off() -> None:
    sys.path.insert(0, os.getcwd())  # the worker's imports, as `python worker.py` finds them
    import activities.tools as tools
    import countersign.db.events as events
    import countersign.db.messages as messages

    if "sandbox" in WITHOUT:  # workflows run without the SDK's determinism checks
        from temporalio.worker import UnsandboxedWorkflowRunner

        import countersign.runtime.sandbox as sandbox

        _patch("sandbox", sandbox, "sandbox_runner", lambda **_: UnsandboxedWorkflowRunner())
    if "chain" in WITHOUT:  # no audit chain link for a tool call's audit row
        for module in (messages, tools):
            _patch("chain", module, "chain", _nothing)
    if "events" in WITHOUT:  # no events for the conversation's readers (live transcript, deltas)
        _patch("events", messages, "publish_message", _nothing)
        for owner in (events, tools, events.EventLog):
            _patch("events", owner, "publish", _nothing)
    if "access" in WITHOUT:  # no access gate per call: standing and rate limits unchecked
        _patch("access", tools, "admit", _nothing)
    if "savepoint" in WITHOUT:  # a failing tool's partial writes no longer roll back alone
        from sqlalchemy.ext.asyncio import AsyncSession

        _patch("savepoint", AsyncSession, "begin_nested", _no_savepoint)
    print(f"bench.cost --without: switched off {sorted(WITHOUT)}", file=sys.stderr)


if WITHOUT and sys.argv and sys.argv[0].endswith("worker.py"):
    try:
        _switch_off()
    except Exception as error:  # a module gone: `site` would print it and run the worker unswitched
        raise PatchMissed(f"bench.cost --without {','.join(sorted(WITHOUT))}: {error!r}") from error
