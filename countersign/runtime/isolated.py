"""Native code that may die, run in a child process: its death is an error, never the caller's.

The Cedar engine (`cedarpy`) is native code: a stack overflow in it is a segfault that takes its whole
process with it. Compiling and validating a tenant's policy text (apply, validate, test) therefore
runs through `run_isolated`, in a child process of its own (`python -m countersign.runtime.isolated`,
JSON in on stdin, JSON out on stdout), so that a text that slips past the bounds
(countersign/core/policy_bounds.py) kills only that child: the caller gets `ChildDied`, and every
other request, other tenants' included, goes on. A child that runs past `timeout_s` is killed.

One child per task, not a pool of long-lived ones: a check is an admin's rare action, the child
costs about half a second to start, and a child that has ended holds nothing (no worker process
left behind holding the caller's pipes, nothing to replace after a crash, no state from another
tenant's text). `MAX_CHILDREN` bounds how many run at once in one process.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import resource
import sys
from typing import Any

CHILD_CPU_S = 60  # the kernel ends a child past this much CPU, whatever the caller's timeout
MAX_CHILDREN = 2
_SLOTS: asyncio.Semaphore | None = None


class ChildDied(RuntimeError):
    """The child process died (a crash in native code) or ran out of time: nothing it did counts."""


def _slots() -> asyncio.Semaphore:
    global _SLOTS
    if _SLOTS is None:
        _SLOTS = asyncio.Semaphore(MAX_CHILDREN)
    return _SLOTS


async def run_isolated(target: str, payload: Any, timeout_s: float = 30.0) -> Any:
    """`target` ("module:function", a function of one JSON value answering one) called with
    `payload` in a child process; its answer. Raises ChildDied when the child crashes, fails or
    runs past `timeout_s`."""
    async with _slots():
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "countersign.runtime.isolated", target,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(child.communicate(json.dumps(payload).encode()), timeout_s)
        except TimeoutError:
            child.kill()
            await child.wait()
            raise ChildDied(f"it ran longer than {timeout_s:g} s") from None
        except BaseException:
            if child.returncode is None:
                child.kill()
                await child.wait()
            raise
    if child.returncode != 0:
        code = child.returncode or 0
        why = f"signal {-code}" if code < 0 else f"exit {code}: {err.decode(errors='replace')[-300:]}"
        raise ChildDied(f"the process running it died ({why})")
    return json.loads(out)


def _child(target: str) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CHILD_CPU_S, CHILD_CPU_S))
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    json.dump(function(json.load(sys.stdin)), sys.stdout)


if __name__ == "__main__":
    _child(sys.argv[1])
