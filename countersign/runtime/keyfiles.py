"""A deployment's secret in a file, created once by whichever process comes first.

The carried-state key (countersign.identity.carried_key) and the secrets key (countersign.db.sealed)
are made the same way: exclusive create, readable by its owner only, chowned to the user the
processes run as when a root one-shot makes it (compose's `keys`), and read by every other process.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path


def create_once(path: Path, make: Callable[[], bytes], owner: int | None = None) -> bool:
    """Write `make()` to `path` unless it exists (mode 0600; `owner`: that user id owns it, else
    the caller). True when this call created it; two processes at once: one writes, one keeps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as out:
        out.write(make())
        if owner is not None:
            os.fchown(out.fileno(), owner, owner)
    return True


def one_shot(
    prog: str, what: str, create: Callable[[Path, int | None], object], argv: list[str] | None
) -> None:
    """`python -m PROG PATH [--owner UID]`: `create` the key file `what` names unless it exists,
    owned by the user the processes run as (compose's `keys` one-shot, before any process reads it)."""
    parser = argparse.ArgumentParser(prog=prog, description=f"Create {what} unless it exists (once).")
    parser.add_argument("path", type=Path)
    parser.add_argument("--owner", type=int, help="the user id the processes run as (the file's owner)")
    args = parser.parse_args(argv)
    existed = args.path.exists()
    create(args.path, args.owner)
    print(f"{'kept' if existed else 'created'} {args.path}")
