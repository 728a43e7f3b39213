"""Secrets at rest: columns PostgreSQL only ever holds encrypted (chat bot tokens, webhook URLs,
webhook secrets), with a key the deployment holds and the database never sees.

`SealedText` encrypts on the way in and decrypts on the way out (Fernet: AES-128-CBC with an
HMAC-SHA256, authenticated, from `cryptography`), so code reads and writes plain strings while the
rows, backups and replicas hold only tokens. The key is COUNTERSIGN_SECRETS_KEY (a Fernet key, or the
path of a file holding one), else the embedded stack's `.data/secrets.key`, created once like the
carried-state key. Every process that reads or writes these columns (worker, server, CLI, migrate)
must hold the same key.

Rotation (docs/explanation/security.md): COUNTERSIGN_SECRETS_KEY may list keys separated by commas; the first
encrypts, every one decrypts (MultiFernet). Put the new key first, run `countersign channels rekey`
(every sealed value re-encrypted with it), then drop the old key.

A value the key cannot open raises `SealBroken`, which names the column's table and never the value.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from countersign.runtime.config import DATA_DIR, load_settings
from countersign.runtime.keyfiles import create_once, one_shot

KEY_FILE = DATA_DIR / "secrets.key"


class SealBroken(ValueError):
    """A sealed value this deployment's key cannot open (another key, or a tampered row)."""


def create_key_file(path: Path, owner: int | None = None) -> bytes:
    """The key in `path`, created (owner-readable only; `owner`: that user id) by whichever process
    comes first."""
    create_once(path, Fernet.generate_key, owner)
    return path.read_bytes().strip()


def keys_from(configured: str | None, path: Path = KEY_FILE) -> MultiFernet:
    """The deployment's keys: `configured` (keys separated by commas, or a file holding them), else
    the key file. ValueError, naming no key, when one is not a Fernet key."""
    if configured and Path(configured.strip()).is_file():
        configured = Path(configured.strip()).read_text()
    text = configured.encode() if configured else create_key_file(path)
    try:
        return MultiFernet([Fernet(key.strip()) for key in text.split(b",") if key.strip()])
    except ValueError:
        raise ValueError(
            "COUNTERSIGN_SECRETS_KEY must be Fernet keys (32 url-safe base64-encoded bytes each), "
            "separated by commas; `countersign channels key` prints a new one"
        ) from None


@functools.cache
def deployment_keys() -> MultiFernet:
    return keys_from(load_settings().secrets_key)


def seal(plain: str) -> str:
    return deployment_keys().encrypt(plain.encode()).decode()


def unseal(token: str, where: str) -> str:
    try:
        return deployment_keys().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SealBroken(
            f"a secret in {where} cannot be opened with this deployment's COUNTERSIGN_SECRETS_KEY "
            "(another key, or the row was altered)"
        ) from None


def reseal(token: str, where: str) -> str:
    """The value encrypted with the first (newest) key: what `channels rekey` writes back."""
    try:
        return deployment_keys().rotate(token.encode()).decode()
    except InvalidToken:
        raise SealBroken(f"a secret in {where} cannot be opened with any key given") from None


class SealedText(TypeDecorator[str]):
    """Text stored encrypted: Python sees the plain string, PostgreSQL a Fernet token."""

    impl = Text
    cache_ok = True

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where  # the table, for an error that names no value

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else seal(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else unseal(str(value), self.where)


def main(argv: list[str] | None = None) -> None:
    one_shot("python -m countersign.db.sealed", "the deployment's secrets key", create_key_file, argv)


if __name__ == "__main__":
    main()
