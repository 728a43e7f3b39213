"""The Cedar engine's crash costs a child process, not the caller (countersign/runtime/isolated.py):
a text nested 3,000 deep segfaults `cedarpy`; run isolated, the caller gets ChildDied and goes on."""

from __future__ import annotations

import os

import pytest

from countersign.runtime.isolated import ChildDied, run_isolated

DEEP = '@id("deep") permit(principal, action, resource) when { ' + "(" * 3_000 + "true" + ")" * 3_000 + " };"
CHECK = "countersign.core.cedar_policy:set_problems"


async def test_a_crash_in_the_engine_kills_only_the_child() -> None:
    with pytest.raises(ChildDied, match="signal 11"):
        await run_isolated("cedarpy:policies_to_json_str", DEEP)  # past the bounds: a segfault
    assert os.getpid()  # still here
    # the bounds come first in the check itself: the engine never reads the text
    problems = await run_isolated(CHECK, {"text": DEEP, "tools": []})
    assert len(problems) == 1 and "nests deeper than" in problems[0]
    assert "permit" in await run_isolated(
        "cedarpy:policies_to_json_str", "permit(principal, action, resource);"
    )


async def test_a_child_that_runs_too_long_is_killed() -> None:
    with pytest.raises(ChildDied, match=r"longer than 0\.01 s"):
        await run_isolated(CHECK, {"text": "", "tools": []}, timeout_s=0.01)
