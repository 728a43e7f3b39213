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

        setattr(sandbox, "sandbox_runner", lambda **_: UnsandboxedWorkflowRunner())  # noqa: B010
    if "chain" in WITHOUT:  # no audit chain link for a tool call's audit row
        for module in (messages, tools):
            setattr(module, "chain", _nothing)  # noqa: B010
    if "events" in WITHOUT:  # no events for the conversation's readers (live transcript, deltas)
        setattr(messages, "publish_message", _nothing)  # noqa: B010
        for owner in (events, tools, events.EventLog):
            setattr(owner, "publish", _nothing)  # noqa: B010
    if "access" in WITHOUT:  # no access gate per call: standing and rate limits unchecked
        setattr(tools, "admit", _nothing)  # noqa: B010
    if "savepoint" in WITHOUT:  # a failing tool's partial writes no longer roll back alone
        from sqlalchemy.ext.asyncio import AsyncSession

        setattr(AsyncSession, "begin_nested", _no_savepoint)  # noqa: B010
    print(f"bench.cost --without: switched off {sorted(WITHOUT)}", file=sys.stderr)


if WITHOUT and sys.argv and sys.argv[0].endswith("worker.py"):
    _switch_off()
