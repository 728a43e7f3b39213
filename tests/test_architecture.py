"""The layers of docs/explanation/architecture.md, checked from the code's own imports: no layer reaches up.

Each package may import only the packages listed for it (and itself). Workflow code may import only the
pure core and the two workflow-safe modules named below, never activities, tools or storage. Within
activities/, an activity module imports no other activity module: only the helpers that define no
activity (the access gate, `@heartbeats`, the failure classes) and the audit row's home, audit.py.
The table in docs/explanation/architecture.md says the same, checked below.
"""

from __future__ import annotations

import ast
import re
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
# The one activity module the others import: every audited tool call's row is written from there.
AUDIT_HOME = "activities.audit"


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


def defines_activities(path: Path) -> bool:
    """Whether a module declares an activity (`@activity.defn`, with or without a name)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(target) == "activity.defn":
                    return True
    return False


def test_an_activity_module_imports_no_other_activity_module() -> None:
    """Activities share code through the layers below them (core, db, tools, ...), the helpers of
    activities/ that declare no activity, and AUDIT_HOME; never by reaching into another's module."""
    modules = {f"activities.{path.stem}": path for path in sources("activities") if path.stem != "__init__"}
    activity_modules = {name for name, path in modules.items() if defines_activities(path)}
    assert {AUDIT_HOME, "activities.tools", "activities.mcp"} <= activity_modules  # the rule sees them
    reaching = {
        f"{name} imports {module}"
        for name in sorted(activity_modules)
        for module in imports(modules[name])
        if module in activity_modules - {name, AUDIT_HOME}
    }
    assert not reaching, sorted(reaching)


def test_no_loose_modules_in_countersign() -> None:
    loose = [p.name for p in (ROOT / "countersign").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"put these in the package they belong to (docs/explanation/architecture.md): {loose}"


def documented_layers() -> dict[str, set[str]]:
    """docs/explanation/architecture.md's package table: each package's row and the packages it may import."""
    text = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    table = text.split("## The packages, bottom to top", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    layers: dict[str, set[str]] = {}
    for package, _holds, may_import in rows:
        names = re.findall(r"`([\w./]+)`", package)
        if names[0].endswith(".py"):  # the composition roots: anything
            continue
        (name,) = names
        layers[name.strip("/").replace("/", ".")] = {
            short if short == "tools" else f"countersign.{short}"
            for short in re.findall(r"`([\w.]+)`", may_import)
        }
    return layers


def test_the_documented_layers_are_the_checked_ones() -> None:
    documented = documented_layers()
    assert documented.pop("workflows") == {CORE} | WORKFLOW_SAFE
    assert documented == ALLOWED
