"""What the CLI prints for a person (pure functions): result summaries, relative times, counts,
who may decide, and where a stdio MCP server's command is found."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import pkgutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pytest

import countersign.cli
from countersign.cli.app import COMMANDS, cli
from countersign.cli.approvals import shown_pending
from countersign.cli.session import tenant_of
from countersign.cli.ux import EXIT_INTERRUPTED, relative
from countersign.cli.waiting import SignedHint, approval_lines, unless_interrupted, who_can_decide
from countersign.core.contract import PendingApproval
from countersign.core.summaries import counted, summarize_result, usage_line
from countersign.mcp.servers import executable

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def envelope(data: object) -> str:
    return json.dumps({"ok": True, "data": data})


@pytest.mark.parametrize(
    ("content", "summary"),
    [
        (
            envelope(
                {"leads": [{"id": 1, "email": "jane.doe@example.com", "name": "Jane Doe", "status": "new"}]}
            ),
            "ok: 1 leads: Jane Doe (jane.doe@example.com, new)",
        ),
        (
            envelope({"lead": {"name": "Jane Doe", "status": "qualified"}, "previous_status": "new"}),
            "ok: Jane Doe (qualified), was new",
        ),
        (
            envelope(
                {
                    "session": 1,
                    "slots": [
                        {
                            "index": 1,
                            "starts_at": "2026-12-07T09:00:00Z",
                            "user_local": "Mon 09:00-09:30 UTC",
                        },
                        {
                            "index": 2,
                            "starts_at": "2026-12-07T10:00:00Z",
                            "user_local": "Mon 10:00-10:30 UTC",
                        },
                    ],
                }
            ),
            "ok: 2 slots: 1. Mon 09:00-09:30 UTC; 2. Mon 10:00-10:30 UTC",
        ),
        (envelope({"count": 2, "collection": "leads"}), "ok: count 2, collection leads"),
        (envelope({"result": {"timezone": "UTC", "is_dst": False}}), "ok: timezone UTC, is_dst False"),
        (
            json.dumps({"ok": False, "error": {"code": "FORBIDDEN", "message": "admins only"}}),
            "error FORBIDDEN: admins only",
        ),
        (
            json.dumps(
                {"ok": False, "needs": {"contact": True}, "candidates": [{"name": "Sam Lee", "email": "a@x"}]}
            ),
            "needs contact: Sam Lee (a@x)",
        ),
        ("not json", "not json"),
    ],
)
def test_a_tool_result_reads_as_one_line(content: str, summary: str) -> None:
    assert summarize_result(content) == summary


def test_a_long_result_is_cut() -> None:
    line = summarize_result(envelope({"leads": [{"name": "x" * 400}]}))
    assert len(line) == 160 and line.endswith("…")


@pytest.mark.parametrize(
    ("iso", "text"),
    [
        ("2026-11-25T11:59:58.544150+00:00", "in 23 h 59 min"),
        ("2026-11-24T12:05:00Z", "in 5 min"),
        ("2026-11-24T11:59:30+00:00", "30 s ago"),
        ("2026-11-27T13:00:00+00:00", "in 3 d 1 h"),
        ("2026-11-24T14:00:00+00:00", "in 2 h"),
        ("whenever", "whenever"),
    ],
)
def test_times_are_relative(iso: str, text: str) -> None:
    assert relative(iso, NOW) == text


def test_counts_are_singular_for_one() -> None:
    assert counted(1, "tool call") == "1 tool call"
    assert usage_line(2, 1, 531) == "2 model calls, 1 tool call, 531 tokens"


def test_waiting_names_who_may_decide_and_in_signed_mode_how() -> None:
    pending = PendingApproval(
        call_id="c1",
        tool="update_lead_status",
        args="{}",
        risk="high",
        requested_by="bob",
        requested_at=NOW.isoformat(),
        expires_at="2999-01-01T00:00:00+00:00",
    )
    assert who_can_decide(pending, ["carol"]) == "a user with role admin or reviewer other than bob (carol)"
    names = approval_lines("conv-acme-0123456789ab", pending, ["carol"])
    assert names[-2].endswith("approve conv-acme-0123456789ab c1 --as carol")
    signed = approval_lines("conv-acme-0123456789ab", pending, ["carol"], SignedHint("http://i:8300", "acme"))
    assert any("in the inbox: http://i:8300" in line for line in signed)
    assert any(line.endswith("login --tenant acme --as carol") for line in signed)
    assert tenant_of("conv-acme-0123456789ab") == "acme" and tenant_of("x") == "TENANT"


def test_a_stdio_command_is_found_in_the_projects_environment_first(tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    found = executable("mcp-server-time")  # installed into this environment only (a dev dependency)
    assert found == str(venv_bin / "mcp-server-time")
    assert executable("no-such-command-anywhere") is None
    script = tmp_path / "server"
    script.write_text("#!/bin/sh\n")
    assert executable(str(script)) is None  # not executable
    os.chmod(script, 0o755)
    assert executable(str(script)) == str(script)
    assert executable("sh") is not None  # on PATH


def test_the_web_uis_details_name_each_argument() -> None:
    from workflows.rules import call_details

    shown = call_details(
        "update_lead_status", '{"lead": "jane", "new_status": "qualified", "reason": "per [t]"}'
    )
    assert shown == "`update_lead_status` · lead: jane · new\\_status: qualified · reason: per \\[t\\]"
    assert call_details("x", "[1]") == "`x` (arguments not a JSON object)"


def test_each_command_is_found_in_the_modules_the_cli_names() -> None:
    """The CLI imports a command's modules only when it runs (COMMANDS): a command a module
    registers must be named there, under that module, or `countersign` would not know it."""
    for module in pkgutil.iter_modules(countersign.cli.__path__):
        importlib.import_module(f"countersign.cli.{module.name}")
    defined: dict[str, set[str]] = {}
    for name, command in cli.commands.items():
        commands = [command, *(command.commands.values() if isinstance(command, click.Group) else [])]
        defined[name] = {c.callback.__module__.rsplit(".", 1)[1] for c in commands if c.callback}
    assert set(COMMANDS) == set(defined)
    for name, modules in defined.items():
        assert modules <= set(COMMANDS[name]), name


def test_only_the_conversation_client_asks_which_mode_runs() -> None:
    """A command says what it does once: where signed and names mode differ, the difference is in
    the client `conversation_client()` chooses, not in a second body of the command."""
    asking = {
        path.name
        for path in Path(countersign.cli.__path__[0]).glob("*.py")
        for line in path.read_text().splitlines()
        if "signed_mode()" in line and not line.startswith("def ")
    }
    assert asking == {"conversation_client.py"}


async def test_ctrl_c_stops_a_wait_through_the_server_and_says_the_conversation_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # the server never answers
    interrupted = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, interrupted.set)
    with pytest.raises(SystemExit) as stopped:
        await unless_interrupted("conv-acme-0123456789ab", reply, interrupted)
    assert stopped.value.code == EXIT_INTERRUPTED
    assert "conversation conv-acme-0123456789ab goes on without this display" in capsys.readouterr().err
    assert reply.cancelled()  # only the display's wait: the conversation is not asked to stop


async def test_a_wait_through_the_server_answers_when_no_ctrl_c_comes() -> None:
    assert (
        await unless_interrupted("conv-acme-0123456789ab", asyncio.sleep(0, "replied"), asyncio.Event())
        == "replied"
    )


def test_a_pending_call_says_its_age_and_expiry_in_one_format() -> None:
    """`approvals list` wrote an age as `0m01s` beside `in 23 h 59 min`; one format now (issue 41)."""
    now = datetime.now(UTC)
    row = {
        "workflow_id": "conv-acme-000000000001",
        "call_id": "c1",
        "tool": "update_lead_status",
        "args": json.dumps({"lead": "jane.doe@example.com"}),
        "risk": "high",
        "requested_by": "alice",
        "requested_at": (now - timedelta(minutes=5, seconds=30)).isoformat(),
        "expires_at": (now + timedelta(hours=3, minutes=10, seconds=30)).isoformat(),
    }
    last = shown_pending(row, None).splitlines()[-1]
    assert last == "    risk high · requested by alice 5 min ago · expires in 3 h 10 min"
