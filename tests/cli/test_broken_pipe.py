"""`countersign conversations list | head -1`: a reader that stops reading is not a failure (issue
41, item 9: "Error: [Errno 32] Broken pipe" and exit 1)."""

from __future__ import annotations

import subprocess
import sys

from countersign.runtime.config import PROJECT_ROOT

# A command body that prints more than a pipe holds, run the way every CLI command runs its body.
MANY_LINES = """
import click
from countersign.cli.app import run

async def body() -> None:
    for n in range(100_000):
        click.echo(f"conv-acme-{n:012x}  idle  operations  started 1 s ago")

run(body())
"""


def test_a_reader_that_stops_reading_ends_the_command_quietly() -> None:
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{sys.executable} -c '{MANY_LINES}' | head -1"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "conv-acme-000000000000  idle  operations  started 1 s ago\n"
    assert (done.returncode, done.stderr) == (0, "")
