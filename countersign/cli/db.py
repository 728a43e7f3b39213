"""`db upgrade` and `db seed`: apply the migrations and load the seed data into DATABASE_URL."""

from __future__ import annotations

import asyncio

import click
from sqlalchemy.engine import make_url

from countersign.cli.app import cli, run
from countersign.cli.ux import database_url
from countersign.db import migrate
from countersign.db.seed import seed as load_seed
from countersign.identity.mode import record_deployment_mode
from countersign.runtime.config import load_settings


def shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


@cli.group()
def db() -> None:
    """The database: migrations and seed data (both idempotent)."""


@db.command()
def upgrade() -> None:
    """Apply the migrations to DATABASE_URL, up to the latest; record the deployment's mode
    (COUNTERSIGN_AUTH or APPROVER_AUTH when set, else keep the recorded one)."""
    url = database_url()
    run(asyncio.to_thread(migrate.upgrade, url))
    click.echo(f"database {shown(url)} is at revision {migrate.head_revision()}")
    settings = load_settings()
    mode = run(record_deployment_mode(url, settings.approver_auth if settings.auth_configured else None))
    click.echo(f"the deployment runs COUNTERSIGN_AUTH={mode}: every worker reads it when it starts")


@db.command()
@click.option(
    "--reset",
    is_flag=True,
    help="Also set the seeded rows back to their seed values (the demo's leads, tasks, cases, …) "
    "and cancel the scheduler's sessions and the meetings booked from them.",
)
def seed(reset: bool) -> None:
    """Load the seed data (tenants, users, business data, agents) into DATABASE_URL: what is missing,
    or with --reset, everything back as seeded (rows added since and the audit stay)."""
    url = database_url()
    run(load_seed(url, reset=reset))
    done = "reset" if reset else "seeded (missing rows only)"
    click.echo(f"{done}: tenants acme and globex, and the agents, in {shown(url)}")
