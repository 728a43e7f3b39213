"""The secret every worker of a deployment seals carried state with (countersign/core/seal.py).

Every worker must hold the same key: a conversation continues as new on whichever worker polls
next, and that worker verifies the seal the previous one made. So a deployment's key is created
once, before any worker starts, and workers only read it:

- `CARRIED_STATE_KEY`: the secret itself, from the environment;
- `CARRIED_STATE_KEY_FILE`: a file holding it, created once by `python -m
  countersign.identity.carried_key PATH --owner UID` (compose's `keys` one-shot, before any worker)
  and only read by workers: a worker that cannot read it fails at start, naming the file and its
  own user, instead of making a key of its own that no other replica knows;
- neither (the embedded dev stack): `.data/carried-state.key`, created on first use.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from countersign.runtime.config import DATA_DIR
from countersign.runtime.keyfiles import create_once, one_shot

KEY_ENV = "CARRIED_STATE_KEY"
KEY_FILE_ENV = "CARRIED_STATE_KEY_FILE"
KEY_FILE = DATA_DIR / "carried-state.key"


def load_key(env: Mapping[str, str] | None = None, path: Path = KEY_FILE) -> bytes:
    """The worker's key: `CARRIED_STATE_KEY`, else the file `CARRIED_STATE_KEY_FILE` names (read
    only), else the embedded stack's file `path` (created on first use)."""
    env = os.environ if env is None else env
    configured = env.get("CARRIED_STATE_KEY")
    if configured:
        return configured.encode()
    shared = env.get("CARRIED_STATE_KEY_FILE")
    if shared:
        return read_key(Path(shared))
    return ensure_key(path)


def read_key(path: Path) -> bytes:
    """The key in `path`, which a deployment created once for all its workers."""
    try:
        key = path.read_bytes().strip()
    except OSError as err:
        raise RuntimeError(
            f"{KEY_FILE_ENV}={path}: cannot read it as uid {os.getuid()} ({err.strerror}); it is "
            f"created once, before any worker starts, by `python -m countersign.identity.carried_key`"
        ) from None
    if not key:
        raise RuntimeError(f"{KEY_FILE_ENV}={path} is empty")
    return key


def ensure_key(path: Path, owner: int | None = None) -> bytes:
    """The key in `path`, created unless it exists: a random secret, readable by its owner only
    (`owner`: that user id, else the caller). Two processes creating it at once: one writes it, the
    other reads what it wrote."""
    create_once(path, lambda: secrets.token_hex(32).encode(), owner)
    return read_key(path)


def main(argv: list[str] | None = None) -> None:
    one_shot("python -m countersign.identity.carried_key", "the carried-state key", ensure_key, argv)


if __name__ == "__main__":
    main()
