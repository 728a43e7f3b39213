"""docs/benchmark.md is written by several bench modules, each owning one section of it.

A section is the text between `<!-- name -->` and `<!-- /name -->` (each on its own line); a module
replaces its own and leaves the rest of the file as it is. The names: `bench.run` (the main report,
first in the file), `bench.observability`, `bench.mcp`, `bench.conversation_length`, `bench.inbox`,
`bench.hostile`, `bench.cost` (Countersign against the bare loop), `bench.waiting` (waiting at scale,
scale-out), `bench.load`, `bench.effects`, `bench.mcp_face` (a read through `/mcp` against the same
call in a conversation)
and `bench.soak`;
`cost.gate` (what `bench.cost --check` found this round), `cost.second` (issue 36: the profile,
the cuts, waiting at scale) and `cost.notes` (issue 25's profile and each cut's effect), all written
by hand, follow `bench.cost`, and
`effects.notes` (where a preview's time goes) `bench.effects`.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")
ENDING = (signal.SIGTERM, signal.SIGHUP)  # `timeout`, `kill`, a closed terminal


def run_to_the_end(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, where SIGTERM and SIGHUP end the run as Ctrl-C does: by cancelling it,
    so that every part it started is stopped on the way out. The dev servers, PostgreSQL and worker
    processes each run in a session of their own, which no signal to this process reaches; without
    this, SIGTERM ended the process at once and left them all running. Exits 128 + the signal."""
    received: list[int] = []

    async def cancellable() -> T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None

        def end(signum: int) -> None:
            if not received:  # once: a second signal must not cut the stopping short
                received.append(signum)
                task.cancel()

        for signum in ENDING:
            loop.add_signal_handler(signum, end, signum)
        return await main

    try:
        return asyncio.run(cancellable())
    except asyncio.CancelledError:
        if not received:
            raise
        name = signal.Signals(received[0]).name
        print(f"interrupted by {name}: everything the run started is stopped", file=sys.stderr)
        raise SystemExit(128 + received[0]) from None


def recorded_run(module: str, given: list[str], run: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run a benchmark and add what its section's header says: the load average at the start and
    the end (this machine is shared: ratios within one run are what compare) and the command."""
    started = [round(x, 2) for x in psutil.getloadavg()]
    results = run_to_the_end(run)
    results["machine"] = {
        "load_average_at_start": started,
        "load_average_at_end": [round(x, 2) for x in psutil.getloadavg()],
    }
    results["command"] = " ".join([f".venv/bin/python -m {module}", *given])
    return results


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def put_section(path: Path, name: str, text: str, *, first: bool = False) -> None:
    """Replace the section `name` of the markdown at `path` with `text`; a file without it (or no
    file) gets it at the end, or at the start with `first`. Writing the same text twice is a no-op."""
    begin, end = markers(name)
    block = f"{begin}\n{text.strip(chr(10))}\n{end}"
    current = path.read_text() if path.exists() else ""
    start = current.find(begin)
    if start >= 0:
        stop = current.find(end, start)
        if stop < 0:
            raise ValueError(f"{path}: {begin} without {end}")
        updated = current[:start] + block + current[stop + len(end) :]
    elif not current.strip():
        updated = block + "\n"
    elif first:
        updated = block + "\n\n" + current.lstrip("\n")
    else:
        updated = current.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(updated)


def write_section(markdown: Path, name: str, text: str, *, only_print: bool) -> None:
    """A bench module's section: printed (`--no-markdown`), or put into `markdown`."""
    if only_print:
        print(text)
    else:
        put_section(markdown, name, text)
