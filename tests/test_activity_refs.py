"""The activity references (countersign/core/activity_refs.py) against what worker.py registers.

The workflow names an activity only through its reference, so a reference the worker does not
register is a call no worker answers, and an activity registered without one is one the workflow
cannot reach by reference. Each reference's input and result types are held against the
definition's own annotations: the workflow encodes the one and decodes the other.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from temporalio import activity

import worker
from countersign.core.activity_refs import ACTIVITIES, ActivityRef
from countersign.runtime.config import Settings


class Registered(Exception):
    """Raised by the stand-in Worker with what build_worker registers (nothing is started)."""

    def __init__(self, activities: list[Callable[..., Any]]) -> None:
        self.activities = activities


class StandInClient:
    def config(self) -> dict[str, Any]:
        return {}


def refuse_to_run(*_args: Any, activities: list[Callable[..., Any]], **_kwargs: Any) -> None:
    raise Registered(activities)


def registered(monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[..., Any]]:
    """Every activity build_worker registers, by registered name (no server, no database: the
    engine never connects)."""
    monkeypatch.setattr(worker, "Client", lambda **_config: StandInClient())
    monkeypatch.setattr(worker, "Worker", refuse_to_run)
    sessions = async_sessionmaker(create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none"))
    with pytest.raises(Registered) as built:
        worker.build_worker(StandInClient(), Settings(llm_base_url="http://127.0.0.1:1/v1"), sessions)  # type: ignore[arg-type]
    definitions = {}
    for fn in built.value.activities:
        defn = activity._Definition.must_from_callable(fn)
        assert defn.name is not None, f"{fn} is registered without a name"
        definitions[defn.name] = fn
    return definitions


def test_the_worker_registers_exactly_the_referenced_activities(monkeypatch: pytest.MonkeyPatch) -> None:
    names = set(registered(monkeypatch))
    referenced = [ref.name for ref in ACTIVITIES]
    assert len(referenced) == len(set(referenced)), "a name is referenced twice"
    assert not names - set(referenced), f"registered without a reference: {sorted(names - set(referenced))}"
    assert not set(referenced) - names, f"referenced, never registered: {sorted(set(referenced) - names)}"


def members(hint: Any) -> tuple[Any, ...]:
    """The types a union annotation names, or the annotation itself."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


@pytest.mark.parametrize("ref", ACTIVITIES, ids=lambda ref: ref.name)
def test_a_reference_types_its_activity_as_the_definition_does(
    monkeypatch: pytest.MonkeyPatch, ref: ActivityRef[Any, Any]
) -> None:
    fn = registered(monkeypatch)[ref.name]
    hints = typing.get_type_hints(fn)
    returns = hints.pop("return")
    (parameter,) = hints.values()
    assert parameter == ref.input, f"{ref.name} takes {parameter}, its reference says {ref.input}"
    # what the workflow decodes is what the activity answers, or one of its answers (execute_tool
    # answers the whole result to a caller that does not store it)
    assert ref.result in members(returns), f"{ref.name} answers {returns}, its reference reads {ref.result}"
