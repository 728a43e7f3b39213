"""Commands: `mail serve` (the embedded stack's mail catcher, in the foreground), `mail list`,
`mail show N`: what the demo's notices and agents sent, read where it was caught."""

from __future__ import annotations

import asyncio
import signal

import click

from countersign.cli.app import cli, print_json, run
from countersign.runtime.config import DATA_DIR

DEFAULT_PORT = 8025


MAILBOX = DATA_DIR / "mail"


@cli.group()
def mail() -> None:
    """The embedded stack's mail catcher: what was sent, kept instead of delivered."""


@mail.command()
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option("--host", default="127.0.0.1", show_default=True)
def serve(port: int, host: str) -> None:
    """Catch mail on HOST:PORT until Ctrl-C or SIGTERM (`dev up` runs it)."""
    run(_serve(host, port))


async def _serve(host: str, port: int) -> None:
    from countersign.devstack.mail import catching  # aiosmtpd: only this command needs it

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    controller = catching(MAILBOX, host, port)
    click.echo(f"catching mail on {host}:{port}, kept in {MAILBOX}")
    try:
        await stop.wait()
    finally:
        controller.stop()


@mail.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_mail(as_json: bool) -> None:
    """What the catcher kept, oldest first: number, kind (a notice's, or email), to, subject."""
    from countersign.devstack.mail import caught

    kept = [c.summary() for c in caught(MAILBOX)]
    if as_json:
        print_json(kept)
        return
    if not kept:
        click.echo("no mail caught yet")
    for c in kept:
        click.echo(f"{c['number']:>4}  {c['kind']:<10} {c['date']}  to {c['to']}  {c['subject']}")


@mail.command()
@click.argument("number", type=int)
def show(number: int) -> None:
    """One caught message: headers, and its text decoded."""
    from countersign.devstack.mail import caught

    kept = caught(MAILBOX)
    if not 1 <= number <= len(kept):
        raise click.ClickException(f"no caught mail number {number} ({len(kept)} kept)")
    click.echo(kept[number - 1].readable())
