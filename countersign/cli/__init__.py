"""`python starter.py …`: the starter CLI (commands are listed in CONTRACT.md)."""

from countersign.cli import approvals, chat, conversations, db, demo, dev, model, records  # noqa: F401  (each registers its commands)
from countersign.cli.app import cli


def main() -> None:
    cli(prog_name="starter.py")


__all__ = ["cli", "main"]
