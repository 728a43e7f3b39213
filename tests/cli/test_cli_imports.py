"""Commands that only read or write PostgreSQL do not import Temporal's client: every CLI command is
a new process, and that import alone is about a third of one's start-up (LazyGroup in cli/app.py
imports only the command's own modules)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from countersign.runtime.config import PROJECT_ROOT

PROBE = """
import sys
from countersign.cli.app import cli
try:
    cli(sys.argv[1:], prog_name="countersign", standalone_mode=False)
except SystemExit:
    pass
print("temporalio.client" in sys.modules)
"""


@pytest.mark.parametrize(
    "command",
    [
        ["permissions", "show", "--help"],
        ["audit", "--help"],
        ["grants", "list", "--help"],
        ["policy", "show", "--help"],
    ],
)
def test_a_database_command_starts_without_temporals_client(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *command], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "False", done.stdout
