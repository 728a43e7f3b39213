"""The README's walk-through ("Your first hour"), run as typed from a fresh checkout.

Every ```console block of that section is a script: `$ ` lines are commands, the lines below them
their output. The test copies the project's files (what a clone of the next commit holds) to a
temporary directory, runs each command there with bash, and compares the output line by line.
Workflow ids, times, ages and pids may differ; an id the README uses in a later command stands for
the one the run printed. `echo $?` prints the previous command's exit status. The stack runs on
free ports; the output is compared as if on the default ones.

Knobs: WALKTHROUGH_VENV=reuse (default) gives the checkout a virtualenv that uses this one's
packages, so `make` has nothing to install; `fresh` lets `make demo` create and install one from
PyPI, as on a new machine. WALKTHROUGH_RECORD=1 writes the outputs of the run into README.md
instead of comparing (then review the diff).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import venv
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from countersign.devstack.stack import DEFAULT_PORTS
from countersign.runtime.config import PROJECT_ROOT
from countersign.runtime.ports import free_port

README = PROJECT_ROOT / "README.md"
SECTION = "## Your first hour"
COMMAND_TIMEOUT_S = 300  # `make demo` on a loaded machine; the others take seconds
# What the stack and the CLI read from the environment: the walk-through runs with none of it set.
CLEARED = {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TASK_QUEUE", "DATABASE_URL", "LLM_BASE_URL"}
CLEARED |= {
    "LLM_API_KEY",
    "LLM_MODEL",
    "OPENAI_API_KEY",
    "SCENARIO",
    "COUNTERSIGN_DATA_DIR",
    "TEMPORAL_UI_URL",
    # Under `make test` the README's own `make demo` would run as a sub-make and print
    # "make[1]: Entering directory …" lines a reader's shell does not show.
    "MAKELEVEL",
    "MAKEFLAGS",
    "MFLAGS",
}

WORKFLOW_ID = r"conv-[a-z]+-[0-9a-f]{12}"
# Parts of an expected line that vary between runs, each with the pattern that matches a run's value.
VARYING = {
    "id": WORKFLOW_ID,
    "time": r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:\+00:00|Z)?",
    "pid": r"pid \d+",
    "age": r"\d+[hm]\d{2}[ms]",
    "elided": r"…",
}
SPLIT = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in VARYING.items()))


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    start: int  # line index of the first line inside the fence
    end: int  # line index of the closing fence
    steps: list[Step]


def walkthrough_blocks(lines: list[str]) -> list[Block]:
    begin = lines.index(SECTION)
    finish = next((i for i in range(begin + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    blocks, i = [], begin
    while i < finish:
        if lines[i] == "```console":
            end = lines.index("```", i + 1)
            steps: list[Step] = []
            for line in lines[i + 1 : end]:
                if line.startswith("$ "):
                    steps.append(Step(line[2:]))
                else:
                    steps[-1].expected.append(line)
            blocks.append(Block(i + 1, end, steps))
            i = end
        i += 1
    return blocks


class Ids:
    """README workflow ids and the ids the run printed in their place."""

    def __init__(self) -> None:
        self.actual: dict[str, str] = {}
        self.unclaimed: list[str] = []  # recording: printed ids no README id stands for yet, newest last

    def saw(self, printed: list[str]) -> None:
        claimed = set(self.actual.values())
        self.unclaimed += [i for i in dict.fromkeys(printed) if i not in claimed and i not in self.unclaimed]

    def command(self, text: str) -> str:
        def actual(m: re.Match[str]) -> str:
            if m.group() not in self.actual and self.unclaimed:  # recording: the latest conversation
                self.actual[m.group()] = self.unclaimed.pop()
            return self.actual.get(m.group(), m.group())

        return re.sub(WORKFLOW_ID, actual, text)

    def line_pattern(self, expected: str) -> tuple[re.Pattern[str], list[str]]:
        """A pattern for one expected line, and the README ids its groups capture (in order)."""
        parts, new_ids, last = [], [], 0
        for m in SPLIT.finditer(expected):
            parts.append(re.escape(expected[last : m.start()]))
            kind, text = m.lastgroup, m.group()
            if kind == "id" and text in self.actual:
                parts.append(re.escape(self.actual[text]))
            elif kind == "id":
                parts.append(f"({WORKFLOW_ID})")
                new_ids.append(text)
            elif kind == "elided":
                parts.append(".*")
            else:
                parts.append(VARYING[kind or ""])
            last = m.end()
        parts.append(re.escape(expected[last:]))
        return re.compile("".join(parts)), new_ids

    def match(self, expected: list[str], actual: list[str]) -> str | None:
        """Why `actual` does not read as `expected`, or None (binding the ids it printed)."""
        if len(expected) != len(actual):
            return f"expected {len(expected)} lines, got {len(actual)}"
        for number, (want, got) in enumerate(zip(expected, actual, strict=True), 1):
            pattern, new_ids = self.line_pattern(want)
            found = pattern.fullmatch(got)
            if found is None:
                return f"line {number}: expected {want!r}, got {got!r}"
            self.actual.update(zip(new_ids, found.groups(), strict=True))
        return None


def checkout(target: Path) -> None:
    """The files a clone of the next commit would hold: tracked and new ones, not the ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = PROJECT_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(source.read_bytes())
            (target / name).chmod(source.stat().st_mode)


