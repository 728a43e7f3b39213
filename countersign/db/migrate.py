"""Apply the alembic migrations programmatically (no alembic.ini to ship or find).

To write the next migration: `alembic.command.revision(alembic_config(url), message=..., autogenerate=True)`
against a database at head, then edit the result by hand (and freeze it: no imports from the models).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    # configparser interpolates '%' in option values; the URL travels in `attributes`, untouched.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes["database_url"] = database_url
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None, "the migrations directory has no revisions"
    return head


def upgrade(database_url: str) -> None:
    """Migrate the database to head. Idempotent, and safe to call concurrently from several processes.

    `env.py` drives its async engine with `asyncio.run`, which cannot nest in a running event loop;
    so alembic always runs in a thread of its own, and this works the same from a CLI command, an
    async test or a sync fixture.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="alembic") as pool:
        pool.submit(command.upgrade, alembic_config(database_url), "head").result()
