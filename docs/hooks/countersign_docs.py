"""MkDocs hooks of the documentation site (mkdocs.yml `hooks:`), and the page order the walk-through
test reads (tests/e2e/test_walkthrough.py).

- A nav section named for a folder (SECTIONS) lists the pages whose order matters; every other page
  in that folder is added after them, by file name. A page added under docs/how-to/ or
  docs/explanation/ is in the site without an edit to mkdocs.yml (and `mkdocs build --strict`
  still fails on a page outside every section: `validation: omitted_files: warn`).
- A marker in a page becomes a reference drawn from the code, so it cannot drift from it:
  `<!-- countersign-cli -->` the CLI's own `--help` of every command, `<!-- countersign-api -->` the
  server's routes, `<!-- countersign-contract -->` the conversation workflow's signals, updates and
  queries with their payloads' JSON Schema, `<!-- countersign-environment -->` every environment
  variable the code reads, with the pages that say more about it; `<!-- countersign-openapi -->`
  the operations of the server's OpenAPI document (countersign/server/openapi.py), which the site
  also carries whole as reference/openapi.json (`on_files`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_type_hints

import click

# Nav section title -> the folder under docs/ whose pages it holds.
SECTIONS = {
    "Tutorials": "tutorials",
    "How-to guides": "how-to",
    "Reference": "reference",
    "Explanation": "explanation",
}
ROOT = Path(__file__).resolve().parents[2]


def page_of(item: Any) -> str | None:
    """The file of a nav item: `page.md` or `{title: page.md}` (None for a link or a section)."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and len(item) == 1:
        (value,) = item.values()
        return value if isinstance(value, str) and value.endswith(".md") else None
    return None


def completed(nav: list[Any], docs_dir: Path) -> list[Any]:
    """`nav` with each folder section's unlisted pages added at its end, by file name."""
    out: list[Any] = []
    for entry in nav:
        if isinstance(entry, dict) and len(entry) == 1:
            ((title, items),) = entry.items()
            if title in SECTIONS and isinstance(items, list):
                listed = {page_of(item) for item in items}
                folder = SECTIONS[title]
                new = [
                    f"{folder}/{path.name}"
                    for path in sorted((docs_dir / folder).glob("*.md"))
                    if f"{folder}/{path.name}" not in listed
                ]
                entry = {title: [*items, *new]}
        out.append(entry)
    return out


def pages(nav: list[Any], docs_dir: Path, titles: set[str]) -> list[Path]:
    """The pages of the sections named `titles`, in the site's order."""
    found: list[Path] = []
    for entry in completed(nav, docs_dir):
        if isinstance(entry, dict) and len(entry) == 1:
            ((title, items),) = entry.items()
            if title in titles:
                found += [docs_dir / page for page in map(page_of, items) if page is not None]
    return found


def cli_reference() -> str:
    """Every command's `--help`, as the CLI prints it, one heading per command."""
    from countersign.cli import cli  # the project's CLI: imported only when a page asks for it

    blocks: list[str] = []

    def walk(command: click.Command, path: list[str], parent: click.Context | None) -> None:
        context = click.Context(command, info_name=path[-1], parent=parent, terminal_width=100)
        blocks.append(f"## `{' '.join(path)}`\n\n```text\n{command.get_help(context)}\n```\n")
        if isinstance(command, click.Group):
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], context)

    walk(cli, ["countersign"], None)
    return "\n".join(blocks)


