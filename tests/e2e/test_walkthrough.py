"""The walk-throughs of the README and of the documentation, run as typed from a fresh checkout.

Every ```console block of README.md, then of the site's tutorials and how-to guides (docs/, in
mkdocs.yml's nav order, with the pages its hook adds to a section) is a script: `$ ` lines are
commands, the lines below them their output. The test copies the project's files (what a clone of
the next commit holds) to a temporary directory, runs each command there with bash, in that order,
on one stack, and compares the output line by line. A block that cannot run here is named in
NOT_RUN, with why; it is checked for what can be (test_blocks_not_run_name_what_exists): the files
it names, compose's services and profiles, every `countersign` command's options against its
`--help`, `make` targets. A console block on another page of the site (reference, explanation)
must be one of NOT_RUN: the walk-through does not run those pages.
Workflow ids, times, relative times and pids may differ; an id the README uses in a later
command stands for the one the run printed. `echo $?` prints the previous command's exit status.
A command ending in `&` runs in the background (stopped at the end). The stack and the ports the
pages name (the mock identity provider's, a second inbox's, the metrics port) are moved to free
ports; the output is compared as if on the pages' own. After the single sign-on block, the test
signs in as bob through the mock provider as a browser would (the one step a console cannot show).

Knobs: WALKTHROUGH_VENV=reuse (default) gives the checkout a virtualenv that uses this one's
packages, so `make` has nothing to install; `fresh` lets `make demo` create and install one from
PyPI, as on a new machine. WALKTHROUGH_RECORD=1 writes the outputs of the run into the pages
instead of comparing (then review the diff).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import venv
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from countersign.cli import cli
from countersign.devstack.stack import DEFAULT_PORTS
from countersign.runtime.config import PROJECT_ROOT
from countersign.runtime.ports import free_port, port_open
from tests.fixtures.chat import Receiver, receiver_in_thread

README = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"
MKDOCS = PROJECT_ROOT / "mkdocs.yml"
WALKED_SECTIONS = {"Tutorials", "How-to guides"}  # nav sections whose console blocks run, in order
# The console blocks that cannot run here, by their first command, with why. Kept small: each
# costs a reader a command nobody ran for them.
NOT_RUN = {
    "make demo   # creates": "`make test` is this suite, and `make demo` runs in the first hour's block",
    "export LLM_BASE_URL=https://api.openai.com/v1": "no LLM is reachable here",
    ".venv/bin/countersign mcp add crm": "no MCP server at mcp.example.com",
    "sh deploy/secrets.sh": "no Docker engine here (tests/deploy/test_compose.py checks the file)",
    "docker compose --profile scripted": "no Docker engine here",
    "docker run -d -p 16686:16686": "no Docker engine here (Jaeger)",
    ".venv/bin/countersign rollback WF": "WF stands for one of the reader's conversations",
    ".venv/bin/countersign stats ": "its numbers are this machine's durations and this day's calls",
    ".venv/bin/countersign tokens create --tenant acme --name desktop": "it prints a new secret each time",
}
SSO_SECTION = "## Single sign-on with the mock provider"
# Ports the pages type (mock provider, a second inbox, the worker's metrics, the chat API the test
# serves): moved like the stack's.
CHAT_API_PORT = 9700
TYPED_PORTS = (9400, 8301, 9464, CHAT_API_PORT)
# The tokens docs/how-to/connect-telegram-and-slack.md types for the chat API on CHAT_API_PORT.
TELEGRAM_TOKEN, SLACK_TOKEN = "123456:ABC-example-token", "xoxb-example-token"
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
    # A PYTHONPATH naming another tree (a worktree's tests run with one) would run its code, not the clone's.
    "PYTHONPATH",
}

WORKFLOW_ID = r"conv-[a-z]+-[0-9a-f]{12}"
# Parts of an expected line that vary between runs, each with the pattern that matches a run's value.
VARYING = {
    "id": WORKFLOW_ID,
    "time": r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:\+00:00|Z)?",
    "pid": r"pid \d+",
    "relative": r"in \d+ (?:s|min|h|d)(?: \d+ (?:min|h))?|\d+ (?:s|min|h|d)(?: \d+ (?:min|h))? ago",
    "weekday": r"(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day",
    "elided": r"…",
}
SPLIT = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in VARYING.items()))


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    page: Path
    start: int  # line index of the first line inside the fence
    end: int  # line index of the closing fence
    steps: list[Step]
    section: str


def site_hooks() -> object:
    """docs/hooks/countersign_docs.py, which completes the site's nav (mkdocs.yml `hooks:`)."""
    spec = importlib.util.spec_from_file_location("countersign_docs", DOCS / "hooks" / "countersign_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def walked_pages() -> list[Path]:
    """The README, then the site's tutorials and how-to guides, in the site's order."""
    nav = yaml.safe_load(MKDOCS.read_text())["nav"]
    return [README, *site_hooks().pages(nav, DOCS, WALKED_SECTIONS)]  # type: ignore[attr-defined]


def every_page() -> list[Path]:
    """The README and every page of the site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def console_blocks(page: Path) -> list[Block]:
    """Every ```console block of `page`, in order, each with the heading it is under."""
    lines = page.read_text().split("\n")
    blocks, section, i = [], "", 0
    while i < len(lines):
        if lines[i].startswith("```") and lines[i] != "```console":
            i = lines.index("```", i + 1)  # another kind of block: its lines are not headings
        elif lines[i].startswith("#"):
            section = lines[i]
        elif lines[i] == "```console":
            end = lines.index("```", i + 1)
            steps: list[Step] = []
            for line in lines[i + 1 : end]:
                if line.startswith("$ "):
                    steps.append(Step(line[2:]))
                else:
                    steps[-1].expected.append(line)
            blocks.append(Block(page, i + 1, end, steps, section))
            i = end
        i += 1
    return blocks


def not_run_reason(block: Block) -> str | None:
    return next((why for first, why in NOT_RUN.items() if block.steps[0].command.startswith(first)), None)


def walkthrough_blocks() -> list[Block]:
    """The console blocks that run here, in the walk-through's order."""
    return [
        block for page in walked_pages() for block in console_blocks(page) if not_run_reason(block) is None
    ]


def every_block() -> list[Block]:
    return [block for page in every_page() for block in console_blocks(page)]


class Ids:
    """The pages' workflow ids and the ids the run printed in their place."""

    def __init__(self) -> None:
        self.actual: dict[str, str] = {}
        self.unclaimed: list[str] = []  # recording: printed ids no page's id stands for yet, newest last

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
        """A pattern for one expected line, and the pages' ids its groups capture (in order)."""
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
                parts.append(f"(?:{VARYING[kind or '']})")
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
    for script in ("temporal", "mcp-server-time", "oidc-provider-mock"):  # what `make` installs
        (bin_dir / script).symlink_to(Path(sys.executable).parent / script)
    # and its bytecode, as `make` compiles it: the steps run with PYTHONDONTWRITEBYTECODE=1, and
    # without it every command would compile the project's modules again (about 0.3 s each)
    subprocess.run(["make", "--no-print-directory", "-s", "bytecode"], cwd=root, check=True)
    (env / ".installed-stamp").touch()  # newer than the copied pyproject.toml: nothing to install


def run_step(
    command: str, cwd: Path, env: dict[str, str], previous: int, background: list[subprocess.Popen[bytes]]
) -> tuple[int, str]:
    if command == "echo $?":
        return 0, f"{previous}\n"
    if command.endswith("&"):  # a server the reader leaves running: its own session, stopped at the end
        background.append(
            subprocess.Popen(
                ["bash", "-c", command[:-1]],
                cwd=cwd,
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        return 0, ""
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


def as_default_ports(output: str, ports: dict[str, int], typed: dict[int, int]) -> str:
    for name, port in ports.items():
        output = output.replace(f":{port}", f":{DEFAULT_PORTS[name]}")
    for readme_port, port in typed.items():
        output = re.sub(rf"\b{port}\b", str(readme_port), output)
    return output


def on_free_ports(command: str, typed: dict[int, int]) -> str:
    """A command as typed, with the pages' fixed ports moved to the run's free ones."""
    for readme_port, port in typed.items():
        command = re.sub(rf"\b{readme_port}\b", str(port), command)
    return command


def wait_for_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not port_open("127.0.0.1", port):
        assert time.monotonic() < deadline, f"nothing listens on {port} after {timeout_s:.0f} s"
        time.sleep(0.2)


def sign_in_with_the_mock_provider(inbox: int, sub: str) -> dict[str, object]:
    """What a person does in the browser after the single sign-on block: open the inbox,
    click "Sign in with Mock IdP", type the user at the provider; /api/me then says who they are."""
    wait_for_port(inbox)
    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPCookieProcessor())
    page = first_page(opener, f"http://127.0.0.1:{inbox}/")
    assert "Sign in with Mock IdP" in page, page
    authorize = redirect_of(opener, urllib.request.Request(f"http://127.0.0.1:{inbox}/auth/oidc/login"))
    form = urllib.parse.urlencode({"sub": sub}).encode()
    callback = redirect_of(opener, urllib.request.Request(authorize, data=form))
    try:
        landing = opener.open(callback).read().decode()
    except urllib.error.HTTPError as refused:
        raise AssertionError(f"sign-in refused: {refused.read().decode()}") from refused
    assert "Signed in." in landing, landing
    me: dict[str, object] = json.loads(opener.open(f"http://127.0.0.1:{inbox}/api/me").read())
    return me


def first_page(opener: urllib.request.OpenerDirector, url: str, timeout_s: float = 60) -> str:
    """The page, once the server behind a just-opened port answers: on a loaded machine uvicorn
    listens a moment before it serves, and a request then has its connection reset."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return str(opener.open(url).read().decode())
        except (ConnectionError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def redirect_of(opener: urllib.request.OpenerDirector, request: urllib.request.Request) -> str:
    try:
        opener.open(request)
    except urllib.error.HTTPError as redirect:
        assert redirect.code in (302, 303), redirect.read().decode()
        return str(redirect.headers["Location"])
    raise AssertionError(f"{request.full_url} did not redirect")


@pytest.fixture
def clone_dir() -> Iterator[Path]:
    """A short path: PostgreSQL's socket lives in its data directory, and a socket path is at most
    107 bytes (pytest's tmp_path is too deep)."""
    with tempfile.TemporaryDirectory(prefix="cs-", dir="/tmp") as parent:
        yield Path(parent) / "countersign"


@pytest.mark.timeout(1800)
def test_the_readme_walkthrough_works_as_typed(clone_dir: Path) -> None:
    root = clone_dir
    checkout(root)
    if os.environ.get("WALKTHROUGH_VENV", "reuse") == "reuse":
        reuse_virtualenv(root)
    ports = {name: free_port() for name in DEFAULT_PORTS}
    typed = {port: free_port() for port in TYPED_PORTS}
    background: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if k not in CLEARED and not k.startswith("VIRTUAL_ENV")}
    env |= {name: str(port) for name, port in ports.items()}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    record = os.environ.get("WALKTHROUGH_RECORD") == "1"
    ids, status = Ids(), 0
    recorded: dict[Path, dict[int, tuple[int, list[str]]]] = {}
    serving = contextlib.ExitStack()  # the chat API the channels how-to posts to
    chat_api = Receiver(telegram_token=TELEGRAM_TOKEN, slack_token=SLACK_TOKEN)
    serving.enter_context(receiver_in_thread(typed[CHAT_API_PORT], chat_api))
    try:
        for block in walkthrough_blocks():
            written: list[str] = []
            for step in block.steps:
                command = ids.command(step.command)
                status, output = run_step(on_free_ports(command, typed), root, env, status, background)
                got = as_default_ports(output, ports, typed).rstrip("\n").split("\n")
                got = [] if got == [""] else got
                if command.startswith("make ") and step.expected:  # make may install first
                    first = ids.line_pattern(step.expected[0])[0]
                    got = got[next((i for i, g in enumerate(got) if first.fullmatch(g)), 0) :]
                if record:
                    written += [f"$ {command}", *got]
                    ids.saw(re.findall(WORKFLOW_ID, output))
                    continue
                problem = ids.match(step.expected, got)
                where = f"{block.page.relative_to(PROJECT_ROOT)} {block.section}"
                assert problem is None, f"{where}: `{step.command}`: {problem}\n--- output:\n{output}"
            recorded.setdefault(block.page, {})[block.start] = (block.end, written)
            if block.section == SSO_SECTION:
                me = sign_in_with_the_mock_provider(typed[8301], "bob")
                assert (me["tenant_id"], me["user_id"]) == ("acme", "bob"), me
    finally:
        for process in background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        subprocess.run(
            [root / ".venv" / "bin" / "countersign", "dev", "down"], cwd=root, env=env, check=False
        )
        serving.close()
    for page, blocks in recorded.items() if record else ():
        lines = page.read_text().split("\n")
        for start in sorted(blocks, reverse=True):
            end, written = blocks[start]
            lines[start:end] = written
        page.write_text("\n".join(lines))


def test_the_walk_through_reads_the_readme_then_the_tutorials_and_how_tos_in_the_sites_order() -> None:
    """The pages it runs are the README and every page of the two sections (a page the hook adds
    to a folder's section included), in mkdocs.yml's order."""
    pages = [page.relative_to(PROJECT_ROOT).as_posix() for page in walked_pages()]
    assert pages[:3] == ["README.md", "docs/tutorials/index.md", "docs/tutorials/first-hour.md"], pages
    assert pages.index("docs/how-to/reviewers.md") < pages.index("docs/how-to/observability.md")
    on_disk = {
        p.relative_to(PROJECT_ROOT).as_posix()
        for d in ("tutorials", "how-to")
        for p in (DOCS / d).glob("*.md")
    }
    assert set(pages[1:]) == on_disk


def test_every_console_block_runs_or_says_why_not() -> None:
    """Each NOT_RUN entry names a block that is there (no stale exceptions); the walked pages keep
    their commands in console blocks, where this test sees them (a ```bash block would be skipped);
    and a page the walk-through does not run (reference, explanation) has no block it would run."""
    blocks = every_block()
    for first in NOT_RUN:
        assert any(b.steps[0].command.startswith(first) for b in blocks), f"no block starts {first!r}"
    for page in walked_pages():
        assert "```bash" not in page.read_text().split("\n"), f"{page}: a ```bash block: make it ```console"
    walked = walkthrough_blocks()
    unwalked = [b for b in blocks if not_run_reason(b) is None and b not in walked]
    assert not unwalked, (
        f"blocks on pages the walk-through does not run: {[(str(b.page), b.section) for b in unwalked]}"
    )
    assert len(walked) + len(NOT_RUN) == len(blocks)


def typed_words(command: str) -> list[str]:
    """A command's words without the environment assignments in front of it."""
    words = shlex.split(command, comments=True)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        words.pop(0)
    return words


def countersign_options_exist(words: list[str]) -> None:
    """`countersign SUBCOMMAND … --opt …`: the subcommand's --help lists every option typed."""
    path = list(itertools.takewhile(lambda w: not w.startswith("-"), words))
    shown = CliRunner().invoke(cli, [*path, "--help"])
    assert shown.exit_code == 0, f"countersign {' '.join(path)} --help: {shown.output}"
    for option in (w.split("=")[0] for w in words if w.startswith("--")):
        assert option in shown.output, f"countersign {' '.join(path)} has no {option}"


@pytest.mark.parametrize("first", list(NOT_RUN))
def test_blocks_not_run_name_what_exists(first: str) -> None:
    """A block that cannot run here still types files that exist, compose services and profiles
    compose has, `make` targets the Makefile has, and `countersign` options its commands take."""
    block = next(b for b in every_block() if b.steps[0].command.startswith(first))
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    profiles = {p for service in services.values() for p in service.get("profiles", [])}
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    for step in block.steps:
        words = typed_words(step.command)
        if words[:1] == [".venv/bin/countersign"]:
            countersign_options_exist(words[1:])
        elif words[:1] in (["sh"], [".venv/bin/python"]):
            assert (PROJECT_ROOT / words[1]).is_file(), step.command
        elif words[:1] == ["make"]:
            assert re.search(rf"^{words[1]}:", makefile, re.M), f"no make target {words[1]}"
        elif words[:2] == ["docker", "compose"]:
            rest = words[2:]
            named = [rest[i + 1] for i, w in enumerate(rest) if w == "--profile"]
            assert set(named) <= profiles, f"compose has no profile {set(named) - profiles}"
            verb = next(i for i, w in enumerate(rest) if not w.startswith("-") and w not in named)
            if rest[verb] in ("exec", "run"):
                target = [w for w in rest[verb + 1 :] if not w.startswith("-")]
                assert target[0] in services, f"compose has no service {target[0]}"
                if target[1:2] == ["countersign"]:
                    countersign_options_exist(rest[rest.index("countersign") + 1 :])
        else:
            assert words[0] in ("export", "docker"), f"nothing checks {step.command!r}: say how in this test"
