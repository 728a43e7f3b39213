"""One name for the admin role: `countersign.core.authority.ADMIN`, spelled out nowhere else.

A role check written `"admin" in roles` next to one written `ADMIN in roles` is two names for one
authority; renaming the role would then leave one check silently refusing (or, worse, granting)
what the other allows. So no product module (nor the benchmarks) writes the string "admin" but
the definition, except as a key of a dict (the pages' `header["admin"]` says whether the signed-in
person is an admin; it names no role).
"""

from __future__ import annotations

import ast
from pathlib import Path

from countersign.core import authority

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("countersign", "activities", "tools", "workflows", "bench", "worker.py", "starter.py")
DEFINITION = ROOT / "countersign" / "core" / "authority.py"


def keys(tree: ast.AST) -> set[int]:
    """The ids of the nodes used as a dict literal's keys or a subscript's index."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found.update(id(key) for key in node.keys if key is not None)
        elif isinstance(node, ast.Subscript):
            found.add(id(node.slice))
    return found


def bare_admin(path: Path) -> list[int]:
    """The lines of `path` that write the admin role as a string."""
    tree = ast.parse(path.read_text())
    as_key = keys(tree)
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value == authority.ADMIN and id(node) not in as_key
    ]


def test_the_admin_role_is_written_only_where_it_is_defined() -> None:
    files = [
        path
        for top in PRODUCT
        for path in ([ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py")))
        if path != DEFINITION
    ]
    bare = [f"{path.relative_to(ROOT)}:{line}" for path in files for line in bare_admin(path)]
    assert not bare, f"import ADMIN from countersign.core.authority instead: {bare}"
    assert bare_admin(DEFINITION), "the definition no longer spells the role: update this test"
