"""The observability interceptors name the activities they watch by reference, never as strings.

Metrics, traces and usage rows pick their activities by `activity.info().activity_type`. Compared
with a string literal, a renamed activity would silently stop its metrics, spans and usage rows;
compared with its reference's `.name` (countersign/core/activity_refs.py, the same entry the
definition takes its registered name from), it is renamed with it. The references themselves are
held against what worker.py registers in tests/activities/test_activity_refs.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

from countersign.core import activity_refs
from countersign.core.activity_refs import ACTIVITIES

OBSERVABILITY = Path(__file__).resolve().parents[2] / "countersign" / "observability"
NAMES = {ref.name for ref in ACTIVITIES}


def compared_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal one side of a comparison (also inside a tuple, list or set there)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            for part in ast.walk(side):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found.append((part.lineno, part.value))
    return found


def referenced(tree: ast.AST) -> set[str]:
    """The names a module imports from countersign.core.activity_refs."""
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == activity_refs.__name__
        for alias in node.names
    }


def test_no_activity_is_compared_by_its_name_as_a_string() -> None:
    literal = [
        f"{path.name}:{line} compares {value!r}"
        for path in sorted(OBSERVABILITY.glob("*.py"))
        for line, value in compared_strings(ast.parse(path.read_text()))
        if value in NAMES
    ]
    assert not literal, f"use the activity's reference (`CALL_MODEL.name`, ...): {literal}"


def test_the_interceptors_watch_registered_activities_by_reference() -> None:
    watched = {
        module: referenced(ast.parse((OBSERVABILITY / module).read_text()))
        for module in ("metrics.py", "tracing.py", "usage.py")
    }
    assert all(watched.values()), f"an interceptor watches no activity by reference: {watched}"
    for module, names in watched.items():
        for name in names:
            ref = getattr(activity_refs, name)
            assert ref in ACTIVITIES, f"{module} watches {name}, which the worker does not register"
