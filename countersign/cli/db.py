"""`db upgrade`, `db seed`, `db url` and `db shell`: apply the migrations, load the seed data, and
reach DATABASE_URL with psql (the documentation's SQL is typed there)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys

import click
from sqlalchemy.engine import URL, make_url

from countersign.cli.app import cli, run
from countersign.cli.ux import database_url
from countersign.db import migrate
from countersign.db.seed import seed as load_seed
from countersign.devstack.postgres import psql_binary
from countersign.identity.mode import record_deployment_mode
from countersign.runtime.config import load_settings


def shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def libpq(url: str) -> URL:
    """DATABASE_URL as psql reads it: the SQLAlchemy driver name (`+asyncpg`) is not libpq's."""
    return make_url(url).set(drivername="postgresql")


@cli.group()
def db() -> None:
    """The database: migrations and seed data (both idempotent), and psql on it."""


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


@db.command()
def url() -> None:
    """Print DATABASE_URL in the form psql and other libpq clients take (password hidden)."""
    click.echo(libpq(database_url()).render_as_string(hide_password=True))


@db.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
def shell(psql_args: tuple[str, ...]) -> None:
    """psql on DATABASE_URL (the embedded PostgreSQL's own psql, else the one on PATH); PSQL_ARGS
    are psql's, e.g. `db shell -c "SELECT …"`. The password goes by PGPASSWORD, not the command line."""
    target = libpq(database_url())
    binary = psql_binary() or shutil.which("psql")
    if binary is None:
        fix = f"install a PostgreSQL client, then `psql {shell_url(target)}`"
        raise click.ClickException(f"no psql here: {fix}")
    env = dict(os.environ)
    if target.password is not None:
        env["PGPASSWORD"] = str(target.password)
    done = subprocess.run([binary, shell_url(target), *psql_args], env=env, check=False)
    sys.exit(done.returncode)


def shell_url(target: URL) -> str:
    return target.set(password=None).render_as_string(hide_password=False)