def api_reference() -> str:
    """The server's routes as its modules add them (`app.router.add_METHOD(path, handler)`), with
    the first line of each handler's docstring."""
    rows = ["| method | path | handler | what it does |", "| --- | --- | --- | --- |"]
    modules = {
        path: ast.parse(path.read_text()) for path in sorted((ROOT / "countersign" / "server").glob("*.py"))
    }
    constants = {  # a path a module names by a constant (oidc.CALLBACK_PATH)
        target.id: node.value.value
        for tree in modules.values()
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for module, tree in modules.items():
        docs = {
            node.name: (ast.get_docstring(node) or "").split("\n\n")[0].replace("\n", " ")
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            verb = node.func.attr.removeprefix("add_")
            args = node.args
            if not node.func.attr.startswith("add_") or verb in ("routes", "static") or len(args) < 2:
                continue
            if verb == "route" and isinstance(args[0], ast.Constant):
                verb, args = str(args[0].value), args[1:]
            first = args[0]
            path = first.value if isinstance(first, ast.Constant) else None
            path = constants.get(first.id) if isinstance(first, ast.Name) else path
            if not isinstance(path, str):
                continue
            handler = ast.unparse(args[1])
            what = docs.get(handler.split(".")[-1], "").replace("|", "\\|")
            module_name = module.relative_to(ROOT).as_posix()
            rows.append(f"| {verb.upper()} | `{path}` | `{module_name}` `{handler}` | {what} |")
    return "\n".join(rows) + "\n"


def contract_reference() -> str:
    """The conversation workflow's signals, updates and queries (the SDK's own reading of the
    class), each with its argument's and result's types, and the JSON Schema of each argument."""
    from pydantic import BaseModel
    from temporalio import workflow

    from workflows.agent import AgentWorkflow

    definition = workflow._Definition.from_class(AgentWorkflow)
    assert definition is not None, "AgentWorkflow is no workflow definition"
    out: list[str] = []
    kinds: list[tuple[str, dict[str | None, Any]]] = [
        ("Signals", dict(definition.signals)),
        ("Updates", dict(definition.updates)),
        ("Queries", dict(definition.queries)),
    ]
    for kind, handlers in kinds:
        out.append(f"## {kind}\n")
        for name in sorted(n for n in handlers if n is not None):
            fn: Callable[..., Any] = handlers[name].fn
            hints = get_type_hints(fn)
            result = hints.pop("return", None)
            argument = next(iter(hints.values()), None)
            out.append(f"### `{name}`\n")
            out.append(f"Argument: `{type_name(argument)}`; result: `{type_name(result)}`.\n")
            for model in getattr(argument, "__args__", (argument,)):
                if isinstance(model, type) and issubclass(model, BaseModel):
                    schema = json.dumps(model.model_json_schema(), indent=2)
                    indented = "\n".join(f"    {line}" for line in schema.splitlines())
                    note = f'??? note "{model.__name__} (JSON Schema)"'
                    out.append(f"{note}\n\n    ```json\n{indented}\n    ```\n")
    return "\n".join(out)


def type_name(annotation: Any) -> str:
    """`SubmitMessage | Unreadable`, `list[ChatMessage]`, `None`: an annotation as it is written."""
    if annotation is None or annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not getattr(annotation, "__args__", None):
        return annotation.__name__
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", str(annotation))


# `os.environ.get("X")`, `os.environ["X"]`, `env.get("X")`, `pick("X")`: how the code reads a variable.
ENV_READ = re.compile(r'(?:environ(?:\.get)?\(|environ\[|env\.get\(|pick\()"([A-Z][A-Z0-9_]+)"')
CODE = ("countersign", "activities", "tools", "workflows", "worker.py", "starter.py")


def environment_reference(docs_dir: Path) -> str:
    """Every environment variable the code reads, where, and the pages that name it."""
    readers: dict[str, set[str]] = {}
    for top in CODE:
        base = ROOT / top
        for path in [base] if base.is_file() else sorted(base.rglob("*.py")):
            for name in ENV_READ.findall(path.read_text()):
                readers.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    texts = {
        path: path.read_text()
        for path in sorted(docs_dir.rglob("*.md"))
        if path.parent.name != "reference" or path.stem != "configuration"
    }
    rows = ["| variable | read by | described in |", "| --- | --- | --- |"]
    for name in sorted(readers):
        pages = [
            f"[{path.relative_to(docs_dir).as_posix()}](../{path.relative_to(docs_dir).as_posix()})"
            for path, text in texts.items()
            if re.search(rf"\b{name}\b", text)
        ]
        modules = ", ".join(f"`{m}`" for m in sorted(readers[name]))
        rows.append(f"| `{name}` | {modules} | {', '.join(pages)} |")
    return "\n".join(rows) + "\n"


OPENAPI_FILE = "reference/openapi.json"


def openapi_document() -> dict[str, Any]:
    """The server's OpenAPI document, of the routes countersign/server/openapi.py describes."""
    from countersign.server.openapi import OPERATIONS, document

    return document(sorted(OPERATIONS))


def openapi_reference() -> str:
    """One row per operation of the document: what it takes and what it answers."""
    rows = ["| method | path | what it does | body | answers |", "| --- | --- | --- | --- | --- |"]
    for path, operations in openapi_document()["paths"].items():
        for method, op in operations.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            success = next(code for code in op["responses"] if code != "default")
            content = op["responses"][success].get("content", {})
            media: list[dict[str, Any]] = list(content.values())
            answer = media[0].get("schema", {}) if media else {}
            shown = ", ".join(f"`{media}`" for media in content if media != "application/json")
            rows.append(
                f"| {method.upper()} | `{path}` | {op['summary']} | {schema_name(body)} "
                f"| {success} {schema_name(answer) or shown} |"
            )
    return "\n".join(rows) + "\n"


def schema_name(schema: dict[str, Any]) -> str:
    """A schema as the table shows it: the component it names, `[…]` for an array of one."""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if schema.get("type") == "array":
        return f"[{schema_name(schema.get('items', {})) or 'object'}]"
    return "object" if schema.get("type") == "object" or "allOf" in schema else ""


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    content = json.dumps(openapi_document(), indent=1)
    files.append(File.generated(config, OPENAPI_FILE, content=content))
    return files


def on_config(config: Any) -> Any:
    config["nav"] = completed(config["nav"], Path(config["docs_dir"]))
    return config


def on_page_markdown(markdown: str, config: Any, **_: Any) -> str:
    generated: dict[str, Callable[[], str]] = {
        "<!-- countersign-cli -->": cli_reference,
        "<!-- countersign-api -->": api_reference,
        "<!-- countersign-openapi -->": openapi_reference,
        "<!-- countersign-contract -->": contract_reference,
        "<!-- countersign-environment -->": lambda: environment_reference(Path(config["docs_dir"])),
    }
    for marker, render in generated.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
