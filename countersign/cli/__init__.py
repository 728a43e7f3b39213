"""`python starter.py …`: the starter CLI (commands are listed in CONTRACT.md)."""

import os
import sys

from countersign.cli import approvals, chat, conversations, db, demo, dev, inbox, model, records  # noqa: F401  (each registers its commands)
from countersign.cli.app import cli


def main() -> None:
    try:
        cli(prog_name="starter.py")
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if isinstance(done.code, str):
            print(done.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and every connection closed by now. Skipping interpreter finalization
    # avoids an intermittent abort ("PyGILState_Release: thread state … must be current") when the
    # Temporal client's native threads are torn down during it, which turned successes into -6.
    os._exit(code)


__all__ = ["cli", "main"]