def reuse_virtualenv(root: Path) -> None:
    """A .venv whose packages are this one's and whose project code is the checkout's, with the
    console script and the binaries `make` would have installed, stamped as installed."""
    env = root / ".venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    site = Path(
        subprocess.run(
            [env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # The checkout first: this virtualenv's editable install points at the original tree.
    (site / "walkthrough.pth").write_text(f"{root}\n{sysconfig.get_paths()['purelib']}\n")
    bin_dir = env / "bin"
    (bin_dir / "countersign").write_text(
        f"#!{bin_dir / 'python'}\nimport sys\nfrom countersign.cli import main\nsys.exit(main())\n"
    )
    (bin_dir / "countersign").chmod(0o755)
    (bin_dir / "temporal").symlink_to(Path(sys.executable).parent / "temporal")
    (env / ".installed-stamp").touch()  # newer than the copied pyproject.toml: nothing to install


def run_step(command: str, cwd: Path, env: dict[str, str], previous: int) -> tuple[int, str]:
    if command == "echo $?":
        return 0, f"{previous}\n"
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    return done.returncode, done.stdout


def as_default_ports(output: str, ports: dict[str, int]) -> str:
    for name, port in ports.items():
        output = output.replace(f":{port}", f":{DEFAULT_PORTS[name]}")
    return output


@pytest.fixture
def clone_dir() -> Iterator[Path]:
    """A short path: PostgreSQL's socket lives in its data directory, and a socket path is at most
    107 bytes (pytest's tmp_path is too deep)."""
    with tempfile.TemporaryDirectory(prefix="cs-", dir="/tmp") as parent:
        yield Path(parent) / "countersign"


@pytest.mark.timeout(900)
def test_the_readme_walkthrough_works_as_typed(clone_dir: Path) -> None:
    root = clone_dir
    checkout(root)
    if os.environ.get("WALKTHROUGH_VENV", "reuse") == "reuse":
        reuse_virtualenv(root)
    ports = {name: free_port() for name in DEFAULT_PORTS}
    env = {k: v for k, v in os.environ.items() if k not in CLEARED and not k.startswith("VIRTUAL_ENV")}
    env |= {name: str(port) for name, port in ports.items()}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    record = os.environ.get("WALKTHROUGH_RECORD") == "1"
    lines = README.read_text().split("\n")
    ids, status, recorded = Ids(), 0, {}
    try:
        for block in walkthrough_blocks(lines):
            written: list[str] = []
            for step in block.steps:
                command = ids.command(step.command)
                status, output = run_step(command, root, env, status)
                got = as_default_ports(output, ports).rstrip("\n").split("\n")
                if command.startswith("make ") and step.expected:  # make may install first
                    first = ids.line_pattern(step.expected[0])[0]
                    got = got[next((i for i, g in enumerate(got) if first.fullmatch(g)), 0) :]
                if record:
                    written += [f"$ {command}", *got]
                    ids.saw(re.findall(WORKFLOW_ID, output))
                    continue
                problem = ids.match(step.expected, got)
                assert problem is None, f"`{step.command}`: {problem}\n--- output:\n{output}"
            recorded[block.start] = (block.end, written)
    finally:
        subprocess.run(
            [root / ".venv" / "bin" / "countersign", "dev", "down"], cwd=root, env=env, check=False
        )
    if record:
        for start in sorted(recorded, reverse=True):
            end, written = recorded[start]
            lines[start:end] = written
        README.write_text("\n".join(lines))
