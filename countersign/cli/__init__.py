"""`countersign …` (or `.venv/bin/python starter.py …`): the starter CLI (`countersign --help` lists
its commands)."""

import os
import sys
import warnings

from countersign.cli.app import cli
from countersign.cli.ux import command


def main() -> None:
    # platformdirs (under the embedded binaries' packages) warns, in a traceback-like two lines, when
    # XDG_RUNTIME_DIR is unset (containers, CI, su shells); it falls back to /tmp and works.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    try:
        cli(prog_name=command())
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if isinstance(done.code, str):
            print(done.code, file=sys.stderr)
    tracing = sys.modules.get("countersign.observability.tracing")
    if tracing is not None:  # imported by a command that traces: export its spans before the hard exit
        tracing.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and every connection closed by now. Skipping interpreter finalization
    # avoids an intermittent abort ("PyGILState_Release: thread state … must be current") when the
    # Temporal client's native threads are torn down during it, which turned successes into -6.
    os._exit(code)


__all__ = ["cli", "main"]
