"""The layers of docs/architecture.md, checked from the code's own imports: no layer reaches up.

Each package may import only the packages listed for it (and itself). Workflow code may import only the
pure core and the two workflow-safe modules named below, never activities, tools or storage.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CORE = "countersign.core"
RUNTIME = "countersign.runtime"
DB = "countersign.db"
BELOW_TOOLS = {CORE, RUNTIME, DB, "countersign.identity", "countersign.mcp"}
BELOW_SURFACES = BELOW_TOOLS | {"tools", "countersign.observability"}

ALLOWED: dict[str, set[str]] = {
    CORE: set(),
    RUNTIME: {CORE},
    DB: {CORE, RUNTIME},
    "countersign.migrations": {DB},
    "countersign.identity": {CORE, RUNTIME, DB},
    "countersign.mcp": {CORE, RUNTIME, DB},
    "tools": BELOW_TOOLS,
    "countersign.observability": BELOW_TOOLS | {"tools"},
    "activities": BELOW_SURFACES,
    "countersign.client": BELOW_SURFACES,
    "countersign.devstack": {CORE, RUNTIME, DB, "countersign.identity"},
    "countersign.scripted_model": {CORE, RUNTIME},
    "countersign.server": BELOW_SURFACES | {"countersign.client"},
    "countersign.cli": BELOW_SURFACES
    | {"countersign.client", "countersign.server", "countersign.devstack", "countersign.scripted_model"},
}
WORKFLOW_SAFE = {"countersign.runtime.search_attributes", "countersign.observability.workflow_metrics"}
OURS = {"countersign", "activities", "workflows", "tools", "worker", "starter"}


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "countersign" and len(parts) > 1 else parts[0]


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.split(".")[0] in OURS}


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    folder = package.replace(".", "/")
    reaching = {
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sources(folder)
        for module in imports(path)
        if package_of(module) not in ALLOWED[package] | {package}
    }
    assert not reaching, sorted(reaching)


def test_workflow_code_imports_only_the_pure_core() -> None:
    reaching = {
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sources("workflows")
        for module in imports(path)
        if package_of(module) not in {CORE, "workflows"} and module not in WORKFLOW_SAFE
    }
    assert not reaching, sorted(reaching)


def test_no_loose_modules_in_countersign() -> None:
    loose = [p.name for p in (ROOT / "countersign").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"put these in the package they belong to (docs/architecture.md): {loose}"
